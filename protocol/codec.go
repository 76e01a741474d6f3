package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Engine-side error codes that travel in ErrorBody.Code. Upstream's own
// codes are lowercase; the upper-case ones are registration and namespace
// codes that SDKs match on.
const (
	CodeInvocationFailed        = "invocation_failed"
	CodeInvocationStopped       = "invocation_stopped"
	CodeFunctionNotFound        = "function_not_found"
	CodeFunctionNotInvokable    = "function_not_invokable"
	CodeInvalidFrame            = "invalid_frame"
	CodeQueuesUnsupported       = "queues_unsupported"
	CodeInvalidNamespace        = "INVALID_NAMESPACE"
	CodeWorkerNamespaceConflict = "WORKER_NAMESPACE_CONFLICT"
	CodeFuncNamespaceConflict   = "FUNCTION_NAMESPACE_CONFLICT"
	CodeTimeout                 = "TIMEOUT"
)

// ErrUnknownType is wrapped by Decode for a well-formed frame whose "type"
// this protocol does not know.
var ErrUnknownType = errors.New("unknown frame type")

// DecodeError reports a frame that could not be decoded. When the frame still
// carried a string invocation_id, the receiver can answer that invocation
// with a coded error instead of letting the caller time out.
type DecodeError struct {
	Type         string
	InvocationID string
	FunctionID   string
	Err          error
}

func (e *DecodeError) Error() string {
	if e.Type != "" {
		return fmt.Sprintf("decode %q frame: %v", e.Type, e.Err)
	}
	return "decode frame: " + e.Err.Error()
}

func (e *DecodeError) Unwrap() error { return e.Err }

