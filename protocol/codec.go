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

// Decode parses one frame. Only the fields of the frame's own type are
// read: as with upstream's internally tagged decoder, fields that belong to
// other frame types (or to none) are ignored whatever their JSON type, and
// JSON null counts as absent.
func Decode(data []byte) (Message, error) {
	var head struct {
		Type Type `json:"type"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, decodeError(data, err)
	}
	m, err := newMessage(head.Type)
	if err != nil {
		return nil, withIDs(decodeError(data, err), head.Type)
	}
	if err := json.Unmarshal(data, m); err != nil {
		return nil, withIDs(decodeError(data, err), head.Type)
	}
	if err := normalize(m); err != nil {
		return nil, withIDs(decodeError(data, err), head.Type)
	}
	if ef, ok := m.(*errorFrameWire); ok {
		return &ErrorFrame{Error: *ef.Error}, nil
	}
	return m, nil
}

// withIDs makes sure a salvaged error names the frame's type.
func withIDs(err error, t Type) error {
	if de := (*DecodeError)(nil); errors.As(err, &de) && de.Type == "" {
		de.Type = string(t)
	}
	return err
}

// errorFrameWire lets Decode tell an error frame without "error" from one
// with an empty error object.
type errorFrameWire struct {
	Error *ErrorBody `json:"error"`
}

func (*errorFrameWire) MessageType() Type { return TypeError }

func newMessage(t Type) (Message, error) {
	switch t {
	case TypeRegisterFunction:
		return &RegisterFunction{}, nil
	case TypeUnregisterFunction:
		return &UnregisterFunction{}, nil
	case TypeRegisterTriggerType:
		return &RegisterTriggerType{}, nil
	case TypeUnregisterTriggerType:
		return &UnregisterTriggerType{}, nil
	case TypeRegisterTrigger:
		return &RegisterTrigger{}, nil
	case TypeTriggerRegistrationResult:
		return &TriggerRegistrationResult{}, nil
	case TypeUnregisterTrigger:
		return &UnregisterTrigger{}, nil
	case TypeRegisterService:
		return &RegisterService{}, nil
	case TypeInvokeFunction:
		return &InvokeFunction{}, nil
	case TypeInvocationResult:
		return &InvocationResult{}, nil
	case TypePing:
		return &Ping{}, nil
	case TypePong:
		return &Pong{}, nil
	case TypeReattach:
		return &Reattach{}, nil
	case TypeWorkerRegistered:
		return &WorkerRegistered{}, nil
	case TypeRegistrationRejected:
		return &RegistrationRejected{}, nil
	case TypeError:
		return &errorFrameWire{}, nil
	case "":
		return nil, errors.New(`missing "type"`)
	default:
		return nil, fmt.Errorf("%w %q", ErrUnknownType, t)
	}
}

// normalize applies "null means absent" to the raw fields. An invocation
// result keeps a null result as given: null is a value a function may
// return.
func normalize(m Message) error {
	switch m := m.(type) {
	case *RegisterFunction:
		m.RequestFormat, m.ResponseFormat, m.Metadata = nonNull(m.RequestFormat), nonNull(m.ResponseFormat), nonNull(m.Metadata)
		if m.Invocation != nil {
			m.Invocation.Auth = nonNull(m.Invocation.Auth)
		}
	case *RegisterTriggerType:
		m.TriggerRequestFormat, m.CallRequestFormat = nonNull(m.TriggerRequestFormat), nonNull(m.CallRequestFormat)
	case *RegisterTrigger:
		m.Config, m.Metadata = nonNull(m.Config), nonNull(m.Metadata)
	case *InvokeFunction:
		m.Data, m.Metadata = nonNull(m.Data), nonNull(m.Metadata)
	case *errorFrameWire:
		if m.Error == nil {
			return errors.New(`error frame without "error"`)
		}
	}
	return nil
}

// decodeError salvages the invocation id of a frame that failed to decode,
// so the sender of a malformed call still gets an answer.
//
// The frame may be syntactically broken (truncated, a bad value late in the
// object), so the top-level members are read one by one and the salvage
// keeps whatever came before the damage.
func decodeError(data []byte, err error) error {
	de := &DecodeError{Err: err}
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, terr := dec.Token(); terr != nil || tok != json.Delim('{') {
		return de
	}
	for dec.More() {
		tok, terr := dec.Token()
		if terr != nil {
			break
		}
		key, _ := tok.(string)
		var val json.RawMessage
		if dec.Decode(&val) != nil {
			break
		}
		switch key {
		case "type":
			de.Type = rawString(val)
		case "invocation_id":
			de.InvocationID = rawString(val)
		case "function_id":
			de.FunctionID = rawString(val)
		}
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
