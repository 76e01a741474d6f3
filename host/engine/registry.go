package engine

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"

	"github.com/iii-sandbox/iii/protocol"
)

type fnKey struct{ ns, id string }

// function is one registry entry: a function id in a namespace, owned by a
// worker (its lease holder).
type function struct {
	ns, id         string
	description    string
	requestSchema  json.RawMessage
	responseSchema json.RawMessage
	metadata       json.RawMessage
	owner          *worker
	handler        Handler // in-process functions only
	// inline handlers are engine builtins that never block: they run on the
	// caller's read loop, which also keeps engine::workers::register in
	// order with the frames around it.
	inline bool
	// http marks a function registered with an HTTP invocation reference;
	// httpEP is that reference as iii-http-functions admitted it
	// (HTTPInvoker.Prepare's endpoint, httpinvoke.go): the engine calls
	// the endpoint itself.
	http   *protocol.HTTPInvocationRef
	httpEP any
	// privileged functions answer UNAUTHORIZED to callers without the
	// engine token.
	privileged bool
	// wireID is the id the owning worker knows the function by, when the
	// engine registered it under another (an RBAC
	// function_registration_prefix); "" = id.
	wireID string
}

// workerID is the id to use in frames sent to the owning worker.
func (f *function) workerID() string {
	if f.wireID != "" {
		return f.wireID
	}
	return f.id
}

// registry is the function table keyed by (namespace, id). Lookups take the
// read lock only; writes happen on registration, which is rare next to calls.
type registry struct {
	mu   sync.RWMutex
	fns  map[fnKey]*function
	byID map[string]map[string]struct{} // id → namespaces holding it
}

func (r *registry) init() {
	r.fns = make(map[fnKey]*function)
	r.byID = make(map[string]map[string]struct{})
}

func (r *registry) get(ns, id string) *function {
	r.mu.RLock()
	f := r.fns[fnKey{ns, id}]
	r.mu.RUnlock()
	return f
}

// namespacesOf lists, sorted, the namespaces in which id is registered.
func (r *registry) namespacesOf(id string) []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.byID[id]))
	for ns := range r.byID[id] {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out
}

// register claims the (namespace, id) lease for f.owner. It returns the live
// worker that holds the lease when the claim is refused. Re-registering by
// the same owner replaces the definition; an owner that is tearing down
// never blocks the claim.
func (r *registry) register(f *function) (holder *worker, ok bool) {
	k := fnKey{f.ns, f.id}
	r.mu.Lock()
	defer r.mu.Unlock()
	if f.owner.closing.Load() {
		// Its teardown has already swept (or is sweeping) the table; adding
		// now would leave an entry nobody removes.
		return nil, false
	}
	if old, exists := r.fns[k]; exists && old.owner != f.owner {
		if !old.owner.closing.Load() {
			return old.owner, false
		}
		old.owner.mu.Lock()
		delete(old.owner.functions, f.id)
		old.owner.mu.Unlock()
	}
	r.fns[k] = f
	nss := r.byID[f.id]
	if nss == nil {
		nss = make(map[string]struct{}, 1)
		r.byID[f.id] = nss
	}
	nss[f.ns] = struct{}{}
	f.owner.mu.Lock()
	f.owner.functions[f.id] = struct{}{}
	f.owner.mu.Unlock()
	return nil, true
}

// unregister drops (ns, id) if w owns it.
func (r *registry) unregister(w *worker, ns, id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.deleteLocked(w, fnKey{ns, id}) {
		return false
	}
	w.mu.Lock()
	delete(w.functions, id)
	w.mu.Unlock()
	return true
}

// removeOwned drops every listed function still owned by w.
func (r *registry) removeOwned(w *worker, ns string, ids []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		r.deleteLocked(w, fnKey{ns, id})
	}
}

func (r *registry) deleteLocked(w *worker, k fnKey) bool {
	f, ok := r.fns[k]
	if !ok || f.owner != w {
		return false
	}
	delete(r.fns, k)
	if nss := r.byID[k.id]; nss != nil {
		delete(nss, k.ns)
		if len(nss) == 0 {
			delete(r.byID, k.id)
		}
	}
	return true
}

func (r *registry) snapshot() []*function {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*function, 0, len(r.fns))
	for _, f := range r.fns {
		out = append(out, f)
	}
	return out
}

// notFound names the namespaces that do hold the id, so a caller that
// forgot its namespace learns which one.
func notFound(ns, id string, elsewhere []string) *protocol.ErrorBody {
	msg := "Function " + id + " not found in namespace " + ns + "."
	others := elsewhere[:0:0]
	for _, o := range elsewhere {
		if o != ns {
			others = append(others, o)
		}
	}
	if len(others) > 0 {
		msg += " It is registered in namespace(s): " + strings.Join(others, ", ") + "."
	}
	return &protocol.ErrorBody{Code: protocol.CodeFunctionNotFound, Message: msg}
}

