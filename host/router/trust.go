package router

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/lazyre"
	"github.com/iii-sandbox/iii/protocol"
)

// Trust is the router's rule on who may serve a sandbox adapter, installed
// into the engine as its registration guard (engine.RegistrationGuard): the
// adapters whose names are protected, what a sandbox host credential lets
// its holder register, who owns an adapter's worker name, which
// connections serve sandboxes (and are heartbeated), and whether the
// router may forward callers' data to a function's owner. The engine asks
// it at every registration and keeps none of these rules itself
// (docs/security.md, "Adapter names").
type Trust struct {
	eng *engine.Engine
	log hclog.Logger

	// names are the sandbox adapters the engine knows: started by the
	// plugin host, bound by the router, named by an issued sandbox host
	// credential, or installed where the plugin host finds adapters. Ids
	// under such a name (<adapter>::*) are the adapter's: only its
	// trusted owner may register them.
	mu    sync.RWMutex
	names map[string]struct{}
}

// NewTrust makes the trust rules for eng and installs them, which must
// happen before workers connect; an engine takes one guard only.
func NewTrust(eng *engine.Engine) (*Trust, error) {
	t := &Trust{eng: eng, log: eng.Logger()}
	if err := eng.SetGuard(t); err != nil {
		return nil, fmt.Errorf("install the sandbox trust rules: %w", err)
	}
	return t, nil
}

// hostScope is what a sandbox host credential lets its holder serve: the
// scope the engine keeps with the credential without looking into it.
type hostScope struct {
	adapter   string
	hostName  string
	namespace string
}

// hostOf is p's sandbox host scope, nil when p holds none.
func hostOf(p engine.Principal) *hostScope {
	h, _ := p.Scope().(*hostScope)
	return h
}

func (t *Trust) has(name string) bool {
	t.mu.RLock()
	_, ok := t.names[name]
	t.mu.RUnlock()
	return ok
}

func (t *Trust) add(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.names == nil {
		t.names = map[string]struct{}{}
	}
	t.names[name] = struct{}{}
}

// Known lists, sorted, the adapters whose names are protected.
func (t *Trust) Known() []string {
	t.mu.RLock()
	out := make([]string, 0, len(t.names))
	for n := range t.names {
		out = append(out, n)
	}
	t.mu.RUnlock()
	sort.Strings(out)
	return out
}

// Reserve makes name a known adapter (the server, Bind, and through
// engine.ReserveName the plugin host and issued credentials):
// from now on <name>::* may be registered only by the adapter's trusted
// owner (the engine token's holder, an in-process worker such as the
// plugin host, or a sandbox host credential issued for that adapter and
// namespace). A function under the prefix that another worker registered
// before the name became known is evicted from the registry (and its
// owner told with a registrationrejected frame coded FORBIDDEN): a
// squatter neither receives what callers send the adapter nor keeps the
// adapter from registering. A name that is not an adapter name is ignored.
func (t *Trust) Reserve(name string) {
	if !contract.ValidAdapterName(name) || engine.Reserved(name+"::") {
		return
	}
	// The name is marked before the registry is swept; a registration
	// that passed its admission before the mark is judged again after its
	// insert, so none slips between the two.
	t.add(name)
	t.eng.Reexamine(name + "::")
}

// prefixOf returns the adapter whose names id falls under, and whether id
// is one: <a>::* for a known adapter a, and whatever a is, <a>::worker::*
// and <a>::host::* (the forms only adapters serve: a VM worker's start
// request carries its engine credential and host directory, and a fleet
// host's functions receive callers' sandboxes).
func (t *Trust) prefixOf(id string) (string, bool) {
	a, rest, ok := strings.Cut(id, "::")
	if !ok || a == "" || engine.Reserved(a+"::") {
		return "", false
	}
	if strings.HasPrefix(rest, "worker::") || strings.HasPrefix(rest, "host::") {
		return a, true
	}
	return a, t.has(a)
}

