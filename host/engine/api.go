package engine

import (
	"context"
	"encoding/json"

	"github.com/iii-sandbox/iii/protocol"
)

// DefaultNamespace is where calls without a namespace resolve, and where
// engine::* and configuration::* always live.
const DefaultNamespace = protocol.DefaultNamespace

// FunctionDef describes a function an in-process worker registers. Schemas
// are JSON Schema documents returned by engine::functions::info.
type FunctionDef struct {
	ID             string
	Description    string
	RequestSchema  json.RawMessage
	ResponseSchema json.RawMessage
	Metadata       json.RawMessage
	// Privileged functions start or stop host processes or change the
	// engine's or a project's configuration: only callers holding the
	// engine token may invoke them (UNAUTHORIZED otherwise).
	Privileged bool
}

// Call is one invocation delivered to an in-process handler.
type Call struct {
	InvocationID   string // empty for void (fire-and-forget) calls
	FunctionID     string
	Namespace      string // the namespace the function was resolved in
	CallerWorkerID string // empty when the engine itself is the caller
	// CallerAdmin reports that the caller holds the engine token (or is
	// in-process).
	CallerAdmin bool
	// Caller is the caller's authority: an in-process handler that calls
	// on for its caller passes it to Engine.InvokeAs.
	Caller      Caller
	Data        json.RawMessage
	Metadata    json.RawMessage
	Traceparent string
	Baggage     string
}

// Handler serves calls to an in-process function. A returned
// *protocol.ErrorBody reaches the caller with its code and message; any other
// error reaches it as invocation_failed. The context ends when the worker
// that owns the function detaches or the engine stops.
type Handler func(ctx context.Context, call *Call) (json.RawMessage, error)

// LocalWorkerSpec describes an in-process worker: engine builtins, the
// configuration worker, the sandbox router, and adapters published by the
// plugin host all attach this way, so they hold name and function leases
// exactly like WebSocket workers.
type LocalWorkerSpec struct {
	Name        string
	Namespace   string // empty means DefaultNamespace
	Description string
	Runtime     string // "engine" for builtins; e.g. "go-plugin" for adapters
	Version     string
	PID         int
	Isolation   string
	// Internal workers are hidden from engine::workers::list unless the
	// caller asks for include_internal.
	Internal bool
}
