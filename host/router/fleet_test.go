package router

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
)

// fakeHost is one sandbox host of a fleet as the engine sees it: a worker
// with a sandbox host credential that registers
// <adapter>::host::<name>::<op> and keeps its sandboxes in memory. The
// real remote adapter over WebSocket is tested in plugins/sdk; this one
// lets the placement and routing be checked exactly.
type fakeHost struct {
	name  string
	slots int
	cl    *client.Client
	// instance is the adapter::info instance_id: a "restarted" host gets
	// a new one (and no sandboxes), a reconnected one keeps it.
	instance string
	// redial connects the host again, same instance and sandboxes.
	redial func(t *testing.T)

	mu   sync.Mutex
	live map[string]bool
}

func startFakeHost(t *testing.T, te *testEnv, adapter, ns, name, registerAs string, slots int) *fakeHost {
	return startFakeHostMajor(t, te, adapter, ns, name, registerAs, slots, contract.Major)
}

func startFakeHostMajor(t *testing.T, te *testEnv, adapter, ns, name, registerAs string, slots, major int) *fakeHost {
	t.Helper()
	cred := issueCredential(t, te, map[string]any{"label": "hosts/" + name, "namespace": ns,
		"sandbox_host": map[string]any{"adapter": adapter, "host_name": name}})
	h := &fakeHost{name: name, slots: slots, live: map[string]bool{}, instance: uuid.NewString()}
	t.Cleanup(func() { _ = h.close() })
	handlers := map[string]client.Handler{
		"adapter::info": func(context.Context, *client.Invocation) (any, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			return map[string]any{"adapter": adapter, "adapter_version": "1", "contract": map[string]int{"major": major, "minor": 1},
				"capacity":    map[string]any{"free_slots": h.slots - len(h.live), "memory_available_bytes": 1 << 30},
				"instance_id": h.instance}, nil
		},
		contract.OpCreate: func(context.Context, *client.Invocation) (any, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			id := uuid.NewString()
			h.live[id] = true
			return map[string]any{"sandbox_id": id}, nil
		},
		contract.OpExec: func(_ context.Context, inv *client.Invocation) (any, error) {
			var req struct {
				SandboxID string `json:"sandbox_id"`
			}
			_ = json.Unmarshal(inv.Data, &req)
			h.mu.Lock()
			defer h.mu.Unlock()
			if !h.live[req.SandboxID] {
				return nil, contract.NewError(contract.S002, "%s has no sandbox %s", h.name, req.SandboxID).ErrorBody()
			}
			return map[string]any{"stdout": h.name, "exit_code": 0, "success": true}, nil
		},
		contract.OpList: func(context.Context, *client.Invocation) (any, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			out := []map[string]any{}
			for id := range h.live {
				out = append(out, map[string]any{"sandbox_id": id, "image": "python"})
			}
			return map[string]any{"sandboxes": out}, nil
		},
		contract.OpStop: func(_ context.Context, inv *client.Invocation) (any, error) {
			var req struct {
				SandboxID string `json:"sandbox_id"`
			}
			_ = json.Unmarshal(inv.Data, &req)
			h.mu.Lock()
			defer h.mu.Unlock()
			delete(h.live, req.SandboxID)
			return map[string]any{"stopped": true}, nil
		},
	}
	h.redial = func(t *testing.T) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		cl, err := client.Dial(ctx, te.URL, client.Options{Name: adapter + "-" + name, Namespace: ns, Token: cred,
			IgnoreEnv: true, ConfirmRegistration: true, Reconnect: client.ReconnectPolicy{Disable: true}})
		assert.NilError(t, err)
		h.cl = cl
		for op, fn := range handlers {
			_, err := cl.RegisterFunction(client.FunctionDef{ID: contract.HostFunctionID(adapter, registerAs, op)}, fn)
			assert.NilError(t, err)
		}
		// Every one of them: the map's order is random, and a call that
		// arrives between two registrations (adapter::info last, say)
		// meets a host that looks half there.
		for op := range handlers {
			waitRegistered(t, te, ns, contract.HostFunctionID(adapter, registerAs, op))
		}
	}
	h.redial(t)
	return h
}

func (h *fakeHost) close() error {
	if h.cl == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	return h.cl.Close(ctx)
}

// restart is the host's adapter process dying and a new one connecting:
// a new instance, no sandboxes.
func (h *fakeHost) restart(t *testing.T) {
	t.Helper()
	assert.NilError(t, h.close())
	h.mu.Lock()
	h.instance = uuid.NewString()
	h.live = map[string]bool{}
	h.mu.Unlock()
	h.redial(t)
}

func (h *fakeHost) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.live)
}

