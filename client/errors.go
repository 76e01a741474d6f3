package client

import (
	"errors"
	"fmt"

	"github.com/iii-sandbox/iii/protocol"
)

// Codes of the failures the client detects itself. Remote failures keep the
// code the engine or the called worker gave them (*protocol.ErrorBody).
const (
	// CodeTimeout: no result within the call's timeout.
	CodeTimeout = protocol.CodeTimeout
	// CodeEngineUnreachable: the WebSocket to the engine could not be opened.
	CodeEngineUnreachable = "ENGINE_UNREACHABLE"
	// CodeHandshakeFailed: the engine answered but not with the iii greeting.
	CodeHandshakeFailed = "HANDSHAKE_FAILED"
	// CodeConnectionLost: the connection dropped while a call was in flight,
	// or the client gave up reconnecting.
	CodeConnectionLost = "CONNECTION_LOST"
	// CodeClientClosed: the client was closed.
	CodeClientClosed = "CLIENT_CLOSED"
	// CodeInvalidNamespace: a namespace that the engine would refuse.
	CodeInvalidNamespace = protocol.CodeInvalidNamespace
	// CodeInvalidArgument: a bad argument to a client method.
	CodeInvalidArgument = "INVALID_ARGUMENT"
	// CodeSerialization: a payload or result that cannot be encoded as JSON.
	CodeSerialization = "serialization_error"
)

// Error is a failure detected by the client itself (not by the engine or
// the called function). Its Error() is the message alone, readable as is;
// the code is for programs.
type Error struct {
	Code    string
	Message string
	Err     error // the underlying cause, if any
}

func (e *Error) Error() string { return e.Message }

func (e *Error) Unwrap() error { return e.Err }

// codeForbidden is the engine's refusal of a registration the connection
// may not make (docs/security.md).
const codeForbidden = "FORBIDDEN"

// RejectionError is a registration the engine refused
// (registrationrejected). WORKER_NAMESPACE_CONFLICT stops the client for
// good; FUNCTION_NAMESPACE_CONFLICT refuses one function only.
type RejectionError struct {
	Code          string
	Namespace     string
	WorkerName    string
	FunctionID    string
	OwnerWorkerID string
}

func (e *RejectionError) Error() string {
	ns := e.Namespace
	if ns == "" {
		ns = "default"
	}
	switch {
	case e.Code == protocol.CodeWorkerNamespaceConflict:
		return fmt.Sprintf("%s: worker name %q is already in use in namespace %q (by worker %s); stop that worker or choose another name",
			e.Code, e.WorkerName, ns, e.OwnerWorkerID)
	case e.FunctionID != "" && e.OwnerWorkerID != "":
		return fmt.Sprintf("%s: function %q is already registered in namespace %q by worker %s",
			e.Code, e.FunctionID, ns, e.OwnerWorkerID)
	case e.FunctionID != "" && e.Code == codeForbidden:
		return fmt.Sprintf("%s: the engine refused function %q in namespace %q: this connection may not register it (an id under engine::, compose::, configuration:: or sandbox:: needs the engine token; an RBAC session may forbid registering)",
			e.Code, e.FunctionID, ns)
	case e.FunctionID != "":
		return fmt.Sprintf("%s: the engine refused function %q in namespace %q (engine::* ids belong to namespace \"default\")",
			e.Code, e.FunctionID, ns)
	default:
		return fmt.Sprintf("%s: the engine refused a registration in namespace %q", e.Code, ns)
	}
}

// TriggerError reports a trigger registration that failed: the engine or the
// trigger type's provider answered our registertrigger with an error.
type TriggerError struct {
	TriggerID   string
	TriggerType string
	FunctionID  string
	Err         *protocol.ErrorBody
}

func (e *TriggerError) Error() string {
	return fmt.Sprintf("trigger %q (%s → %s): %s", e.TriggerID, e.TriggerType, e.FunctionID, e.Err.Error())
}

func (e *TriggerError) Unwrap() error { return e.Err }

// CodeOf returns the stable code of an error returned by this package:
// the client's own codes, a remote *protocol.ErrorBody's code, or a
// registration rejection's code. It returns "" for other errors.
func CodeOf(err error) string {
	var ce *Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	var re *RejectionError
	if errors.As(err, &re) {
		return re.Code
	}
	var eb *protocol.ErrorBody
	if errors.As(err, &eb) {
		return eb.Code
	}
	return ""
}
