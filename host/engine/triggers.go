package engine

import (
	"encoding/json"
	"sync"

	"github.com/iii-sandbox/iii/protocol"
)

// codeTriggerIDConflict refuses a registertrigger whose id another live
// worker already uses.
const codeTriggerIDConflict = "trigger_id_conflict"

type ttKey struct{ ns, id string }

// triggerType is a trigger type a worker provides in a namespace.
type triggerType struct {
	key                  ttKey
	provider             *worker
	description          string
	triggerRequestFormat json.RawMessage
	callRequestFormat    json.RawMessage
	// local serves the type in-process (LocalWorker.RegisterTriggerType):
	// it is told of bindings by calls instead of frames.
	local TriggerProvider
}

// binding is a registered trigger: a function bound to a trigger type. It is
// bound to a provider, or parked until one registers.
type binding struct {
	id               string
	triggerType      string
	functionID       string
	config           json.RawMessage
	metadata         json.RawMessage
	namespace        string  // target function namespace
	triggerNamespace *string // provider namespace; nil = originator's, then default
	originator       *worker
	originNS         string
	bound            *triggerType // nil while parked
	// caller is the registrant's authority, captured at registration: the
	// function and condition run as it (authority.go).
	caller Caller
	// delegatedTo is the socket provider that calls them for it.
	delegatedTo *worker
}

// triggerRegistry holds trigger types and bindings. Trigger traffic is
// control-plane only, so one mutex is enough.
type triggerRegistry struct {
	mu       sync.Mutex
	types    map[ttKey]*triggerType
	bindings map[string]*binding
}

func (t *triggerRegistry) init() {
	t.types = make(map[ttKey]*triggerType)
	t.bindings = make(map[string]*binding)
}

// outbox collects frames to send once the registry lock is released, so a
// slow peer never stalls the registry.
type outbox []struct {
	to    *worker
	frame []byte
	call  func() // an in-process provider's notice, instead of a frame
}

func (o *outbox) add(to *worker, m protocol.Message) {
	if to == nil || to.conn == nil || to.closing.Load() {
		return
	}
	b, err := protocol.Encode(m)
	if err != nil {
		return
	}
	*o = append(*o, struct {
		to    *worker
		frame []byte
		call  func()
	}{to: to, frame: b})
}

func (o outbox) flush() {
	for _, m := range o {
		if m.call != nil {
			m.call()
			continue
		}
		m.to.conn.send(m.frame)
	}
}

func nsPtrUnlessDefault(ns string) *string {
	if ns == "" || ns == DefaultNamespace {
		return nil
	}
	return &ns
}

// providerLocked finds the live provider a binding resolves to: strictly in
// its trigger_namespace when given, else the originator's namespace, then
// default.
func (t *triggerRegistry) providerLocked(b *binding) *triggerType {
	live := func(k ttKey) *triggerType {
		if tt := t.types[k]; tt != nil && !tt.provider.closing.Load() {
			return tt
		}
		return nil
	}
	if b.triggerNamespace != nil {
		return live(ttKey{*b.triggerNamespace, b.triggerType})
	}
	if tt := live(ttKey{b.originNS, b.triggerType}); tt != nil {
		return tt
	}
	return live(ttKey{DefaultNamespace, b.triggerType})
}

func (b *binding) registerFrame() *protocol.RegisterTrigger {
	return &protocol.RegisterTrigger{
		ID: b.id, TriggerType: b.triggerType, FunctionID: b.functionID, Config: b.config, Metadata: b.metadata,
		Namespace: nsPtrUnlessDefault(b.namespace), TriggerNamespace: nsPtrUnlessDefault(b.bound.key.ns),
	}
}

// bindLocked attaches a parked binding to tt and queues the frame that tells
// the provider.
func (b *binding) bindLocked(tt *triggerType, out *outbox) {
	b.bound = tt
	b.delegateLocked(tt)
	if tt.local != nil {
		out.addLocalRegister(b, tt)
		return
	}
	out.add(tt.provider, b.registerFrame())
}

