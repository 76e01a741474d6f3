package engine

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"

	"github.com/iii-sandbox/iii/protocol"
)

// Authority when a call runs (docs/security.md): every invocation the
// engine makes on someone's behalf — a trigger's function and its
// condition, an enqueued call, a join/leave trigger — runs as the
// principal that set it up, and is checked when it runs exactly as that
// principal's direct call would be. Nothing runs with the engine's rights
// because the engine (or a provider holding more rights) fired it.

// Caller is the authority an invocation runs with: the principal of the
// connection that set the call up, captured when it did, with who that was
// for logs. Only the engine makes one (a binding carries its registrant's,
// an in-process worker has its own, a Call its caller's); the zero Caller
// is nobody, and every call made with it is refused.
type Caller struct {
	p         *principal
	workerID  string
	triggerID string
	// via names what the principal set up, for logs: "trigger",
	// "enqueue"; "" for its own calls.
	via string
}

// Admin reports whether the caller holds the engine token (or is
// in-process).
func (c Caller) Admin() bool { return c.p != nil && c.p.admin }

// WorkerID is the id of the worker connection that set the call up.
func (c Caller) WorkerID() string { return c.workerID }

// configPrincipal is config.yaml's: the operator names auth functions,
// middleware and registration hooks, so they run with the engine token's
// rights.
var configPrincipal = &principal{admin: true, kind: "config"}

// configCaller is the authority of a call config.yaml set up.
func configCaller(what string) Caller {
	return Caller{p: configPrincipal, workerID: what}
}

// Caller is the in-process worker's own authority (admin): what it sets
// up, and what it calls, runs with the engine's rights.
func (l *LocalWorker) Caller() Caller { return Caller{p: l.w.principal, workerID: l.w.id} }

// callerOf is socket (or in-process) worker w's authority.
func callerOf(w *worker) Caller { return Caller{p: w.principal, workerID: w.id} }

// logArgs name who set a call up: principal kind and label, worker id,
// trigger id.
func (c Caller) logArgs() []any {
	kind, label := "none", ""
	if c.p != nil {
		kind, label = c.p.kind, c.p.label
	}
	args := []any{"principal", kind, "worker_id", c.workerID}
	if label != "" {
		args = append(args, "label", label)
	}
	if c.via != "" {
		args = append(args, "via", c.via)
	}
	if c.triggerID != "" {
		args = append(args, "trigger_id", c.triggerID)
	}
	return args
}

// authorize is the check a call of id in ns by c passes at the moment it
// runs: a caller without a principal or with a revoked credential is
// refused, then the principal's own gate (RBAC, privilege).
func (c Caller) authorize(ns, id string, f *function) *protocol.ErrorBody {
	p := c.p
	if p == nil {
		return &protocol.ErrorBody{Code: CodeForbidden, Message: "the engine does not call " + id + " without a principal to call it as"}
	}
	if p.admin {
		return nil
	}
	if p.cred != nil && p.cred.revoked.Load() {
		return &protocol.ErrorBody{Code: CodeForbidden, Message: "the credential " + quote(p.label) + " that set up this call of " + id + " was revoked"}
	}
	return p.authorizeInvoke(ns, id, f)
}

// refused logs an invocation made on c's behalf that its check refused;
// extra are more key/value pairs.
func (e *Engine) refused(c Caller, what, ns, id string, errb *protocol.ErrorBody, extra ...any) {
	args := append([]any{"function_id", id, "namespace", ns, "code", errb.Code, "error", errb.Message}, extra...)
	e.log.Warn(what+" refused: the principal that set it up may not call it", append(args, c.logArgs()...)...)
}

// InvokeAs calls functionID in namespace ("" = default) as c: refused
// (logged, and the function does not run) when c could not call it
// directly right now, through c's listener middleware when its direct call
// would be, and otherwise with the function seeing c as its caller.
// metadata is the invocation metadata the function sees (a trigger's).
func (e *Engine) InvokeAs(ctx context.Context, c Caller, namespace, functionID string, data, metadata json.RawMessage) (json.RawMessage, error) {
	if e.closed.Load() {
		return nil, ErrClosed
	}
	if namespace == "" {
		namespace = DefaultNamespace
	}
	if err := validNamespace(namespace); err != nil {
		return nil, err
	}
	f := e.reg.get(namespace, functionID)
	if errb := c.authorize(namespace, functionID, f); errb != nil {
		e.refused(c, "invocation", namespace, functionID, errb)
		return nil, errb
	}
	if mw := e.middlewareFor(c.p, f); mw != "" {
		in, err := json.Marshal(map[string]any{
			"function_id": functionID, "payload": json.RawMessage(orNull(data)), "action": nil,
			"context": c.p.session.Context, "namespace": namespace,
		})
		if err != nil {
			return nil, &protocol.ErrorBody{Code: protocol.CodeInvocationFailed, Message: "encode middleware input: " + err.Error()}
		}
		return e.InvokeAs(ctx, configCaller("middleware"), namespace, mw, in, nil)
	}
	if f == nil {
		return nil, notFound(namespace, functionID, e.reg.namespacesOf(functionID))
	}
	return e.invokeResolved(ctx, f, &Call{CallerAdmin: c.Admin(), CallerWorkerID: c.workerID, Caller: c,
		FunctionID: functionID, Namespace: namespace, Data: data, Metadata: metadata})
}

