package client

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"

	"github.com/google/uuid"

	"github.com/iii-sandbox/iii/protocol"
)

// FunctionDef describes a function the worker serves. Schemas are JSON
// Schema documents shown by engine::functions::info (and `iii call -h`).
type FunctionDef struct {
	ID             string
	Description    string
	RequestSchema  json.RawMessage
	ResponseSchema json.RawMessage
	Metadata       json.RawMessage
	// HTTP registers a function the engine invokes over HTTP itself; such a
	// function has no Go handler.
	HTTP *protocol.HTTPInvocationRef
}

// Invocation is one call delivered to a Handler.
type Invocation struct {
	ID          string // empty for void (fire-and-forget) invocations
	FunctionID  string
	Data        json.RawMessage // as sent; the engine adds "_caller_worker_id" to object payloads
	Metadata    json.RawMessage
	Namespace   string // set when the sender named one (trigger providers do)
	Traceparent string
	Baggage     string
}

// Handler serves one invocation on its own goroutine. Its result is
// JSON-encoded (a json.RawMessage goes as is; nil is null). A returned
// *protocol.ErrorBody (also when wrapped) reaches the caller with its code;
// any other error reaches it as invocation_failed. A panic is recovered and
// reported as invocation_failed with the stack. ctx ends when the
// connection the invocation came on ends or the client closes.
type Handler func(ctx context.Context, inv *Invocation) (any, error)

// TriggerTypeDef describes a trigger type the worker provides.
type TriggerTypeDef struct {
	ID                   string
	Description          string
	TriggerRequestSchema json.RawMessage
	CallRequestSchema    json.RawMessage
	Namespace            string // overrides the worker's namespace for this type
}

// TriggerRegistration is a trigger bound to a type this worker provides,
// as the engine forwards it.
type TriggerRegistration struct {
	ID               string
	TriggerType      string
	FunctionID       string
	Config           json.RawMessage
	Metadata         json.RawMessage
	Namespace        string // the target function's namespace ("" = default)
	TriggerNamespace string
}

// TriggerHandler is the provider side of a trigger type. An error from
// RegisterTrigger refuses the binding (a *protocol.ErrorBody keeps its
// code; other errors go as trigger_registration_failed).
type TriggerHandler interface {
	RegisterTrigger(ctx context.Context, t TriggerRegistration) error
	UnregisterTrigger(ctx context.Context, t TriggerRegistration) error
}

// TriggerDef binds a function to a trigger type.
type TriggerDef struct {
	ID          string // generated when empty
	TriggerType string
	FunctionID  string
	Config      json.RawMessage
	Metadata    json.RawMessage
	// Namespace of the target function; default: the worker's namespace.
	Namespace string
	// TriggerNamespace pins the provider's namespace; default: the
	// engine's lookup (the worker's namespace, then "default").
	TriggerNamespace string
}

type function struct {
	seq     uint64
	id      string
	handler Handler
	frame   []byte
}

type triggerType struct {
	seq     uint64
	id      string
	handler TriggerHandler
	frame   []byte
}

type trigger struct {
	seq   uint64
	id    string
	frame []byte
}

// registrations is what the worker holds; every new connection re-sends it
// in the SDK order: trigger types, functions, triggers. Guarded by Client.mu.
type registrations struct {
	seq          uint64
	functions    map[string]*function
	triggerTypes map[string]*triggerType
	triggers     map[string]*trigger
}

func newRegistrations() registrations {
	return registrations{
		functions:    make(map[string]*function),
		triggerTypes: make(map[string]*triggerType),
		triggers:     make(map[string]*trigger),
	}
}

func (r *registrations) next() uint64 {
	r.seq++
	return r.seq
}