func (b *binding) unbindLocked(out *outbox) {
	if b.bound != nil {
		if b.bound.local != nil {
			out.addLocalUnregister(b, b.bound)
		} else {
			out.add(b.bound.provider, &protocol.UnregisterTrigger{ID: b.id, TriggerType: b.triggerType})
		}
		b.undelegateLocked()
		b.bound = nil
	}
}

func (e *Engine) registerTrigger(o *worker, ns string, m *protocol.RegisterTrigger) {
	fail := func(code, msg string) {
		var out outbox
		out.add(o, &protocol.TriggerRegistrationResult{ID: m.ID, TriggerType: m.TriggerType, FunctionID: m.FunctionID,
			Error: &protocol.ErrorBody{Code: code, Message: msg}})
		out.flush()
	}
	if m.ID == "" || m.TriggerType == "" {
		fail(CodeInvalidArgument, "registertrigger needs id and trigger_type")
		return
	}
	target := DefaultNamespace
	if m.Namespace != nil {
		if errb := validNamespace(*m.Namespace); errb != nil {
			fail(errb.Code, errb.Message)
			return
		}
		target = *m.Namespace
	}
	if m.TriggerNamespace != nil {
		if errb := validNamespace(*m.TriggerNamespace); errb != nil {
			fail(errb.Code, errb.Message)
			return
		}
	}
	if errb := e.admitTrigger(o, target, m); errb != nil {
		e.log.Warn("registertrigger refused", "worker_id", o.id, "trigger_id", m.ID, "function_id", m.FunctionID, "code", errb.Code)
		fail(errb.Code, errb.Message)
		return
	}

	t := &e.triggers
	var out outbox
	t.mu.Lock()
	if o.closing.Load() {
		t.mu.Unlock()
		return
	}
	if old := t.bindings[m.ID]; old != nil {
		if old.originator != o && !old.originator.closing.Load() {
			t.mu.Unlock()
			fail(codeTriggerIDConflict, "trigger id "+m.ID+" is already registered by worker "+old.originator.id)
			return
		}
		old.unbindLocked(&out)
	}
	b := &binding{
		id: m.ID, triggerType: m.TriggerType, functionID: m.FunctionID, config: m.Config, metadata: m.Metadata,
		namespace: target, triggerNamespace: m.TriggerNamespace, originator: o, originNS: ns,
		caller: Caller{p: o.principal, workerID: o.id, triggerID: m.ID, via: "trigger"},
	}
	t.bindings[b.id] = b
	if tt := t.providerLocked(b); tt != nil {
		b.bindLocked(tt, &out)
	}
	t.mu.Unlock()
	out.flush()
}

func (e *Engine) unregisterTrigger(o *worker, m *protocol.UnregisterTrigger) {
	t := &e.triggers
	var out outbox
	t.mu.Lock()
	if b := t.bindings[m.ID]; b != nil && b.originator == o {
		delete(t.bindings, m.ID)
		b.unbindLocked(&out)
	}
	t.mu.Unlock()
	out.flush()
}

// triggerResult handles a provider's ack. Only the provider a binding is
// bound to may answer it; a failure parks the binding again and is passed
// on to the worker that registered it.
func (e *Engine) triggerResult(p *worker, m *protocol.TriggerRegistrationResult) {
	t := &e.triggers
	var out outbox
	t.mu.Lock()
	b := t.bindings[m.ID]
	if b == nil || b.bound == nil || b.bound.provider != p {
		t.mu.Unlock()
		e.log.Debug("ignoring triggerregistrationresult from a worker that is not the provider", "worker_id", p.id, "id", m.ID)
		return
	}
	if m.Error != nil {
		b.undelegateLocked()
		b.bound = nil
		out.add(b.originator, &protocol.TriggerRegistrationResult{ID: b.id, TriggerType: b.triggerType, FunctionID: b.functionID, Error: m.Error})
	}
	t.mu.Unlock()
	out.flush()
}