// wireFrame is the flat union of every frame's fields, so a frame is decoded
// in one pass and then copied into its typed message.
type wireFrame struct {
	Type Type `json:"type"`

	ID          string          `json:"id"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Metadata    json.RawMessage `json:"metadata"`
	Namespace   *string         `json:"namespace"`

	RequestFormat  json.RawMessage    `json:"request_format"`
	ResponseFormat json.RawMessage    `json:"response_format"`
	Invocation     *HTTPInvocationRef `json:"invocation"`

	TriggerRequestFormat json.RawMessage `json:"trigger_request_format"`
	CallRequestFormat    json.RawMessage `json:"call_request_format"`

	TriggerType      string          `json:"trigger_type"`
	FunctionID       string          `json:"function_id"`
	Config           json.RawMessage `json:"config"`
	TriggerNamespace *string         `json:"trigger_namespace"`

	ParentServiceID string `json:"parent_service_id"`

	InvocationID string          `json:"invocation_id"`
	Data         json.RawMessage `json:"data"`
	Traceparent  string          `json:"traceparent"`
	Baggage      string          `json:"baggage"`
	Action       *TriggerAction  `json:"action"`
	Result       json.RawMessage `json:"result"`
	Error        *ErrorBody      `json:"error"`

	PreviousWorkerID string `json:"previous_worker_id"`
	ReattachToken    string `json:"reattach_token"`
	WorkerID         string `json:"worker_id"`

	Code          string `json:"code"`
	WorkerName    string `json:"worker_name"`
	OwnerWorkerID string `json:"owner_worker_id"`
}

// Decode parses one frame. Unknown fields are ignored and JSON null counts
// as absent, as upstream's decoder does.
func Decode(data []byte) (Message, error) {
	var w wireFrame
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, decodeError(data, err)
	}
	m, err := w.message()
	if err != nil {
		return nil, &DecodeError{Type: string(w.Type), InvocationID: w.InvocationID, FunctionID: w.FunctionID, Err: err}
	}
	return m, nil
}

func (w *wireFrame) message() (Message, error) {
	switch w.Type {
	case TypeRegisterFunction:
		return &RegisterFunction{ID: w.ID, Description: w.Description, RequestFormat: nonNull(w.RequestFormat),
			ResponseFormat: nonNull(w.ResponseFormat), Metadata: nonNull(w.Metadata), Invocation: w.Invocation}, nil
	case TypeUnregisterFunction:
		return &UnregisterFunction{ID: w.ID}, nil
	case TypeRegisterTriggerType:
		return &RegisterTriggerType{ID: w.ID, Description: w.Description, TriggerRequestFormat: nonNull(w.TriggerRequestFormat),
			CallRequestFormat: nonNull(w.CallRequestFormat), Namespace: w.Namespace}, nil
	case TypeUnregisterTriggerType:
		return &UnregisterTriggerType{ID: w.ID}, nil
	case TypeRegisterTrigger:
		return &RegisterTrigger{ID: w.ID, TriggerType: w.TriggerType, FunctionID: w.FunctionID, Config: nonNull(w.Config),
			Metadata: nonNull(w.Metadata), Namespace: w.Namespace, TriggerNamespace: w.TriggerNamespace}, nil
	case TypeTriggerRegistrationResult:
		return &TriggerRegistrationResult{ID: w.ID, TriggerType: w.TriggerType, FunctionID: w.FunctionID, Error: w.Error}, nil
	case TypeUnregisterTrigger:
		return &UnregisterTrigger{ID: w.ID, TriggerType: w.TriggerType}, nil
	case TypeRegisterService:
		return &RegisterService{ID: w.ID, Name: w.Name, Description: w.Description, ParentServiceID: w.ParentServiceID}, nil
	case TypeInvokeFunction:
		return &InvokeFunction{InvocationID: w.InvocationID, FunctionID: w.FunctionID, Data: nonNull(w.Data),
			Traceparent: w.Traceparent, Baggage: w.Baggage, Action: w.Action, Metadata: nonNull(w.Metadata), Namespace: w.Namespace}, nil
	case TypeInvocationResult:
		return &InvocationResult{InvocationID: w.InvocationID, FunctionID: w.FunctionID, Result: w.Result, Error: w.Error,
			Traceparent: w.Traceparent, Baggage: w.Baggage}, nil
	case TypePing:
		return &Ping{}, nil
	case TypePong:
		return &Pong{}, nil
	case TypeReattach:
		return &Reattach{PreviousWorkerID: w.PreviousWorkerID, ReattachToken: w.ReattachToken}, nil
	case TypeWorkerRegistered:
		return &WorkerRegistered{WorkerID: w.WorkerID, ReattachToken: w.ReattachToken}, nil
	case TypeRegistrationRejected:
		return &RegistrationRejected{Code: w.Code, Namespace: derefString(w.Namespace), WorkerName: w.WorkerName,
			FunctionID: w.FunctionID, OwnerWorkerID: w.OwnerWorkerID}, nil
	case TypeError:
		if w.Error == nil {
			return nil, errors.New(`error frame without "error"`)
		}
		return &ErrorFrame{Error: *w.Error}, nil
	case "":
		return nil, errors.New(`missing "type"`)
	default:
		return nil, fmt.Errorf("%w %q", ErrUnknownType, w.Type)
	}
}

// decodeError salvages the invocation id of a frame that failed to decode,
// so the sender of a malformed call still gets an answer.
func decodeError(data []byte, err error) error {
	var ids struct {
		Type         json.RawMessage `json:"type"`
		InvocationID json.RawMessage `json:"invocation_id"`
		FunctionID   json.RawMessage `json:"function_id"`
	}
	de := &DecodeError{Err: err}
	if json.Unmarshal(data, &ids) == nil {
		de.Type = rawString(ids.Type)
		de.InvocationID = rawString(ids.InvocationID)
		de.FunctionID = rawString(ids.FunctionID)
	}
	return de
}

func rawString(raw json.RawMessage) string {
	var s string
	if len(raw) == 0 || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

func nonNull(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return raw
}

func derefString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Encode renders a message as one frame: the message's JSON object with its
// "type" key first.
func Encode(m Message) ([]byte, error) {
	body, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %s frame: %w", m.MessageType(), err)
	}
	return withType(m.MessageType(), body), nil
}

// withType splices `"type":"<t>"` into the front of a JSON object.
func withType(t Type, body []byte) []byte {
	var b bytes.Buffer
	b.Grow(len(body) + len(t) + 12)
	b.WriteString(`{"type":"`)
	b.WriteString(string(t))
	b.WriteByte('"')
	inner := bytes.TrimSpace(body)
	inner = inner[1 : len(inner)-1] // drop the object's braces
	if len(bytes.TrimSpace(inner)) > 0 {
		b.WriteByte(',')
		b.Write(inner)
	}
	b.WriteByte('}')
	return b.Bytes()
}