// handshakeFrames lists the registration frames in registration order
// within each kind.
func (r *registrations) handshakeFrames() [][]byte {
	type item struct {
		seq   uint64
		frame []byte
	}
	collect := func(items []item) [][]byte {
		slices.SortFunc(items, func(a, b item) int { return cmp.Compare(a.seq, b.seq) })
		out := make([][]byte, len(items))
		for i, it := range items {
			out[i] = it.frame
		}
		return out
	}
	var tt, fn, tr []item
	for _, t := range r.triggerTypes {
		tt = append(tt, item{t.seq, t.frame})
	}
	for _, f := range r.functions {
		fn = append(fn, item{f.seq, f.frame})
	}
	for _, t := range r.triggers {
		tr = append(tr, item{t.seq, t.frame})
	}
	return slices.Concat(collect(tt), collect(fn), collect(tr))
}

// checkJSON reports a schema or config that is present but not JSON.
func checkJSON(what string, raw json.RawMessage) error {
	if len(raw) > 0 && !protocol.Valid(raw) {
		return &Error{Code: CodeInvalidArgument, Message: what + " is not valid JSON"}
	}
	return nil
}

// RegisterFunction serves def.ID with h. The function is registered now if
// connected, and again on every reconnect. unregister withdraws it. Refusals
// by the engine (FUNCTION_NAMESPACE_CONFLICT) arrive later: see
// RegistrationError and Options.OnRegistrationError.
func (c *Client) RegisterFunction(def FunctionDef, h Handler) (unregister func(), err error) {
	switch {
	case def.ID == "":
		return nil, &Error{Code: CodeInvalidArgument, Message: "register function: empty id"}
	case h == nil && def.HTTP == nil:
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("register function %s: no handler", def.ID)}
	case h != nil && def.HTTP != nil:
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("register function %s: an HTTP-invoked function has no Go handler", def.ID)}
	}
	for what, raw := range map[string]json.RawMessage{"request schema": def.RequestSchema, "response schema": def.ResponseSchema, "metadata": def.Metadata} {
		if err := checkJSON(fmt.Sprintf("register function %s: %s", def.ID, what), raw); err != nil {
			return nil, err
		}
	}
	frame, err := protocol.Encode(&protocol.RegisterFunction{ID: def.ID, Description: def.Description,
		RequestFormat: def.RequestSchema, ResponseFormat: def.ResponseSchema, Metadata: def.Metadata, Invocation: def.HTTP})
	if err != nil {
		return nil, &Error{Code: CodeSerialization, Message: fmt.Sprintf("register function %s: %v", def.ID, err), Err: err}
	}

	c.mu.Lock()
	if c.stopErr != nil {
		err := c.stopErr
		c.mu.Unlock()
		return nil, err
	}
	if _, dup := c.reg.functions[def.ID]; dup {
		c.mu.Unlock()
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("register function %s: already registered by this worker", def.ID)}
	}
	fn := &function{seq: c.reg.next(), id: def.ID, handler: h, frame: frame}
	c.reg.functions[def.ID] = fn
	s := c.controlLocked(frame)
	c.mu.Unlock()
	c.writeControl(s, frame)

	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			if c.reg.functions[def.ID] != fn {
				c.mu.Unlock()
				return
			}
			delete(c.reg.functions, def.ID)
			delete(c.rejected, def.ID)
			f, _ := protocol.Encode(&protocol.UnregisterFunction{ID: def.ID})
			s := c.controlLocked(f)
			c.mu.Unlock()
			c.writeControl(s, f)
		})
	}, nil
}

// RegistrationError is the engine's refusal of functionID on the current
// connection (a *RejectionError), or nil.
func (c *Client) RegistrationError(functionID string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if re := c.rejected[functionID]; re != nil {
		return re
	}
	return nil
}

