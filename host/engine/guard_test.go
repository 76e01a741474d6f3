package engine

import (
	"strings"
	"sync"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/protocol"
)

// testGuard is a registration guard whose decisions a test sets; where a
// field is nil it decides as the closed default does. It records what the
// engine tells it.
type testGuard struct {
	closedGuard
	e         *Engine
	scope     func(CredentialSpec) (any, string, *protocol.ErrorBody)
	admit     func(p Principal, ns, id string) (bool, *protocol.ErrorBody)
	heartbeat func(id string) bool

	mu       sync.Mutex
	reserved []string
	evicted  []Registration
}

func installGuard(t *testing.T, te *testEngine, g *testGuard) *testGuard {
	t.Helper()
	g.e, g.log = te.Engine, te.Logger()
	assert.NilError(t, te.SetGuard(g))
	return g
}

func (g *testGuard) CredentialScope(spec CredentialSpec) (any, string, *protocol.ErrorBody) {
	if g.scope != nil {
		return g.scope(spec)
	}
	return g.closedGuard.CredentialScope(spec)
}

func (g *testGuard) Reserve(name string) {
	g.mu.Lock()
	g.reserved = append(g.reserved, name)
	g.mu.Unlock()
	g.e.Reexamine(name + "::")
}

func (g *testGuard) AdmitFunction(p Principal, ns, id string) (bool, *protocol.ErrorBody) {
	if g.admit != nil {
		return g.admit(p, ns, id)
	}
	return g.closedGuard.AdmitFunction(p, ns, id)
}

func (g *testGuard) Evicted(r Registration) {
	g.mu.Lock()
	g.evicted = append(g.evicted, r)
	g.mu.Unlock()
}

func (g *testGuard) Heartbeat(id string) bool { return g.heartbeat != nil && g.heartbeat(id) }

func (g *testGuard) snapshot() (reserved []string, evicted []Registration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.reserved...), append([]Registration(nil), g.evicted...)
}

// hostSpecScope keeps a credential's sandbox_host block as its scope and
// admits, for its holder, only ids under the block's adapter: enough of a
// policy to see the engine keep, persist and hand back a scope.
func hostSpecScope(spec CredentialSpec) (any, string, *protocol.ErrorBody) {
	if spec.SandboxHost == nil {
		return nil, "", nil
	}
	return *spec.SandboxHost, spec.SandboxHost.Adapter, nil
}

func admitOwnAdapter(p Principal, ns, id string) (bool, *protocol.ErrorBody) {
	if h, ok := p.Scope().(protocol.SandboxHostSpec); ok && !strings.HasPrefix(id, h.Adapter+"::") {
		return false, &protocol.ErrorBody{Code: CodeForbidden, Message: "not under " + h.Adapter}
	}
	return false, nil
}

// Without a guard the engine is closed: no scoped credential, the
// <name>::worker::* and <name>::host::* forms reserved to the engine
// token's holder, no name reserved beyond the engine's prefixes, nothing
// heartbeated.
func TestClosedGuard(t *testing.T) {
	te := startEngine(t, Options{})
	admin := te.dialAdmin(t)
	code, msg := errBody(t, admin.call("1", FnCredentialsIssue, nil, `{"namespace":"sbx","sandbox_host":{"adapter":"remote","host_name":"h1"}}`))
	assert.Equal(t, code, CodeInvalidArgument)
	assert.Check(t, is.Contains(msg, "no registration guard"))
	plain := issue(t, admin, "2", `{"label":"plain","namespace":"p"}`)

	te.ReserveName("late") // nothing to reserve it
	for _, tc := range []struct {
		name, ns string
		rc       *rawClient
		want     []string
	}{
		{"anonymous", "q", te.dial(t), []string{"a::worker::start", "a::host::h1::create"}},
		{"a credential", "p", te.dialWith(t, bearerHeader(plain)), []string{"a::worker::start", "a::host::h1::create"}},
		{"the engine token", "r", admin, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := rejectedIDs(t, tc.rc, tc.ns, "w-"+strings.ReplaceAll(tc.name, " ", "-"), "a::worker::start", "a::host::h1::create", "a::create", "late::create", "a::hostx")
			assert.DeepEqual(t, got, tc.want)
			assert.Check(t, hasFn(te, tc.ns, "late::create"))
		})
	}
	assert.Check(t, te.SetGuard(&testGuard{}) == nil)
	assert.Check(t, is.ErrorIs(te.SetGuard(&testGuard{}), errGuardInstalled), "one guard per engine")
}

// A guard's refusal on a later look evicts what it admitted before: the
// worker is told, and the guard hears of it.
func TestGuardReexamine(t *testing.T) {
	te := startEngine(t, Options{})
	var mu sync.Mutex
	reserved := map[string]bool{}
	g := installGuard(t, te, &testGuard{admit: func(p Principal, ns, id string) (bool, *protocol.ErrorBody) {
		a, _, _ := strings.Cut(id, "::")
		mu.Lock()
		defer mu.Unlock()
		if reserved[a] && !p.Admin() {
			return false, &protocol.ErrorBody{Code: CodeForbidden, Message: a + " is reserved"}
		}
		return id == "x::privileged", nil
	}})
	anon := te.dial(t)
	assert.DeepEqual(t, rejectedIDs(t, anon, "p", "squatter", "late::create", "late::exec", "x::privileged"), []string(nil))
	admin := te.dialAdmin(t)
	admin.registerIn("p", "owner", "late::info")
	priv, ok := te.FunctionPrivileged("p", "x::privileged")
	assert.Check(t, ok && priv, "the guard marks it privileged")

	mu.Lock()
	reserved["late"] = true
	mu.Unlock()
	te.ReserveName("late")
	got := map[string]bool{}
	for range 2 {
		f := anon.expect("registrationrejected")
		assert.Equal(t, f.str("code"), CodeForbidden)
		got[f.str("function_id")] = true
	}
	assert.DeepEqual(t, got, map[string]bool{"late::create": true, "late::exec": true})
	assert.Check(t, !hasFn(te, "p", "late::create"))
	assert.Check(t, hasFn(te, "p", "late::info"), "the engine token's holder keeps its own")
	o, ok := te.FunctionOwner("p", "late::info")
	assert.Check(t, ok && o.WorkerID == admin.workerID && o.Principal.Admin())
	res, ev := g.snapshot()
	assert.DeepEqual(t, res, []string{"late"})
	assert.Equal(t, len(ev), 2)
	for _, r := range ev {
		assert.Check(t, r.Namespace == "p" && r.WorkerID == anon.workerID, "%+v", r)
	}
	// And it is refused at admission from now on.
	anon.send(&protocol.RegisterFunction{ID: "late::create"})
	assert.Equal(t, anon.expect("registrationrejected").str("function_id"), "late::create")
}

// rejectedIDs registers ids over rc in ns and returns, in order, those the
// engine refused with FORBIDDEN (registrationrejected), after it applied all.
func rejectedIDs(t *testing.T, rc *rawClient, ns, name string, ids ...string) []string {
	t.Helper()
	for _, id := range ids {
		rc.send(&protocol.RegisterFunction{ID: id})
	}
	rc.register(map[string]any{"name": name, "namespace": ns})
	rc.sendRaw(`{"type":"ping"}`)
	var out []string
	for {
		f := rc.next()
		if f.typ() == "pong" {
			return out
		}
		assert.Equal(t, f.typ(), "registrationrejected", "frame: %v", f)
		assert.Equal(t, f.str("code"), CodeForbidden)
		out = append(out, f.str("function_id"))
	}
}
