package engine

import (
	"sort"
	"strings"
	"sync"

	"github.com/iii-sandbox/iii/internal/adaptername"
	"github.com/iii-sandbox/iii/protocol"
)

// adapterSet holds the names of the sandbox adapters the engine knows:
// started by the plugin host, bound by the sandbox router, named by an
// issued sandbox host credential, or installed where the plugin host finds
// adapters. Ids under such a name (<adapter>::*) are the adapter's: only
// its trusted owner may register them (docs/security.md, "Adapter names").
// The zero value is ready to use.
type adapterSet struct {
	mu    sync.RWMutex
	names map[string]struct{}
}

func (s *adapterSet) has(name string) bool {
	s.mu.RLock()
	_, ok := s.names[name]
	s.mu.RUnlock()
	return ok
}

// add reports whether name is new.
func (s *adapterSet) add(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.names[name]; ok {
		return false
	}
	if s.names == nil {
		s.names = map[string]struct{}{}
	}
	s.names[name] = struct{}{}
	return true
}

// KnownAdapters lists, sorted, the adapters whose names the engine
// protects.
func (e *Engine) KnownAdapters() []string {
	e.adapters.mu.RLock()
	out := make([]string, 0, len(e.adapters.names))
	for n := range e.adapters.names {
		out = append(out, n)
	}
	e.adapters.mu.RUnlock()
	sort.Strings(out)
	return out
}

// ProtectAdapter makes name a known adapter: from now on <name>::* may be
// registered only by the adapter's trusted owner (the engine token's
// holder, an in-process worker such as the plugin host, or a sandbox host
// credential issued for that adapter and namespace). A function under the
// prefix that another worker registered before the name became known is
// evicted from the registry (and its owner told with a
// registrationrejected frame coded FORBIDDEN): a squatter neither receives
// what callers send the adapter nor keeps the adapter from registering.
// A name that is not an adapter name is ignored.
func (e *Engine) ProtectAdapter(name string) {
	if !adaptername.Valid(name) || reservedID(name+"::") {
		return
	}
	// The name is marked before the registry is swept; a registration that
	// passed its admission before the mark is checked again after its
	// insert (recheckAdapterName), so none slips between the two.
	e.adapters.add(name)
	for _, f := range e.reg.snapshot() {
		if !strings.HasPrefix(f.id, name+"::") || trustedAdapterOwner(f.owner.principal, f.ns, name, f.id) {
			continue
		}
		e.evictSquatter(f, name)
	}
}

func (e *Engine) evictSquatter(f *function, adapter string) {
	if !e.reg.unregister(f.owner, f.ns, f.id) {
		return
	}
	e.log.Warn("function evicted: its id is under a sandbox adapter's prefix and its worker is not that adapter's trusted owner",
		"adapter", adapter, "namespace", f.ns, "function_id", f.id, "worker_id", f.owner.id)
	e.reject(f.owner, &protocol.RegistrationRejected{Code: CodeForbidden, Namespace: f.ns, FunctionID: f.workerID()})
}

// adapterPrefixOf returns the adapter whose names id falls under, and
// whether id is one: <a>::* for a known adapter a, and whatever a is,
// <a>::worker::* and <a>::host::* (the forms only adapters serve: a VM
// worker's start request carries its engine credential and host
// directory, and a fleet host's functions receive callers' sandboxes).
func (e *Engine) adapterPrefixOf(id string) (string, bool) {
	a, rest, ok := strings.Cut(id, "::")
	if !ok || a == "" || reservedID(a+"::") {
		return "", false
	}
	if strings.HasPrefix(rest, "worker::") || strings.HasPrefix(rest, "host::") {
		return a, true
	}
	return a, e.adapters.has(a)
}

// trustedAdapterOwner is the one rule for "p may serve adapter's id in
// ns": the engine token's holder or an in-process worker, or a sandbox
// host whose credential (not revoked) names that adapter and namespace.
// The sandbox router (AdapterOwnerOf), registration (admitAdapterName)
// and the eviction of squatters all use it.
func trustedAdapterOwner(p *principal, ns, adapter, id string) bool {
	switch {
	case p == nil:
		return false
	case p.admin:
		return true
	case p.cred != nil && p.cred.host != nil:
		h := p.cred.host
		return !p.cred.revoked.Load() && h.namespace == ns && h.adapter == adapter && strings.HasPrefix(id, adapter+"::")
	}
	return false
}

// admitAdapterName refuses a non-admin registration of an id under an
// adapter's prefix by anyone but that adapter's trusted owner (FORBIDDEN,
// the reserved-name refusal).
func (e *Engine) admitAdapterName(p *principal, f *function) *protocol.ErrorBody {
	a, ok := e.adapterPrefixOf(f.id)
	if ok && trustedAdapterOwner(p, f.ns, a, f.id) {
		// A sandbox host's operations on sandboxes are privileged, as the
		// plugin host registers them: callers go through sandbox::*,
		// whose router keeps each to its own sandboxes.
		if p.cred != nil && p.cred.host != nil && !openAdapterOp(f.id) {
			f.privileged = true
		}
		return nil
	}
	if !ok {
		return nil
	}
	return &protocol.ErrorBody{Code: CodeForbidden, Message: "function ids under " + a + ":: are reserved to the sandbox adapter " + quote(a) +
		" (<adapter>::* of a known adapter, and every <adapter>::worker::* and <adapter>::host::*): only the engine token's holder or a sandbox host credential issued for that adapter and namespace registers them; " +
		f.id + " in namespace " + quote(f.ns) + " cannot be registered (docs/security.md)"}
}

// recheckAdapterName drops f, just registered, when its adapter became
// known between its admission and its insert.
func (e *Engine) recheckAdapterName(w *worker, f *function) bool {
	if w.principal == nil || w.principal.admin || e.admitAdapterName(w.principal, f) == nil {
		return false
	}
	a, _ := e.adapterPrefixOf(f.id)
	e.evictSquatter(f, a)
	return true
}

// adapterNameTakeover reports whether w, a known adapter's trusted owner,
// takes the worker name name (the adapter's) in ns from holder, a worker
// that is not: a squatter does not keep the adapter from starting
// (WORKER_NAMESPACE_CONFLICT). holder keeps its connection and functions,
// without the name. e.namesMu is held.
func (e *Engine) adapterNameTakeover(w, holder *worker, ns, name string) bool {
	if !e.adapters.has(name) || !trustedAdapterOwner(w.principal, ns, name, name+"::") ||
		trustedAdapterOwner(holder.principal, ns, name, name+"::") {
		return false
	}
	holder.mu.Lock()
	holder.hasLease = false
	holder.mu.Unlock()
	e.log.Warn("worker name taken over by its sandbox adapter: the worker holding it is not the adapter's trusted owner",
		"adapter", name, "namespace", ns, "worker_id", holder.id)
	return true
}

// openAdapterOp reports the adapter operations that show no sandbox and
// stay open to every caller: adapter::info and catalog::list (plain or a
// fleet host's).
func openAdapterOp(id string) bool {
	return strings.HasSuffix(id, "::adapter::info") || strings.HasSuffix(id, "::catalog::list")
}