// RegisterTriggerType provides a trigger type; the engine forwards the
// triggers bound to it to h.
func (c *Client) RegisterTriggerType(def TriggerTypeDef, h TriggerHandler) (unregister func(), err error) {
	if def.ID == "" {
		return nil, &Error{Code: CodeInvalidArgument, Message: "register trigger type: empty id"}
	}
	if h == nil {
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("register trigger type %s: no handler", def.ID)}
	}
	if def.Namespace != "" && !ValidNamespace(def.Namespace) {
		return nil, &Error{Code: CodeInvalidNamespace, Message: fmt.Sprintf("register trigger type %s: namespace %q is invalid", def.ID, def.Namespace)}
	}
	for what, raw := range map[string]json.RawMessage{"trigger request schema": def.TriggerRequestSchema, "call request schema": def.CallRequestSchema} {
		if err := checkJSON(fmt.Sprintf("register trigger type %s: %s", def.ID, what), raw); err != nil {
			return nil, err
		}
	}
	msg := &protocol.RegisterTriggerType{ID: def.ID, Description: def.Description,
		TriggerRequestFormat: def.TriggerRequestSchema, CallRequestFormat: def.CallRequestSchema}
	if def.Namespace != "" {
		msg.Namespace = &def.Namespace
	}
	frame, err := protocol.Encode(msg)
	if err != nil {
		return nil, &Error{Code: CodeSerialization, Message: fmt.Sprintf("register trigger type %s: %v", def.ID, err), Err: err}
	}
	c.mu.Lock()
	if c.stopErr != nil {
		err := c.stopErr
		c.mu.Unlock()
		return nil, err
	}
	if _, dup := c.reg.triggerTypes[def.ID]; dup {
		c.mu.Unlock()
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("register trigger type %s: already registered by this worker", def.ID)}
	}
	tt := &triggerType{seq: c.reg.next(), id: def.ID, handler: h, frame: frame}
	c.reg.triggerTypes[def.ID] = tt
	s := c.controlLocked(frame)
	c.mu.Unlock()
	c.writeControl(s, frame)

	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			if c.reg.triggerTypes[def.ID] != tt {
				c.mu.Unlock()
				return
			}
			delete(c.reg.triggerTypes, def.ID)
			f, _ := protocol.Encode(&protocol.UnregisterTriggerType{ID: def.ID})
			s := c.controlLocked(f)
			c.mu.Unlock()
			c.writeControl(s, f)
		})
	}, nil
}

// RegisterTrigger binds def.FunctionID to a trigger type. A refusal by the
// provider or the engine reaches Options.OnRegistrationError as a
// *TriggerError.
func (c *Client) RegisterTrigger(def TriggerDef) (unregister func(), err error) {
	if def.TriggerType == "" || def.FunctionID == "" {
		return nil, &Error{Code: CodeInvalidArgument, Message: "register trigger: trigger type and function id are required"}
	}
	if err := checkJSON("register trigger: config", def.Config); err != nil {
		return nil, err
	}
	if err := checkJSON("register trigger: metadata", def.Metadata); err != nil {
		return nil, err
	}
	if def.ID == "" {
		def.ID = uuid.NewString()
	}
	msg := &protocol.RegisterTrigger{ID: def.ID, TriggerType: def.TriggerType, FunctionID: def.FunctionID,
		Config: def.Config, Metadata: def.Metadata}
	ns := def.Namespace
	if ns == "" {
		ns = c.opts.Namespace
	}
	if ns != "" {
		msg.Namespace = &ns
	}
	if def.TriggerNamespace != "" {
		msg.TriggerNamespace = &def.TriggerNamespace
	}
	frame, err := protocol.Encode(msg)
	if err != nil {
		return nil, &Error{Code: CodeSerialization, Message: fmt.Sprintf("register trigger %s: %v", def.ID, err), Err: err}
	}
	c.mu.Lock()
	if c.stopErr != nil {
		err := c.stopErr
		c.mu.Unlock()
		return nil, err
	}
	if _, dup := c.reg.triggers[def.ID]; dup {
		c.mu.Unlock()
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("register trigger %s: already registered by this worker", def.ID)}
	}
	tr := &trigger{seq: c.reg.next(), id: def.ID, frame: frame}
	c.reg.triggers[def.ID] = tr
	s := c.controlLocked(frame)
	c.mu.Unlock()
	c.writeControl(s, frame)

	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			if c.reg.triggers[def.ID] != tr {
				c.mu.Unlock()
				return
			}
			delete(c.reg.triggers, def.ID)
			f, _ := protocol.Encode(&protocol.UnregisterTrigger{ID: def.ID, TriggerType: def.TriggerType})
			s := c.controlLocked(f)
			c.mu.Unlock()
			c.writeControl(s, f)
		})
	}, nil
}

