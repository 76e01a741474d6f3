package protocol

import "encoding/json"

// Type is the value of a frame's "type" key.
type Type string

// Frame types of the catalogue. They are lowercase concatenations of the
// variant names (registertriggertype, not register_trigger_type).
const (
	TypeRegisterFunction          Type = "registerfunction"
	TypeUnregisterFunction        Type = "unregisterfunction"
	TypeRegisterTriggerType       Type = "registertriggertype"
	TypeUnregisterTriggerType     Type = "unregistertriggertype"
	TypeRegisterTrigger           Type = "registertrigger"
	TypeTriggerRegistrationResult Type = "triggerregistrationresult"
	TypeUnregisterTrigger         Type = "unregistertrigger"
	TypeRegisterService           Type = "registerservice"
	TypeInvokeFunction            Type = "invokefunction"
	TypeInvocationResult          Type = "invocationresult"
	TypePing                      Type = "ping"
	TypePong                      Type = "pong"
	TypeReattach                  Type = "reattach"
	TypeWorkerRegistered          Type = "workerregistered"
	TypeRegistrationRejected      Type = "registrationrejected"
	// TypeError is the engine's one-shot frame before it closes a connection
	// it refuses (for example AUTH_ERROR upstream).
	TypeError Type = "error"
)

// Message is one decoded frame.
type Message interface {
	MessageType() Type
}

// ErrorBody is the error object carried by invocation results, trigger
// registration results and error frames.
type ErrorBody struct {
	Code       string `json:"code"`
	Message    string `json:"message"`
	Stacktrace string `json:"stacktrace,omitempty"`
}

// Error makes an ErrorBody usable as a Go error; the code comes first so
// logs stay greppable.
func (e *ErrorBody) Error() string { return e.Code + ": " + e.Message }

// ActionType selects how an invocation is delivered.
type ActionType string

const (
	// ActionVoid is fire-and-forget: no result is sent back.
	ActionVoid ActionType = "void"
	// ActionEnqueue routes the call through a named queue: the engine
	// hands it to the queue provider, engine::queue::enqueue
	// (docs/queues.md).
	ActionEnqueue ActionType = "enqueue"
)

// TriggerAction is an invocation's optional "action"; absent means a
// synchronous call.
type TriggerAction struct {
	Type  ActionType `json:"type"`
	Queue string     `json:"queue,omitempty"`
}

