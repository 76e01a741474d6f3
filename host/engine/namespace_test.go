package engine

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// hasFn reports whether (ns, id) is registered, through the public surface.
func hasFn(te *testEngine, ns, id string) bool {
	_, err := te.Invoke(context.Background(), DefaultNamespace, FnFunctionsInfo, mustJSONNoT(map[string]any{"function_id": id, "namespace": ns}))
	return err == nil
}

func mustJSONNoT(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

func TestNamespaceBuffering(t *testing.T) {
	// A long grace: only engine::workers::register may resolve it here.
	te := startEngine(t, Options{NamespaceGrace: time.Hour})
	w := te.dial(t)

	// FIFO: register f, withdraw it, register g, register a service.
	w.send(&protocol.RegisterFunction{ID: "f"})
	w.send(&protocol.UnregisterFunction{ID: "f"})
	w.send(&protocol.RegisterFunction{ID: "g"})
	w.send(&protocol.RegisterService{ID: "svc", Name: "svc"})
	w.sync()
	assert.Assert(t, !hasFn(te, DefaultNamespace, "g"), "registrations wait for the namespace")

	w.register(map[string]any{"name": "buf", "namespace": "orders"})
	// Arrives after the namespace is fixed: applied in the same namespace.
	w.send(&protocol.RegisterFunction{ID: "h"})
	w.sync()

	assert.Assert(t, !hasFn(te, "orders", "f"))
	assert.Assert(t, hasFn(te, "orders", "g"))
	assert.Assert(t, hasFn(te, "orders", "h"))
	assert.Assert(t, !hasFn(te, DefaultNamespace, "g"))
	wk := te.lookupWorker(w.workerID)
	wk.mu.Lock()
	_, svc := wk.services["svc"]
	wk.mu.Unlock()
	assert.Assert(t, svc, "registerservice is applied after the drain too")
}

func TestNamespaceDrainKeepsLateArrivalsInOrder(t *testing.T) {
	te := startEngine(t, Options{NamespaceGrace: time.Hour})
	w := te.dial(t)
	wk := te.lookupWorker(w.workerID)
	for i := range 50 {
		wk.submit(&protocol.RegisterFunction{ID: "f" + itoa(i)})
	}
	// Drain on one goroutine while more frames arrive on another: the late
	// ones go to the back of the queue, so the final state reflects the
	// worker's order (register then unregister = absent).
	done := make(chan struct{})
	go func() {
		defer close(done)
		wk.pinNamespace("late")
	}()
	for i := range 50 {
		wk.submit(&protocol.UnregisterFunction{ID: "f" + itoa(i)})
		wk.submit(&protocol.RegisterFunction{ID: "g" + itoa(i)})
	}
	waitfor.Closed(t, done, waitFor, "pinNamespace to return")
	for i := range 50 {
		assert.Assert(t, !hasFn(te, "late", "f"+itoa(i)), "f%d", i)
		assert.Assert(t, hasFn(te, "late", "g"+itoa(i)), "g%d", i)
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestNamespaceGraceTimeout(t *testing.T) {
	te := startEngine(t, Options{NamespaceGrace: 20 * time.Millisecond})
	w := te.dial(t)
	w.send(&protocol.RegisterFunction{ID: "quiet::fn"})
	// The worker never calls engine::workers::register: after the grace time
	// its registrations land in default.
	pollUntil(t, "function registered after grace", func() bool { return hasFn(te, DefaultNamespace, "quiet::fn") })

	// A late register cannot move it any more.
	w.register(map[string]any{"name": "late", "namespace": "orders"})
	w.sync()
	assert.Equal(t, te.lookupWorker(w.workerID).ns(), DefaultNamespace)
}

func TestNamespaceFirstWriterWins(t *testing.T) {
	te := startEngine(t, Options{NamespaceGrace: time.Hour})
	w := te.dial(t)
	w.send(&protocol.RegisterFunction{ID: "fw"})
	// As the Node SDK does: the user's register (with namespace) first, then
	// the SDK's own (without one).
	w.register(map[string]any{"name": "first", "namespace": "alpha"})
	w.register(map[string]any{"name": "first", "runtime": "node", "version": "0.22.1"})
	w.register(map[string]any{"name": "first", "namespace": "beta"})
	w.sync()
	assert.Assert(t, hasFn(te, "alpha", "fw"))
	assert.Assert(t, !hasFn(te, "beta", "fw"))
	s := te.lookupWorker(w.workerID).summary()
	assert.Equal(t, s.Namespace, "alpha")
	assert.Equal(t, *s.Runtime, "node", "metadata of later registers is still recorded")
}

func TestRegisterInvalidNamespace(t *testing.T) {
	te := startEngine(t, Options{NamespaceGrace: time.Hour})
	w := te.dial(t)
	for _, ns := range []string{"", "   ", "Orders", "a.b", "ns/1", "é"} {
		res := w.call("ns-"+ns, FnWorkersRegister, nil, string(mustJSON(t, map[string]any{"name": "x", "namespace": ns})))
		code, _ := errBody(t, res)
		assert.Equal(t, code, protocol.CodeInvalidNamespace, "namespace %q", ns)
	}
	// Nothing was fixed by the refused attempts.
	res := w.call("ok", FnWorkersRegister, nil, `{"name":"x","namespace":"good-ns_1"}`)
	assert.DeepEqual(t, res.obj("result"), frame{"success": true})
	assert.Equal(t, te.lookupWorker(w.workerID).ns(), "good-ns_1")
}

// TestWorkerNameAfterQuickRestart: a worker that closes its connection and
// registers its name again at once (a restarted adapter, a fleet host's
// reconnect) is never refused by its own old connection, even when the
// engine reads the new registration before the old connection's close
// (nameConflictGrace). A live holder is still refused to newcomers
// (TestWorkerNameLease).
func TestWorkerNameAfterQuickRestart(t *testing.T) {
	te := startEngine(t, Options{})
	for i := range 20 {
		old := te.dial(t)
		old.registerIn("", "svc")
		closed := make(chan error, 1)
		go func() { closed <- old.c.Close(websocket.StatusNormalClosure, "restarting") }()
		again := te.dial(t)
		res := again.call("r", FnWorkersRegister, nil, `{"name":"svc"}`)
		assert.Assert(t, res["error"] == nil, "round %d: the restarted worker was refused its own name: %v", i, res)
		assert.DeepEqual(t, res.obj("result"), frame{"success": true})
		<-closed
		assert.NilError(t, again.c.Close(websocket.StatusNormalClosure, "next round"))
	}
}

func TestWorkerNameLease(t *testing.T) {
	te := startEngine(t, Options{})
	first := te.dial(t)
	first.registerIn("", "billing", "b::one")

	second := te.dial(t)
	second.send(&protocol.RegisterFunction{ID: "b::two"})
	second.register(map[string]any{"name": "billing"})
	rej := second.expect("registrationrejected")
	assert.Equal(t, rej.str("code"), protocol.CodeWorkerNamespaceConflict)
	assert.Equal(t, rej.str("namespace"), DefaultNamespace)
	assert.Equal(t, rej.str("worker_name"), "billing")
	assert.Equal(t, rej.str("owner_worker_id"), first.workerID)
	err := second.waitClosed()
	assert.Equal(t, websocket.CloseStatus(err), websocket.StatusPolicyViolation)
	assert.Assert(t, !hasFn(te, DefaultNamespace, "b::two"), "a rejected worker's registrations are not applied")
	first.sync() // the holder is unaffected

	// The same name in another namespace is a different identity.
	other := te.dial(t)
	other.registerIn("orders", "billing")
	other.sync()

	// Once the holder is gone, the name is free.
	assert.NilError(t, first.c.CloseNow())
	third := te.dial(t)
	pollUntil(t, "name lease released", func() bool {
		te.namesMu.Lock()
		_, taken := te.names[nameKey{DefaultNamespace, "billing"}]
		te.namesMu.Unlock()
		return !taken
	})
	third.registerIn("", "billing")
	third.sync()
}

func TestTearingDownHolderNeverBlocks(t *testing.T) {
	te := startEngine(t, Options{})
	first := te.dial(t)
	first.registerIn("", "svc", "svc::f")
	old := te.lookupWorker(first.workerID)
	// Mark it as tearing down (the first step of teardown) without letting
	// the teardown finish: its leases must not block a fast restart.
	old.closing.Store(true)

	second := te.dial(t)
	second.registerIn("", "svc", "svc::f")
	second.sync()
	f := te.reg.get(DefaultNamespace, "svc::f")
	assert.Equal(t, f.owner.id, second.workerID)
	old.closing.Store(false)
	old.teardown()
	f = te.reg.get(DefaultNamespace, "svc::f")
	assert.Assert(t, f != nil && f.owner.id == second.workerID, "the old owner's teardown leaves the new lease alone")
}

func TestFunctionLease(t *testing.T) {
	te := startEngine(t, Options{})
	first := te.dial(t)
	first.registerIn("", "a", "state::get")
	second := te.dial(t)
	second.send(&protocol.RegisterFunction{ID: "state::get"})
	second.send(&protocol.RegisterFunction{ID: "state::set"})
	second.register(map[string]any{"name": "b"})
	rej := second.expect("registrationrejected")
	assert.Equal(t, rej.str("code"), protocol.CodeFuncNamespaceConflict)
	assert.Equal(t, rej.str("function_id"), "state::get")
	assert.Equal(t, rej.str("namespace"), DefaultNamespace)
	assert.Equal(t, rej.str("owner_worker_id"), first.workerID)
	second.sync() // only that function was refused; the connection stays
	assert.Assert(t, hasFn(te, DefaultNamespace, "state::set"))
	assert.Equal(t, te.reg.get(DefaultNamespace, "state::get").owner.id, first.workerID)

	// The owner may re-register (replace) its own function.
	first.send(&protocol.RegisterFunction{ID: "state::get", Description: "v2"})
	first.sync()
	assert.Equal(t, te.reg.get(DefaultNamespace, "state::get").description, "v2")

	// Another namespace has its own lease.
	third := te.dial(t)
	third.registerIn("orders", "a", "state::get")
	third.sync()
	assert.Assert(t, hasFn(te, "orders", "state::get"))

	// Unregistering someone else's function does nothing.
	second.send(&protocol.UnregisterFunction{ID: "state::get"})
	second.sync()
	assert.Assert(t, hasFn(te, DefaultNamespace, "state::get"))
}

func TestEngineIDsReservedToDefault(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	w.send(&protocol.RegisterFunction{ID: "engine::mine"})
	w.send(&protocol.RegisterFunction{ID: "ok::fn"})
	w.register(map[string]any{"name": "ns-worker", "namespace": "orders"})
	rej := w.expect("registrationrejected")
	assert.Equal(t, rej.str("code"), protocol.CodeFuncNamespaceConflict)
	assert.Equal(t, rej.str("function_id"), "engine::mine")
	assert.Equal(t, rej.str("namespace"), "orders")
	v, present := rej["owner_worker_id"]
	assert.Assert(t, present && v == "", "owner_worker_id is present and empty: %v", rej)
	w.sync() // non-fatal
	assert.Assert(t, hasFn(te, "orders", "ok::fn"))

	// In default an engine:: id is, for the token's holder, a lease like
	// any other: the builtins hold theirs.
	d := te.dialAdmin(t)
	d.send(&protocol.RegisterFunction{ID: FnFunctionsList})
	d.register(map[string]any{"name": "d"})
	rej = d.expect("registrationrejected")
	assert.Equal(t, rej.str("owner_worker_id"), te.builtins.ID())

	// Anyone else may not register one at all.
	a := te.dial(t)
	a.send(&protocol.RegisterFunction{ID: "engine::mine"})
	a.register(map[string]any{"name": "a"})
	rej = a.expect("registrationrejected")
	assert.Equal(t, rej.str("code"), CodeForbidden)
	assert.Assert(t, !hasFn(te, DefaultNamespace, "engine::mine"))
}

func TestReattach(t *testing.T) {
	te := startEngine(t, Options{})

	t.Run("right token evicts the previous connection", func(t *testing.T) {
		old := te.dial(t)
		old.registerIn("", "reattacher", "ra::f")

		fresh := te.dial(t)
		fresh.send(&protocol.Reattach{PreviousWorkerID: old.workerID, ReattachToken: old.token})
		// Resent registrations, as SDKs do after reattach: no conflict,
		// because the eviction finished before they were handled.
		fresh.registerIn("", "reattacher", "ra::f")
		fresh.sync()
		assert.Assert(t, old.waitClosed() != nil)
		assert.Equal(t, te.reg.get(DefaultNamespace, "ra::f").owner.id, fresh.workerID)
		assert.Assert(t, te.lookupWorker(old.workerID) == nil)
	})

	t.Run("wrong or missing token is ignored", func(t *testing.T) {
		old := te.dial(t)
		old.registerIn("", "keeper", "keep::f")
		for i, tok := range []string{"", "not-the-token", old.workerID} {
			intruder := te.dial(t)
			intruder.send(&protocol.Reattach{PreviousWorkerID: old.workerID, ReattachToken: tok})
			intruder.send(&protocol.RegisterFunction{ID: "keep::f"})
			intruder.register(map[string]any{"name": "intruder-" + itoa(i)})
			rej := intruder.expect("registrationrejected")
			assert.Equal(t, rej.str("owner_worker_id"), old.workerID)
			old.sync()
		}
	})
}

func TestWorkersRegisterMetadata(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	res := w.call("m1", FnWorkersRegister, nil, `{"name":"meta\u0007-w","runtime":"node","version":"1.2.3","description":"does things\u202e","os":"linux","pid":4242,"isolation":null,"telemetry":{"language":"en"}}`)
	assert.DeepEqual(t, res.obj("result"), frame{"success": true})
	wk := te.lookupWorker(w.workerID)
	wk.mu.Lock()
	meta := wk.meta
	wk.mu.Unlock()
	assert.Equal(t, meta.Name, "meta-w", "control characters are stripped")
	assert.Equal(t, meta.Description, "does things", "bidi overrides are stripped")
	assert.Equal(t, meta.Runtime, "node")
	assert.Equal(t, *meta.PID, 4242)
	assert.Check(t, is.Equal(string(meta.Telemetry), `{"language":"en"}`))
}