// registerFunction applies a registerfunction frame (or a local
// registration) in namespace ns for w, answering refusals the way SDKs
// expect: a registrationrejected frame for socket workers, an error for
// in-process ones.
func (e *Engine) registerFunction(w *worker, f *function) *protocol.ErrorBody {
	if strings.TrimSpace(f.id) == "" {
		return &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "function id is empty"}
	}
	if strings.HasPrefix(f.id, "engine::") && f.ns != DefaultNamespace {
		rej := &protocol.RegistrationRejected{Code: protocol.CodeFuncNamespaceConflict, Namespace: f.ns, FunctionID: f.id}
		e.reject(w, rej)
		return &protocol.ErrorBody{Code: protocol.CodeFuncNamespaceConflict,
			Message: "function ids under engine:: are reserved to the default namespace; " + f.id + " cannot be registered in " + f.ns}
	}
	holder, ok := e.reg.register(f)
	if ok {
		if w.conn != nil && e.guard().Heartbeat(f.id) {
			w.conn.watchLiveness()
		}
		return nil
	}
	if holder == nil {
		return &protocol.ErrorBody{Code: protocol.CodeInvocationStopped, Message: "worker is detaching"}
	}
	rej := &protocol.RegistrationRejected{Code: protocol.CodeFuncNamespaceConflict, Namespace: f.ns, FunctionID: f.id, OwnerWorkerID: holder.id}
	e.reject(w, rej)
	e.log.Warn("function registration refused: lease held", "namespace", f.ns, "function_id", f.id, "worker_id", w.id, "owner_worker_id", holder.id)
	return &protocol.ErrorBody{Code: protocol.CodeFuncNamespaceConflict,
		Message: "function " + f.id + " is already registered in namespace " + f.ns + " by worker " + holder.id}
}

// reject sends a registrationrejected frame to a socket worker.
func (e *Engine) reject(w *worker, rej *protocol.RegistrationRejected) {
	if w.conn == nil {
		return
	}
	if b, err := protocol.Encode(rej); err == nil {
		w.conn.send(b)
	}
}

// applyRegistration applies one (possibly buffered) registration frame in
// the worker's resolved namespace. Failures are logged and skipped: a bad
// registration never drops the connection.
func (e *Engine) applyRegistration(w *worker, ns string, m protocol.Message) {
	switch m := m.(type) {
	case *protocol.RegisterFunction:
		f := &function{ns: ns, id: m.ID, description: m.Description, requestSchema: m.RequestFormat,
			responseSchema: m.ResponseFormat, metadata: m.Metadata, owner: w, http: m.Invocation,
			privileged: markedPrivileged(m.Metadata)}
		errb := e.admitRegistration(w, f)
		if errb == nil && f.http != nil {
			errb = e.admitHTTPFunction(w, f)
		}
		if errb != nil {
			e.log.Warn("registerfunction refused", "worker_id", w.id, "function_id", m.ID, "namespace", ns, "code", errb.Code, "error", errb.Message)
			e.reject(w, &protocol.RegistrationRejected{Code: errb.Code, Namespace: ns, FunctionID: m.ID})
			return
		}
		if err := e.registerFunction(w, f); err != nil {
			e.log.Debug("registerfunction refused", "worker_id", w.id, "function_id", m.ID, "code", err.Code)
			return
		}
		if e.recheck(w, f) {
			return
		}
		// SetHTTPFunctions(nil) may have swept the registry between the
		// admission and the insert: an HTTP function must not outlive
		// the worker that calls it.
		if f.http != nil && e.httpFns.inv.Load() == nil && e.reg.unregister(w, ns, f.id) {
			e.log.Info("HTTP-invocation function dropped: iii-http-functions stopped", "namespace", ns, "function_id", f.id, "worker_id", w.id)
		}
	case *protocol.UnregisterFunction:
		id := m.ID
		if p := w.principal; p != nil && p.session != nil && p.session.FunctionRegistrationPrefix != "" {
			id = p.session.FunctionRegistrationPrefix + "::" + id
		}
		e.reg.unregister(w, ns, id)
	case *protocol.RegisterService:
		w.mu.Lock()
		if w.phase != nsAborted {
			w.services[m.ID] = *m
		}
		w.mu.Unlock()
	case *protocol.RegisterTriggerType:
		e.registerTriggerType(w, ns, m)
	case *protocol.UnregisterTriggerType:
		e.unregisterTriggerType(w, m.ID)
	case *protocol.RegisterTrigger:
		e.registerTrigger(w, ns, m)
	case *protocol.UnregisterTrigger:
		e.unregisterTrigger(w, m)
	}
}

// idsWithPrefix lists the ids registered in ns that start with prefix.
func (r *registry) idsWithPrefix(ns, prefix string) []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []string
	for k := range r.fns {
		if k.ns == ns && strings.HasPrefix(k.id, prefix) {
			out = append(out, k.id)
		}
	}
	return out
}