// controlLocked routes a registration change: straight out on a ready
// connection (returned), into the queue while a handshake runs (the
// handshake's snapshot predates the change), or nowhere while disconnected
// (the next handshake's snapshot includes it). c.mu must be held.
func (c *Client) controlLocked(frame []byte) *session {
	s := c.sess
	if s == nil {
		return nil
	}
	if s.ready {
		return s
	}
	c.queue = append(c.queue, &outFrame{data: frame})
	return nil
}

// writeControl writes a registration change. A failure needs no retry: the
// connection is going, and the next one re-sends the whole state.
func (c *Client) writeControl(s *session, frame []byte) {
	if s == nil {
		return
	}
	if err := s.write(frame); err != nil {
		c.log.Debug("registration change not written; the next connection re-sends the state", "error", err)
	}
}

// handleInvoke runs the handler of an invocation on its own goroutine.
func (c *Client) handleInvoke(s *session, m *protocol.InvokeFunction) {
	c.mu.Lock()
	fn := c.reg.functions[m.FunctionID]
	c.mu.Unlock()
	if fn == nil || fn.handler == nil {
		if m.InvocationID == "" {
			c.log.Warn("void invocation of a function this worker does not serve", "function_id", m.FunctionID)
			return
		}
		body := &protocol.ErrorBody{Code: protocol.CodeFunctionNotFound, Message: fmt.Sprintf("Function %s is not served by this worker", m.FunctionID)}
		if fn != nil {
			body = &protocol.ErrorBody{Code: protocol.CodeFunctionNotInvokable, Message: fmt.Sprintf("Function %s is HTTP-invoked and cannot be invoked on the worker", m.FunctionID)}
		}
		c.writeResult(s, &protocol.InvocationResult{InvocationID: m.InvocationID, FunctionID: m.FunctionID, Error: body})
		return
	}
	c.handlers.Add(1)
	go func() {
		defer c.handlers.Done()
		c.runHandler(s, fn.handler, m)
	}()
}

func (c *Client) runHandler(s *session, h Handler, m *protocol.InvokeFunction) {
	inv := &Invocation{ID: m.InvocationID, FunctionID: m.FunctionID, Data: m.Data, Metadata: m.Metadata,
		Traceparent: m.Traceparent, Baggage: m.Baggage}
	if m.Namespace != nil {
		inv.Namespace = *m.Namespace
	}
	res, err := callHandler(s.ctx, h, inv)
	if m.InvocationID == "" {
		if err != nil {
			c.log.Warn("void invocation failed", "function_id", m.FunctionID, "error", err)
		}
		return
	}
	out := &protocol.InvocationResult{InvocationID: m.InvocationID, FunctionID: m.FunctionID,
		Traceparent: m.Traceparent, Baggage: m.Baggage}
	if err != nil {
		out.Error = errorBody(err)
	} else if raw, merr := marshalValue(res); merr != nil {
		out.Error = &protocol.ErrorBody{Code: CodeSerialization, Message: fmt.Sprintf("the result of %s cannot be encoded as JSON: %v", m.FunctionID, merr)}
	} else {
		out.Result = raw
	}
	c.writeResult(s, out)
}

// callHandler runs h, turning a panic into an invocation_failed error.
func callHandler(ctx context.Context, h Handler, inv *Invocation) (res any, err error) {
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, &protocol.ErrorBody{Code: protocol.CodeInvocationFailed,
				Message: fmt.Sprintf("handler of %s panicked: %v", inv.FunctionID, p), Stacktrace: string(debug.Stack())}
		}
	}()
	return h(ctx, inv)
}