// A provider that is a socket worker (a trigger type's, or the queue
// worker) fires a trigger or delivers an enqueued call by invoking the
// function from its own connection: the engine cannot tell that call from
// one the provider makes for itself. So while it holds a trigger set up by
// another principal, or the queue holds calls others enqueued, its call of
// such a function is also checked as each of them (delegations), and
// refused when one of them could not make it.

// delegations are the principals that handed (ns, id) to a provider.
type delegations struct {
	mu sync.Mutex
	m  map[fnKey][]Caller
	n  atomic.Int64 // entries, the hot path's gate
}

// maxEnqueueDelegations bounds the enqueuers remembered (distinct
// principal and target pairs); past it, an enqueue without the engine
// token is refused.
const maxEnqueueDelegations = 65536

// maxDelegatorsPerTarget bounds the distinct enqueuers remembered for one
// target; past it the target's deliveries are checked as nobody (refused)
// rather than as fewer of them than enqueued it.
const maxDelegatorsPerTarget = 64

// rightsKey identifies a principal's rights for deduplication: anonymous
// connections of one listener all have the same.
func rightsKey(p *principal) any {
	if p != nil && p.kind == "anonymous" && p.policy != nil {
		return p.policy
	}
	return p
}

// add records that c handed k to the queue; false when the table is full.
func (d *delegations) add(k fnKey, c Caller) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[fnKey][]Caller{}
	}
	cs := d.m[k]
	for _, o := range cs {
		if o.p == nil || rightsKey(o.p) == rightsKey(c.p) {
			return true
		}
	}
	if d.n.Load() >= maxEnqueueDelegations {
		return false
	}
	if len(cs) >= maxDelegatorsPerTarget {
		// Nobody: every later delivery of k by the provider is refused.
		d.n.Add(-int64(len(cs)))
		c = Caller{workerID: c.workerID, via: c.via}
		cs = cs[:0]
	}
	d.m[k] = append(cs, c)
	d.n.Add(1)
	return true
}

func (d *delegations) callers(k fnKey) []Caller {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Caller(nil), d.m[k]...)
}

// delegateLocked records that b's function and condition are handed to
// the socket worker that provides its trigger type, when b's registrant is
// another principal without the engine token.
func (b *binding) delegateLocked(tt *triggerType) {
	p := tt.provider
	if tt.local != nil || p.conn == nil || b.caller.Admin() || b.caller.p == p.principal {
		return
	}
	if p.delegated == nil {
		p.delegated = map[fnKey][]*binding{}
	}
	for _, id := range b.delegatedIDs() {
		k := fnKey{b.namespace, id}
		p.delegated[k] = append(p.delegated[k], b)
	}
	b.delegatedTo = p
	p.delegations.Add(1)
}

// undelegateLocked withdraws what delegateLocked recorded.
func (b *binding) undelegateLocked() {
	p := b.delegatedTo
	if p == nil {
		return
	}
	for _, id := range b.delegatedIDs() {
		k := fnKey{b.namespace, id}
		bs := p.delegated[k]
		for i, o := range bs {
			if o == b {
				bs = append(bs[:i:i], bs[i+1:]...)
				break
			}
		}
		if len(bs) == 0 {
			delete(p.delegated, k)
		} else {
			p.delegated[k] = bs
		}
	}
	b.delegatedTo = nil
	p.delegations.Add(-1)
}

func (b *binding) delegatedIDs() []string {
	ids := []string{b.functionID}
	if cond := conditionFunctionID(b.config); cond != "" && cond != b.functionID {
		ids = append(ids, cond)
	}
	return ids
}

// checkDelegated applies the delegations to provider a's call of id in
// ns: refused when a principal that handed it to a could not call it now.
func (e *Engine) checkDelegated(a *worker, ns, id string, f *function) *protocol.ErrorBody {
	var cs []Caller
	k := fnKey{ns, id}
	if a.delegations.Load() > 0 {
		e.triggers.mu.Lock()
		for _, b := range a.delegated[k] {
			cs = append(cs, b.caller)
		}
		e.triggers.mu.Unlock()
	}
	// Only the engine token's holder or a queue provider credential's can
	// own engine::queue::enqueue: other callers skip the lookup.
	if e.enqueued.n.Load() > 0 && a.principal.queueProvider() {
		if q := e.reg.get(DefaultNamespace, EnqueueProviderFunctionID); q != nil && q.owner == a {
			cs = append(cs, e.enqueued.callers(k)...)
		}
	}
	for _, c := range cs {
		if errb := c.authorize(ns, id, f); errb != nil {
			e.refused(c, "delivery by a provider", ns, id, errb, "provider_worker_id", a.id)
			return errb
		}
	}
	return nil
}
