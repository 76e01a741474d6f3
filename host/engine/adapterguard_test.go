package engine

import (
	"context"
	"encoding/json"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/protocol"
)

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

// Names under an adapter's prefix are registered only by its trusted
// owner: <a>::worker::* and <a>::host::* whatever a, every <a>::* once a
// is a known adapter; others get FORBIDDEN and nothing is registered.
func TestAdapterNamesOnlyTheirOwner(t *testing.T) {
	te := startEngine(t, Options{})
	admin := te.dialAdmin(t)
	te.ProtectAdapter("hostdir")
	assert.Check(t, is.DeepEqual(te.KnownAdapters(), []string{"hostdir"}))
	plain := issue(t, admin, "1", `{"label":"compose/p/w","namespace":"p","allow":{"default":["*"]}}`)
	hostTok := issue(t, admin, "2", `{"label":"hosts/h1","namespace":"p","sandbox_host":{"adapter":"hostdir","host_name":"h1"}}`)

	ids := []string{"sandbox-libkrun::worker::start", "sandbox-libkrun::host::h1::create", "hostdir::create", "hostdir::adapter::info",
		"hostdir::worker::start", "hostdirx::create", "orders::create", "hostdir"}
	squat := []string{"sandbox-libkrun::worker::start", "sandbox-libkrun::host::h1::create", "hostdir::create", "hostdir::adapter::info", "hostdir::worker::start"}

	t.Run("anonymous", func(t *testing.T) {
		anon := te.dial(t)
		assert.DeepEqual(t, rejectedIDs(t, anon, "p", "squatter", ids...), squat)
		for _, id := range squat {
			assert.Check(t, !hasFn(te, "p", id), id)
		}
		assert.Check(t, hasFn(te, "p", "hostdirx::create"))
	})
	t.Run("a VM worker's credential", func(t *testing.T) {
		vm := te.dialWith(t, bearerHeader(plain))
		assert.DeepEqual(t, rejectedIDs(t, vm, "p", "vm", "hostdir::create", "sandbox-libkrun::worker::start", "vm::ok"),
			[]string{"hostdir::create", "sandbox-libkrun::worker::start"})
	})
	t.Run("the adapter's sandbox host credential", func(t *testing.T) {
		h := te.dialWith(t, bearerHeader(hostTok))
		assert.DeepEqual(t, rejectedIDs(t, h, "p", "hostdir-h1", "hostdir::create", "hostdir::adapter::info", "hostdir::worker::start", "sandbox-libkrun::worker::start"),
			[]string{"sandbox-libkrun::worker::start"})
		assert.Check(t, te.AdapterOwnerOf("p", "hostdir", "hostdir::create").Trusted)
		// Its operations on sandboxes are privileged, as the plugin
		// host's: a credential of the namespace cannot call them past the
		// router's tenancy (adapter::info stays open).
		vm := te.dialWith(t, bearerHeader(plain))
		code, _ := errBody(t, vm.call("c1", "hostdir::create", ptr("p"), `{}`))
		assert.Equal(t, code, CodeUnauthorized)
		priv, ok := te.FunctionPrivileged("p", "hostdir::adapter::info")
		assert.Check(t, ok && !priv)
	})
	t.Run("the engine token", func(t *testing.T) {
		assert.DeepEqual(t, rejectedIDs(t, admin, "q", "admin-adapter", "hostdir::create", "sandbox-libkrun::worker::start"), []string(nil))
	})
}

// A worker that registered an adapter's names before the adapter became
// known loses them when it does (told with registrationrejected), and its
// worker name too, so the adapter starts in that namespace.
func TestAdapterSquatterEvicted(t *testing.T) {
	te := startEngine(t, Options{})
	anon := te.dial(t)
	assert.DeepEqual(t, rejectedIDs(t, anon, "p", "late", "late::create", "late::exec"), []string(nil))
	assert.Assert(t, hasFn(te, "p", "late::create"))

	te.ProtectAdapter("late")
	got := map[string]bool{}
	for range 2 {
		f := anon.expect("registrationrejected")
		assert.Equal(t, f.str("code"), CodeForbidden)
		got[f.str("function_id")] = true
	}
	assert.DeepEqual(t, got, map[string]bool{"late::create": true, "late::exec": true})
	assert.Check(t, !hasFn(te, "p", "late::create"))
	assert.Check(t, !te.AdapterOwnerOf("p", "late", "late::create").Registered)

	// The adapter, in-process as the plugin host runs it, takes its name
	// and functions in that namespace.
	lw, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "late", Namespace: "p"})
	assert.NilError(t, err)
	assert.NilError(t, lw.RegisterFunction(FunctionDef{ID: "late::create"}, func(context.Context, *Call) (json.RawMessage, error) {
		return json.RawMessage(`{"sandbox_id":"s1"}`), nil
	}))
	o := te.AdapterOwnerOf("p", "late", "late::create")
	assert.Check(t, o.Registered && o.Trusted)
	// And the squatter cannot take them back.
	anon.send(&protocol.RegisterFunction{ID: "late::create"})
	f := anon.expect("registrationrejected")
	assert.Equal(t, f.str("code"), CodeForbidden)
	assert.Equal(t, f.str("function_id"), "late::create")
	admin := te.dialAdmin(t)
	f = admin.call("1", "late::create", ptr("p"), `{}`)
	assert.Equal(t, f.obj("result").str("sandbox_id"), "s1")
}