// errorBody is how a handler error travels.
func errorBody(err error) *protocol.ErrorBody {
	var eb *protocol.ErrorBody
	if errors.As(err, &eb) && eb != nil {
		return eb
	}
	return &protocol.ErrorBody{Code: protocol.CodeInvocationFailed, Message: err.Error()}
}

// writeResult sends a result on the connection the invocation came on; if
// that connection is gone the engine has already failed the call.
func (c *Client) writeResult(s *session, out *protocol.InvocationResult) {
	f, err := protocol.EncodeFast(out)
	if err != nil {
		out.Result = nil
		out.Error = &protocol.ErrorBody{Code: CodeSerialization, Message: fmt.Sprintf("the result of %s cannot be encoded: %v", out.FunctionID, err)}
		if f, err = protocol.Encode(out); err != nil {
			return
		}
	}
	if err := s.write(f); err != nil {
		c.log.Debug("result not delivered: connection gone", "function_id", out.FunctionID, "error", err)
	}
}

// handleTriggerRegistration asks the provider handler about a binding and
// acknowledges it.
func (c *Client) handleTriggerRegistration(s *session, m *protocol.RegisterTrigger) {
	c.mu.Lock()
	tt := c.reg.triggerTypes[m.TriggerType]
	c.mu.Unlock()
	ack := &protocol.TriggerRegistrationResult{ID: m.ID, TriggerType: m.TriggerType, FunctionID: m.FunctionID}
	if tt == nil {
		ack.Error = &protocol.ErrorBody{Code: "trigger_type_not_found", Message: fmt.Sprintf("trigger type %s is not provided by this worker", m.TriggerType)}
		c.writeAck(s, ack)
		return
	}
	reg := triggerRegistration(m.ID, m.TriggerType, m.FunctionID, m.Config, m.Metadata, m.Namespace, m.TriggerNamespace)
	c.handlers.Add(1)
	go func() {
		defer c.handlers.Done()
		if err := callTrigger(s.ctx, tt.handler.RegisterTrigger, reg); err != nil {
			var eb *protocol.ErrorBody
			if errors.As(err, &eb) && eb != nil {
				ack.Error = eb
			} else {
				ack.Error = &protocol.ErrorBody{Code: "trigger_registration_failed", Message: err.Error()}
			}
		}
		c.writeAck(s, ack)
	}()
}

func (c *Client) handleTriggerUnregistration(s *session, m *protocol.UnregisterTrigger) {
	c.mu.Lock()
	tt := c.reg.triggerTypes[m.TriggerType]
	c.mu.Unlock()
	if tt == nil {
		return
	}
	reg := TriggerRegistration{ID: m.ID, TriggerType: m.TriggerType}
	c.handlers.Add(1)
	go func() {
		defer c.handlers.Done()
		if err := callTrigger(s.ctx, tt.handler.UnregisterTrigger, reg); err != nil {
			c.log.Warn("trigger unregistration failed", "trigger_id", m.ID, "error", err)
		}
	}()
}

func triggerRegistration(id, typ, fn string, config, meta json.RawMessage, ns, tns *string) TriggerRegistration {
	r := TriggerRegistration{ID: id, TriggerType: typ, FunctionID: fn, Config: config, Metadata: meta}
	if ns != nil {
		r.Namespace = *ns
	}
	if tns != nil {
		r.TriggerNamespace = *tns
	}
	return r
}

// callTrigger runs a provider callback, turning a panic into an error.
func callTrigger(ctx context.Context, f func(context.Context, TriggerRegistration) error, r TriggerRegistration) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("trigger handler panicked: %v", p)
		}
	}()
	return f(ctx, r)
}

func (c *Client) writeAck(s *session, ack *protocol.TriggerRegistrationResult) {
	f, err := protocol.Encode(ack)
	if err != nil {
		return
	}
	if err := s.write(f); err != nil {
		c.log.Debug("trigger acknowledgement not delivered", "trigger_id", ack.ID, "error", err)
	}
}
