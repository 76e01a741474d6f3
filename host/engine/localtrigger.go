package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/iii-sandbox/iii/protocol"
)

// TriggerBinding is a registered trigger as the in-process provider of its
// type sees it.
type TriggerBinding struct {
	ID          string
	TriggerType string
	FunctionID  string
	// Namespace is where FunctionID is called.
	Namespace string
	Config    json.RawMessage
	Metadata  json.RawMessage
	// RegistrantAdmin reports that the worker that registered the trigger
	// holds the engine token (or is in-process): a provider whose events
	// carry what only such a caller may read (the configuration worker's
	// expanded values) checks it.
	RegistrantAdmin bool
	// caller is the registrant's authority: Fire runs the function and
	// its condition as it (authority.go). A binding the engine did not
	// hand over has none, and fires nothing.
	caller Caller
}

// Caller is the authority of the worker that registered the trigger, for
// Engine.InvokeAs: a provider calls what the binding names only as it.
func (b TriggerBinding) Caller() Caller { return b.caller }

// TriggerProvider serves trigger types an in-process worker provides. The
// engine calls it outside its locks, once per binding that binds to or
// leaves the type. A RegisterTrigger error parks the binding again and
// reaches the worker that registered it (its code and message when it is a
// *protocol.ErrorBody).
type TriggerProvider interface {
	RegisterTrigger(b TriggerBinding) error
	UnregisterTrigger(b TriggerBinding)
}

// RegisterTriggerType makes the worker the provider of trigger type id in
// its namespace, served by p. Bindings of that type, registered before or
// after, are handed to p; a later registration of the same id by another
// worker takes it over (last registration wins, as over the wire).
func (l *LocalWorker) RegisterTriggerType(id, description string, p TriggerProvider) error {
	if p == nil {
		return &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "trigger type " + quote(id) + ": nil provider"}
	}
	if strings.TrimSpace(id) == "" {
		return &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "trigger type id is empty"}
	}
	if l.w.closing.Load() {
		return &protocol.ErrorBody{Code: protocol.CodeInvocationStopped, Message: "worker " + l.w.id + " is detached"}
	}
	l.e.addTriggerType(&triggerType{key: ttKey{l.w.namespace, id}, provider: l.w, description: sanitizeText(description), local: p})
	return nil
}

// UnregisterTriggerType withdraws a trigger type this worker provides; its
// bindings move to another provider or are parked.
func (l *LocalWorker) UnregisterTriggerType(id string) {
	l.e.unregisterTriggerType(l.w, id)
}

func (b *binding) public() TriggerBinding {
	return TriggerBinding{ID: b.id, TriggerType: b.triggerType, FunctionID: b.functionID, Namespace: b.namespace,
		Config: clone(b.config), Metadata: clone(b.metadata),
		RegistrantAdmin: b.caller.Admin(), caller: b.caller}
}

// addLocalRegister queues telling tt's in-process provider about b.
func (o *outbox) addLocalRegister(b *binding, tt *triggerType) {
	pub := b.public()
	e := tt.provider.e
	o.addCall(func() {
		err := tt.local.RegisterTrigger(pub)
		if err == nil {
			return
		}
		var errb *protocol.ErrorBody
		if !errors.As(err, &errb) {
			errb = &protocol.ErrorBody{Code: CodeInvalidArgument, Message: err.Error()}
		}
		e.triggerResult(tt.provider, &protocol.TriggerRegistrationResult{ID: pub.ID, TriggerType: pub.TriggerType, FunctionID: pub.FunctionID, Error: errb})
	})
}

// addLocalUnregister queues telling tt's in-process provider that b left.
func (o *outbox) addLocalUnregister(b *binding, tt *triggerType) {
	pub := b.public()
	o.addCall(func() { tt.local.UnregisterTrigger(pub) })
}

func (o *outbox) addCall(f func()) {
	*o = append(*o, struct {
		to    *worker
		frame []byte
		call  func()
	}{call: f})
}

// HasFunction reports whether id is registered in namespace ns ("" means
// DefaultNamespace) right now.
func (e *Engine) HasFunction(ns, id string) bool {
	if ns == "" {
		ns = DefaultNamespace
	}
	return e.reg.get(ns, id) != nil
}

// ConditionError is Fire's error when the binding's condition function
// failed (the trigger's function was then not called).
type ConditionError struct {
	FunctionID string
	Err        error
}

func (e *ConditionError) Error() string {
	return "condition function " + e.FunctionID + ": " + e.Err.Error()
}

func (e *ConditionError) Unwrap() error { return e.Err }

// Fire is how an in-process provider delivers one event to a binding, as
// upstream's providers do: when condition names a function it is called
// first, and an answer of false skips the binding (any other answer lets
// it run); then b's function is called with payload and b's metadata in
// b's namespace. Both run as the worker that registered the trigger, and
// are checked as its direct calls would be when they run (a refusal is
// logged and returned; the function does not run). A failing condition
// skips the binding and is returned as a *ConditionError.
func (e *Engine) Fire(ctx context.Context, b TriggerBinding, condition string, payload json.RawMessage) error {
	if condition != "" {
		res, err := e.InvokeAs(ctx, b.caller, b.Namespace, condition, payload, nil)
		if err != nil {
			return &ConditionError{FunctionID: condition, Err: err}
		}
		if bytes.Equal(bytes.TrimSpace(res), []byte("false")) {
			return nil
		}
	}
	_, err := e.InvokeAs(ctx, b.caller, b.Namespace, b.FunctionID, payload, b.Metadata)
	return err
}