// trusted is the one rule for "p may serve adapter's id in ns": the engine
// token's holder or an in-process worker, or a sandbox host whose
// credential (not revoked) names that adapter and namespace. Forwarding
// (OwnerOf), registration (AdmitFunction) and the eviction of squatters
// all use it.
func trusted(p engine.Principal, ns, adapter, id string) bool {
	if p.Admin() {
		return true
	}
	if h := hostOf(p); h != nil {
		return !p.Revoked() && h.namespace == ns && h.adapter == adapter && strings.HasPrefix(id, adapter+"::")
	}
	return false
}

// AdmitFunction applies a sandbox host credential's rule, then the adapter
// names' rule, to the registration of id in ns by p.
func (t *Trust) AdmitFunction(p engine.Principal, ns, id string) (privileged bool, refusal *protocol.ErrorBody) {
	privileged, refusal = admitHost(p, ns, id)
	if refusal != nil {
		return false, refusal
	}
	a, ok := t.prefixOf(id)
	if !ok {
		return privileged, nil
	}
	if trusted(p, ns, a, id) {
		// A sandbox host's operations on sandboxes are privileged, as the
		// plugin host registers them: callers go through sandbox::*,
		// whose router keeps each to its own sandboxes.
		if hostOf(p) != nil && !openAdapterOp(id) {
			privileged = true
		}
		return privileged, nil
	}
	return false, &protocol.ErrorBody{Code: engine.CodeForbidden, Message: "function ids under " + a + ":: are reserved to the sandbox adapter " + quote(a) +
		" (<adapter>::* of a known adapter, and every <adapter>::worker::* and <adapter>::host::*): only the engine token's holder or a sandbox host credential issued for that adapter and namespace registers them; " +
		id + " in namespace " + quote(ns) + " cannot be registered (docs/security.md)"}
}

// admitHost applies a sandbox host credential's rule to a registration:
// only <adapter>::* in the credential's namespace, and of a fleet's
// <adapter>::host::<name>::* only its own host name's (a host holding
// another's ids would keep that host out of the fleet). The adapter's
// worker::* functions, plain or a fleet host's, are privileged whatever
// the metadata says, as the plugin host registers them (they boot VMs).
func admitHost(p engine.Principal, ns, id string) (privileged bool, refusal *protocol.ErrorBody) {
	h := hostOf(p)
	if h == nil {
		return false, nil
	}
	refuse := func(only string) *protocol.ErrorBody {
		return &protocol.ErrorBody{Code: engine.CodeForbidden, Message: "the sandbox host credential " + quote(p.Label()) + " of host " + quote(h.hostName) +
			" registers only " + only + " in namespace " + quote(h.namespace) + "; " + id + " in namespace " + quote(ns) + " is refused"}
	}
	if ns != h.namespace || !strings.HasPrefix(id, h.adapter+"::") {
		return false, refuse(h.adapter + "::*")
	}
	fleet, own := h.adapter+"::host::", h.adapter+"::host::"+h.hostName+"::"
	if strings.HasPrefix(id, fleet) && !strings.HasPrefix(id, own) {
		return false, refuse(own + "* of the fleet's host functions")
	}
	return strings.HasPrefix(id, h.adapter+"::worker::") || strings.HasPrefix(id, own+"worker::"), nil
}

// openAdapterOp reports the adapter operations that show no sandbox and
// stay open to every caller: adapter::info and catalog::list (plain or a
// fleet host's).
func openAdapterOp(id string) bool {
	return strings.HasSuffix(id, "::adapter::info") || strings.HasSuffix(id, "::catalog::list")
}

// Evicted logs a squatter's function the engine removed.
func (t *Trust) Evicted(r engine.Registration) {
	a, _, _ := strings.Cut(r.FunctionID, "::")
	t.log.Warn("function evicted: its id is under a sandbox adapter's prefix and its worker is not that adapter's trusted owner",
		"adapter", a, "namespace", r.Namespace, "function_id", r.FunctionID, "worker_id", r.WorkerID)
}