func (e *Engine) registerTriggerType(p *worker, connNS string, m *protocol.RegisterTriggerType) {
	ns := connNS
	if m.Namespace != nil {
		if errb := validNamespace(*m.Namespace); errb != nil {
			e.log.Warn("registertriggertype refused", "worker_id", p.id, "id", m.ID, "code", errb.Code, "error", errb.Message)
			return
		}
		ns = *m.Namespace
	}
	if m.ID == "" {
		e.log.Warn("registertriggertype without id ignored", "worker_id", p.id)
		return
	}
	if !e.admitTriggerType(p, m) {
		return
	}
	k := ttKey{ns, m.ID}
	e.addTriggerType(&triggerType{key: k, provider: p, description: m.Description,
		triggerRequestFormat: m.TriggerRequestFormat, callRequestFormat: m.CallRequestFormat})
}

// addTriggerType installs tt (last registration wins) and binds the
// bindings that resolve to it.
func (e *Engine) addTriggerType(tt *triggerType) {
	k, p, ns := tt.key, tt.provider, tt.key.ns
	t := &e.triggers
	var out outbox
	t.mu.Lock()
	defer func() {
		t.mu.Unlock()
		out.flush()
	}()
	if p.closing.Load() {
		return
	}
	old := t.types[k]
	if old != nil && old.provider != p {
		// Last registration wins: a provider that restarted without
		// reattaching must not be locked out by its old connection.
		e.log.Info("trigger type taken over by a new provider", "namespace", ns, "id", k.id, "worker_id", p.id, "previous_provider_id", old.provider.id)
	}
	t.types[k] = tt
	for _, b := range t.bindings {
		switch {
		case old != nil && b.bound == old:
			if old.provider == p {
				// Same provider re-registering: the binding already knows.
				b.undelegateLocked()
				b.bound = tt
				b.delegateLocked(tt)
			} else {
				b.unbindLocked(&out)
				b.bindLocked(tt, &out)
			}
		case b.bound == nil:
			if t.providerLocked(b) == tt {
				b.bindLocked(tt, &out)
			}
		case b.triggerType == k.id && b.triggerNamespace == nil && b.bound.key.ns == DefaultNamespace &&
			ns != DefaultNamespace && b.originNS == ns:
			// A provider in the originator's own namespace takes over a
			// binding that had fallen back to default.
			b.unbindLocked(&out)
			b.bindLocked(tt, &out)
		}
	}
}

// unregisterTriggerType withdraws the trigger types id that p provides, in
// whichever namespace it registered them.
func (e *Engine) unregisterTriggerType(p *worker, id string) {
	t := &e.triggers
	var out outbox
	t.mu.Lock()
	for k, tt := range t.types {
		if k.id == id && tt.provider == p {
			t.removeTypeLocked(k, tt, &out)
		}
	}
	t.mu.Unlock()
	out.flush()
}

// removeTypeLocked drops a trigger type and moves its bindings to another
// provider they resolve to, or parks them.
func (t *triggerRegistry) removeTypeLocked(k ttKey, tt *triggerType, out *outbox) {
	delete(t.types, k)
	for _, b := range t.bindings {
		if b.bound != tt {
			continue
		}
		b.undelegateLocked()
		b.bound = nil
		if next := t.providerLocked(b); next != nil {
			b.bindLocked(next, out)
		}
	}
}

// workerGone drops the bindings w registered (telling their providers) and
// the trigger types w provided (parking their bindings).
func (t *triggerRegistry) workerGone(e *Engine, w *worker) {
	var out outbox
	t.mu.Lock()
	for id, b := range t.bindings {
		if b.originator == w {
			delete(t.bindings, id)
			b.unbindLocked(&out)
		}
	}
	for k, tt := range t.types {
		if tt.provider == w {
			t.removeTypeLocked(k, tt, &out)
		}
	}
	t.mu.Unlock()
	out.flush()
}

// triggersFor lists the bindings targeting (ns, functionID), for
// engine::functions::info.
func (t *triggerRegistry) triggersFor(ns, functionID string) []registeredTriggerRef {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := []registeredTriggerRef{}
	for _, b := range t.bindings {
		if b.namespace == ns && b.functionID == functionID {
			cfg := b.config
			if len(cfg) == 0 {
				cfg = json.RawMessage("null")
			}
			out = append(out, registeredTriggerRef{ID: b.id, TriggerType: b.triggerType, Config: cfg})
		}
	}
	return out
}