// TestFleet: creates spread over the hosts by free capacity, every call
// that names a sandbox reaches the host that made it, list merges them
// all; a host that goes away answers S301 naming it at once while the
// others go on and new creates avoid it; a credential for one host name
// cannot serve another's; a binding that names hosts uses only those.
func TestFleet(t *testing.T) {
	var mu sync.Mutex
	binding := Binding{Adapter: "fleet", Namespace: "sbx", Hosts: "*"}
	te := newEnv(t, func() (Binding, bool) {
		mu.Lock()
		defer mu.Unlock()
		return binding, true
	})
	hosts := map[string]*fakeHost{}
	for _, name := range []string{"h1", "h2", "h3"} {
		hosts[name] = startFakeHost(t, te, "fleet", "sbx", name, name, 10)
	}
	owner := map[string]string{}
	for range 12 {
		out := te.MustCall(t, "sandbox::create", map[string]any{"image": "python"})
		id := out["sandbox_id"].(string)
		res := te.MustCall(t, "sandbox::exec", map[string]any{"sandbox_id": id, "cmd": "true"})
		owner[id] = res["stdout"].(string)
	}
	for name, h := range hosts {
		assert.Check(t, is.Equal(h.count(), 4), "host %s", name)
	}
	// Every sandbox-naming call reaches its host, again and again.
	for id, host := range owner {
		res := te.MustCall(t, "sandbox::exec", map[string]any{"sandbox_id": id, "cmd": "true"})
		assert.Check(t, is.Equal(res["stdout"], host))
	}
	list := te.MustCall(t, "sandbox::list", map[string]any{})
	assert.Check(t, is.Len(list["sandboxes"].([]any), 12))

	// A router that never placed them (another engine, or a restart)
	// finds them through the hosts' lists.
	te.router.fleet.mu.Lock()
	te.router.fleet.owner = nil
	te.router.fleet.mu.Unlock()
	for id, host := range owner {
		res := te.MustCall(t, "sandbox::exec", map[string]any{"sandbox_id": id, "cmd": "true"})
		assert.Check(t, is.Equal(res["stdout"], host))
	}
	_, err := te.Call(t, "sandbox::exec", map[string]any{"sandbox_id": uuid.NewString(), "cmd": "true"})
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S002)

	// A host that lists another host's sandbox does not take it over.
	var h1Sandbox string
	for id, host := range owner {
		if host == "h1" {
			h1Sandbox = id
		}
	}
	hosts["h3"].mu.Lock()
	hosts["h3"].live[h1Sandbox] = true
	hosts["h3"].mu.Unlock()
	te.MustCall(t, "sandbox::list", map[string]any{})
	res := te.MustCall(t, "sandbox::exec", map[string]any{"sandbox_id": h1Sandbox, "cmd": "true"})
	assert.Check(t, is.Equal(res["stdout"], "h1"), "h3 took over h1's sandbox")
	hosts["h3"].mu.Lock()
	delete(hosts["h3"].live, h1Sandbox)
	hosts["h3"].mu.Unlock()

	// A sandbox that ends on its own is forgotten: S002, nothing kept.
	hosts["h1"].mu.Lock()
	delete(hosts["h1"].live, h1Sandbox)
	hosts["h1"].mu.Unlock()
	_, err = te.Call(t, "sandbox::exec", map[string]any{"sandbox_id": h1Sandbox, "cmd": "true"})
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S002)
	te.router.fleet.mu.Lock()
	_, kept := te.router.fleet.owner[h1Sandbox]
	te.router.fleet.mu.Unlock()
	assert.Check(t, !kept, "the router still remembers an ended sandbox")
	delete(owner, h1Sandbox)
	hosts["h1"].mu.Lock()
	hosts["h1"].live[uuid.NewString()] = true // keep h1 at four
	hosts["h1"].mu.Unlock()

	// h2 goes away: its sandboxes answer S301 naming it, at once.
	assert.NilError(t, hosts["h2"].close())
	var h2Sandbox string
	for id, host := range owner {
		if host == "h2" {
			h2Sandbox = id
		}
	}
	waitGone(t, te, "sbx", contract.HostFunctionID("fleet", "h2", contract.OpExec))
	_, err = te.Call(t, "sandbox::exec", map[string]any{"sandbox_id": h2Sandbox, "cmd": "true"})
	se := enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S301)
	assert.Check(t, is.Contains(se.Message, `sandbox host "h2"`))
	for id, host := range owner {
		if host != "h2" {
			res := te.MustCall(t, "sandbox::exec", map[string]any{"sandbox_id": id, "cmd": "true"})
			assert.Check(t, is.Equal(res["stdout"], host))
		}
	}
	for range 4 {
		out := te.MustCall(t, "sandbox::create", map[string]any{"image": "python"})
		res := te.MustCall(t, "sandbox::exec", map[string]any{"sandbox_id": out["sandbox_id"], "cmd": "true"})
		assert.Check(t, res["stdout"] != "h2")
	}
	assert.Check(t, is.Equal(hosts["h1"].count()+hosts["h3"].count(), 12))

	// A host credential for h9 cannot register h2's functions: the
	// engine refuses them, so h2's sandboxes stay S301 and no create goes
	// to the impostor.
	cred := issueCredential(t, te, map[string]any{"label": "hosts/h9", "namespace": "sbx",
		"sandbox_host": map[string]any{"adapter": "fleet", "host_name": "h9"}})
	ictx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	refused := make(chan error, 1)
	impostor, err := client.Dial(ictx, te.URL, client.Options{Name: "fleet-h9", Namespace: "sbx", Token: cred,
		IgnoreEnv: true, ConfirmRegistration: true, Reconnect: client.ReconnectPolicy{Disable: true},
		OnRegistrationError: func(err error) { refused <- err }})
	assert.NilError(t, err)
	t.Cleanup(func() { _ = impostor.Close(context.Background()) })
	_, err = impostor.RegisterFunction(client.FunctionDef{ID: contract.HostFunctionID("fleet", "h2", contract.OpCreate)},
		func(context.Context, *client.Invocation) (any, error) {
			return map[string]any{"sandbox_id": "stolen"}, nil
		})
	assert.NilError(t, err)
	select {
	case err := <-refused:
		assert.Equal(t, client.CodeOf(err), "FORBIDDEN", "%v", err)
	case <-ictx.Done():
		t.Fatal("the engine did not refuse h9's registration of h2's create")
	}
	_, err = te.Call(t, "sandbox::exec", map[string]any{"sandbox_id": h2Sandbox, "cmd": "true"})
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S301)
	before := hosts["h1"].count() + hosts["h3"].count()
	te.MustCall(t, "sandbox::create", map[string]any{"image": "python"})
	assert.Check(t, is.Equal(hosts["h1"].count()+hosts["h3"].count(), before+1), "a create went to the impostor")

	// Capacity: a full host gets no creates while another has room.
	full := hosts["h1"].count()
	hosts["h1"].mu.Lock()
	hosts["h1"].slots = full
	hosts["h1"].mu.Unlock()
	time.Sleep(infoMaxAge) // the router reuses capacity for infoMaxAge
	n1 := hosts["h1"].count()
	for range 3 {
		te.MustCall(t, "sandbox::create", map[string]any{"image": "python"})
	}
	assert.Check(t, is.Equal(hosts["h1"].count(), n1))

	// A binding that names hosts uses only those; none connected is S301.
	mu.Lock()
	binding.Hosts = "h3"
	mu.Unlock()
	n3 := hosts["h3"].count()
	te.MustCall(t, "sandbox::create", map[string]any{"image": "python"})
	assert.Check(t, is.Equal(hosts["h3"].count(), n3+1))
	mu.Lock()
	binding.Hosts = "h7"
	mu.Unlock()
	_, err = te.Call(t, "sandbox::create", map[string]any{"image": "python"})
	se = enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S301)
	assert.Check(t, is.Contains(se.Message, "no sandbox host"))
	// The hint starts a host the fleet uses: --fleet, this engine's url.
	assert.Check(t, is.Contains(se.Message, "fleet serve --engine "+te.URL+" --credential-file <file> --host-name <name> --fleet"))
}