// TakesName reports whether claimant, a known adapter's trusted owner,
// takes the worker name name (the adapter's) in ns from holder, a worker
// that is not: a squatter does not keep the adapter from starting
// (WORKER_NAMESPACE_CONFLICT).
func (t *Trust) TakesName(claimant, holder engine.Principal, ns, name, holderID string) bool {
	if !t.has(name) || !trusted(claimant, ns, name, name+"::") || trusted(holder, ns, name, name+"::") {
		return false
	}
	t.log.Warn("worker name taken over by its sandbox adapter: the worker holding it is not the adapter's trusted owner",
		"adapter", name, "namespace", ns, "worker_id", holderID)
	return true
}

// Heartbeat reports whether id is a sandbox adapter's function over
// WebSocket, whose connection the engine pings (docs/scale-out.md): the
// fleet form <adapter>::host::<name>::<op>, or a single adapter's
// <adapter>::adapter::info.
func (t *Trust) Heartbeat(id string) bool {
	if strings.HasSuffix(id, "::adapter::info") {
		return true
	}
	_, rest, ok := strings.Cut(id, "::host::")
	return ok && strings.Contains(rest, "::")
}

// Unresponsive logs a sandbox host the engine cuts for a missed pong.
func (t *Trust) Unresponsive(workerID string, window time.Duration, err error) {
	t.log.Warn("sandbox host did not answer a ping in time; dropping its connection",
		"worker_id", workerID, "window", window.String(), "error", err)
}

var hostNameRE = lazyre.New(`^[a-z0-9-]{1,63}$`)

// CredentialScope checks a credential's sandbox_host block and makes it
// the credential's scope; the credential claims its adapter's names.
func (t *Trust) CredentialScope(spec engine.CredentialSpec) (any, string, *protocol.ErrorBody) {
	h := spec.SandboxHost
	if h == nil {
		return nil, "", nil
	}
	if spec.QueueProvider {
		return nil, "", &protocol.ErrorBody{Code: engine.CodeInvalidArgument, Message: "a credential is a queue provider or a sandbox host, not both"}
	}
	if !contract.ValidAdapterName(h.Adapter) {
		return nil, "", &protocol.ErrorBody{Code: engine.CodeInvalidArgument, Message: "sandbox_host.adapter " + quote(h.Adapter) +
			" is not an adapter name: 1 to 64 of a-z 0-9 _ -, starting with a letter or digit"}
	}
	if engine.Reserved(h.Adapter + "::") {
		return nil, "", &protocol.ErrorBody{Code: engine.CodeInvalidArgument, Message: "sandbox_host.adapter " + quote(h.Adapter) +
			" is a reserved prefix (" + strings.Join(engine.ReservedPrefixes(), ", ") + ")"}
	}
	if !hostNameRE.MatchString(h.HostName) {
		return nil, "", &protocol.ErrorBody{Code: engine.CodeInvalidArgument, Message: "sandbox_host.host_name " + quote(h.HostName) +
			" is not a host name: 1 to 63 of a-z 0-9 -"}
	}
	return &hostScope{adapter: h.Adapter, hostName: h.HostName, namespace: spec.Namespace}, h.Adapter, nil
}

// AdapterOwner describes who serves (ns, id) for the router.
type AdapterOwner struct {
	// Registered: some worker registered the function.
	Registered bool
	// Trusted: its owner holds the engine token (or is in-process), or it
	// is a sandbox host whose credential (not revoked) names this adapter
	// and namespace.
	Trusted bool
	// Host is the sandbox host credential's host_name; "" for an owner
	// that holds the engine token or is in-process.
	Host string
	// WorkerID is the owning worker connection's id.
	WorkerID string
}

// OwnerOf reports who owns <adapter>::<op> (id) in ns, and whether the
// router may forward callers' data to it as adapter: a worker without the
// token cannot stand in for an adapter that is down and receive what
// callers send it.
func (t *Trust) OwnerOf(ns, adapter, id string) AdapterOwner {
	o, ok := t.eng.FunctionOwner(ns, id)
	if !ok {
		return AdapterOwner{}
	}
	out := AdapterOwner{Registered: true, WorkerID: o.WorkerID, Trusted: trusted(o.Principal, ns, adapter, id)}
	if h := hostOf(o.Principal); h != nil {
		out.Host = h.hostName
	}
	return out
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