// HTTPInvocationRef registers a function that lives behind an HTTP endpoint.
type HTTPInvocationRef struct {
	URL       string            `json:"url"`
	Method    string            `json:"method,omitempty"`
	TimeoutMS *uint64           `json:"timeout_ms,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	Auth      json.RawMessage   `json:"auth,omitempty"`
}

// StreamChannelRef names one end of a streaming channel. It travels inside
// payloads and results; SDKs recognise it by shape.
type StreamChannelRef struct {
	ChannelID string `json:"channel_id"`
	AccessKey string `json:"access_key"`
	Direction string `json:"direction"`
}

// Channel directions.
const (
	DirectionRead  = "read"
	DirectionWrite = "write"
)

// RegisterFunction announces a function owned by the sending worker.
type RegisterFunction struct {
	ID             string             `json:"id"`
	Description    string             `json:"description,omitempty"`
	RequestFormat  json.RawMessage    `json:"request_format,omitempty"`
	ResponseFormat json.RawMessage    `json:"response_format,omitempty"`
	Metadata       json.RawMessage    `json:"metadata,omitempty"`
	Invocation     *HTTPInvocationRef `json:"invocation,omitempty"`
}

// UnregisterFunction withdraws a function.
type UnregisterFunction struct {
	ID string `json:"id"`
}

// RegisterTriggerType announces a trigger type the worker provides.
type RegisterTriggerType struct {
	ID                   string          `json:"id"`
	Description          string          `json:"description,omitempty"`
	TriggerRequestFormat json.RawMessage `json:"trigger_request_format,omitempty"`
	CallRequestFormat    json.RawMessage `json:"call_request_format,omitempty"`
	Namespace            *string         `json:"namespace,omitempty"`
}

// UnregisterTriggerType withdraws a trigger type.
type UnregisterTriggerType struct {
	ID string `json:"id"`
}

// RegisterTrigger binds a function to a trigger type. Workers send it to the
// engine; the engine forwards it to the provider of the trigger type.
type RegisterTrigger struct {
	ID               string          `json:"id"`
	TriggerType      string          `json:"trigger_type"`
	FunctionID       string          `json:"function_id"`
	Config           json.RawMessage `json:"config,omitempty"`
	Metadata         json.RawMessage `json:"metadata,omitempty"`
	Namespace        *string         `json:"namespace,omitempty"`
	TriggerNamespace *string         `json:"trigger_namespace,omitempty"`
}

// TriggerRegistrationResult acknowledges a RegisterTrigger.
type TriggerRegistrationResult struct {
	ID          string     `json:"id"`
	TriggerType string     `json:"trigger_type"`
	FunctionID  string     `json:"function_id"`
	Error       *ErrorBody `json:"error,omitempty"`
}

// UnregisterTrigger removes a trigger binding.
type UnregisterTrigger struct {
	ID          string `json:"id"`
	TriggerType string `json:"trigger_type,omitempty"`
}

// RegisterService groups functions under a service for introspection.
type RegisterService struct {
	ID              string `json:"id"`
	Name            string `json:"name"`
	Description     string `json:"description,omitempty"`
	ParentServiceID string `json:"parent_service_id,omitempty"`
}

// InvokeFunction calls a function. An empty InvocationID means no reply is
// expected (void). Namespace nil means "default"; a blank one is refused.
type InvokeFunction struct {
	InvocationID string          `json:"invocation_id,omitempty"`
	FunctionID   string          `json:"function_id"`
	Data         json.RawMessage `json:"data,omitempty"`
	Traceparent  string          `json:"traceparent,omitempty"`
	Baggage      string          `json:"baggage,omitempty"`
	Action       *TriggerAction  `json:"action,omitempty"`
	Metadata     json.RawMessage `json:"metadata,omitempty"`
	Namespace    *string         `json:"namespace,omitempty"`
}

// InvocationResult answers an InvokeFunction with the same InvocationID.
type InvocationResult struct {
	InvocationID string          `json:"invocation_id"`
	FunctionID   string          `json:"function_id"`
	Result       json.RawMessage `json:"result,omitempty"`
	Error        *ErrorBody      `json:"error,omitempty"`
	Traceparent  string          `json:"traceparent,omitempty"`
	Baggage      string          `json:"baggage,omitempty"`
}

// Ping asks the peer for a Pong.
type Ping struct{}

// Pong answers a Ping.
type Pong struct{}

// Reattach is the first frame of a reconnecting worker: it evicts the
// previous connection if the token matches.
type Reattach struct {
	PreviousWorkerID string `json:"previous_worker_id"`
	ReattachToken    string `json:"reattach_token,omitempty"`
}

// WorkerRegistered is the engine's greeting on every new connection.
type WorkerRegistered struct {
	WorkerID      string `json:"worker_id"`
	ReattachToken string `json:"reattach_token,omitempty"`
}

// RegistrationRejected refuses a worker name or a function registration.
type RegistrationRejected struct {
	Code          string `json:"code"`
	Namespace     string `json:"namespace"`
	WorkerName    string `json:"worker_name,omitempty"`
	FunctionID    string `json:"function_id,omitempty"`
	OwnerWorkerID string `json:"owner_worker_id"`
}

// ErrorFrame is sent once before the engine closes a connection it refuses.
type ErrorFrame struct {
	Error ErrorBody `json:"error"`
}

func (*RegisterFunction) MessageType() Type          { return TypeRegisterFunction }
func (*UnregisterFunction) MessageType() Type        { return TypeUnregisterFunction }
func (*RegisterTriggerType) MessageType() Type       { return TypeRegisterTriggerType }
func (*UnregisterTriggerType) MessageType() Type     { return TypeUnregisterTriggerType }
func (*RegisterTrigger) MessageType() Type           { return TypeRegisterTrigger }
func (*TriggerRegistrationResult) MessageType() Type { return TypeTriggerRegistrationResult }
func (*UnregisterTrigger) MessageType() Type         { return TypeUnregisterTrigger }
func (*RegisterService) MessageType() Type           { return TypeRegisterService }
func (*InvokeFunction) MessageType() Type            { return TypeInvokeFunction }
func (*InvocationResult) MessageType() Type          { return TypeInvocationResult }
func (*Ping) MessageType() Type                      { return TypePing }
func (*Pong) MessageType() Type                      { return TypePong }
func (*Reattach) MessageType() Type                  { return TypeReattach }
func (*WorkerRegistered) MessageType() Type          { return TypeWorkerRegistered }
func (*RegistrationRejected) MessageType() Type      { return TypeRegistrationRejected }
func (*ErrorFrame) MessageType() Type                { return TypeError }