// TestFleetHostOtherMajor: a host that speaks another contract major is
// refused with S302, as a single WebSocket adapter is.
func TestFleetHostOtherMajor(t *testing.T) {
	te := newEnv(t, func() (Binding, bool) { return Binding{Adapter: "fleet", Namespace: "sbx", Hosts: "*"}, true })
	h := startFakeHostMajor(t, te, "fleet", "sbx", "old", "old", 10, contract.Major+1)
	_, err := te.Call(t, "sandbox::create", map[string]any{"image": "python"})
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S302)
	assert.Equal(t, h.count(), 0, "a create reached the host")
}

// TestFleetHostRestart: every sandbox::list entry names its host
// (host_name); after a host's adapter process restarts (a new instance
// id in adapter::info, its sandboxes gone) an old sandbox id answers S002
// saying the host restarted and the sandbox was lost with it, whether the
// router still remembered the sandbox or had dropped it on a list since;
// an id no host ever had is the plain S002; a host that only reconnected
// (the same instance) keeps its sandboxes.
func TestFleetHostRestart(t *testing.T) {
	te := newEnv(t, func() (Binding, bool) { return Binding{Adapter: "fleet", Namespace: "sbx", Hosts: "*"}, true })
	h1 := startFakeHost(t, te, "fleet", "sbx", "h1", "h1", 10)
	h2 := startFakeHost(t, te, "fleet", "sbx", "h2", "h2", 10)
	created := map[string]bool{}
	for range 4 {
		out := te.MustCall(t, "sandbox::create", map[string]any{"image": "python"})
		created[out["sandbox_id"].(string)] = true
	}
	holder := func(id string) *fakeHost {
		for _, h := range []*fakeHost{h1, h2} {
			h.mu.Lock()
			ok := h.live[id]
			h.mu.Unlock()
			if ok {
				return h
			}
		}
		return nil
	}

	// list: every entry carries the host that holds it.
	list := te.MustCall(t, "sandbox::list", map[string]any{})
	entries := list["sandboxes"].([]any)
	assert.Assert(t, is.Len(entries, 4))
	for _, e := range entries {
		m := e.(map[string]any)
		id := m["sandbox_id"].(string)
		assert.Check(t, created[id])
		assert.Check(t, holder(id) != nil)
		assert.Check(t, is.Equal(m["host_name"], holder(id).name), "entry %v", m)
	}

	var onH1 []string
	for id := range created {
		if holder(id) == h1 {
			onH1 = append(onH1, id)
		}
	}
	// Two hosts with equal room: placement alternates, two each.
	assert.Assert(t, len(onH1) >= 2, "h1 holds %d of 4 sandboxes", len(onH1))

	// A reconnect of the same process: its sandboxes answer as before.
	assert.NilError(t, h1.close())
	h1.redial(t)
	te.MustCall(t, "sandbox::exec", map[string]any{"sandbox_id": onH1[0], "cmd": "true"})

	// The adapter process restarts: the remembered sandbox is lost with it.
	h1.restart(t)
	_, err := te.Call(t, "sandbox::exec", map[string]any{"sandbox_id": onH1[0], "cmd": "true"})
	se := enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S002)
	assert.Check(t, is.Contains(se.Message, `sandbox host "h1" of adapter "fleet", whose adapter process restarted`))
	assert.Check(t, is.Contains(se.Message, "lost with the old process"))
	assert.Check(t, is.Contains(se.Message, "docs/scale-out.md"))
	assert.Check(t, !strings.Contains(se.Message, "never created"))
	assert.Check(t, is.Contains(se.FixNote, "sandbox::create"))
	// Asked again (the router forgot where it was): still explained.
	_, err = te.Call(t, "sandbox::exec", map[string]any{"sandbox_id": onH1[0], "cmd": "true"})
	assert.Check(t, is.Contains(enginetest.SandboxError(t, err).Message, "restarted"))

	// The other: a list first drops it from the router's memory of where
	// sandboxes live; the call after still says why it is gone.
	list = te.MustCall(t, "sandbox::list", map[string]any{})
	for _, e := range list["sandboxes"].([]any) {
		assert.Check(t, e.(map[string]any)["sandbox_id"] != onH1[1])
		assert.Check(t, is.Equal(e.(map[string]any)["host_name"], "h2"))
	}
	_, err = te.Call(t, "sandbox::fs::ls", map[string]any{"sandbox_id": onH1[1], "path": "/"})
	se = enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S002)
	assert.Check(t, is.Contains(se.Message, `sandbox host "h1"`))
	assert.Check(t, is.Contains(se.Message, "restarted"))

	// h2's sandboxes are untouched, and an id nobody had is plain S002.
	for id := range created {
		if holder(id) == h2 {
			te.MustCall(t, "sandbox::exec", map[string]any{"sandbox_id": id, "cmd": "true"})
		}
	}
	_, err = te.Call(t, "sandbox::exec", map[string]any{"sandbox_id": uuid.NewString(), "cmd": "true"})
	se = enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S002)
	assert.Check(t, is.Contains(se.Message, "is not on any connected host"))
}

// TestLostSandboxesBounded: the memory of sandboxes lost to host restarts
// never holds more than lostMax ids, oldest forgotten first, and an id
// seen live again is no longer reported lost.
func TestLostSandboxesBounded(t *testing.T) {
	var l lostSandboxes
	for i := range lostMax + 100 {
		l.add(fmt.Sprint("sb-", i), "h1")
	}
	assert.Check(t, is.Len(l.host, lostMax))
	assert.Check(t, len(l.order) <= lostMax)
	_, ok := l.get("sb-0")
	assert.Check(t, !ok, "the oldest is forgotten")
	h, ok := l.get(fmt.Sprint("sb-", lostMax+99))
	assert.Check(t, ok && h == "h1")
	l.remove(fmt.Sprint("sb-", lostMax+99))
	_, ok = l.get(fmt.Sprint("sb-", lostMax+99))
	assert.Check(t, !ok)
	// Adding again after removals still respects the bound.
	for i := range 2 * lostMax {
		l.add(fmt.Sprint("again-", i), "h2")
	}
	assert.Check(t, len(l.host) <= lostMax && len(l.order) <= lostMax)
}
