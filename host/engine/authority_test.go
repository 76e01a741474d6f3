package engine

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/rbac"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// Authority when a call runs: what the engine calls on someone's behalf
// runs as that someone, checked when it runs (authority.go).

// authorityEngine is an engine whose warnings are kept for the test.
func authorityEngine(t *testing.T) (*testEngine, *syncbuf.Buffer) {
	t.Helper()
	logs := &syncbuf.Buffer{}
	te := startEngine(t, Options{Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Warn})})
	return te, logs
}

// ops is an admin worker serving ops::wipe (privileged) and ops::log
// (open); calls reports each function id it is called with.
type ops struct {
	rc    *rawClient
	calls chan string
}

func startOps(t *testing.T, te *testEngine, privileged ...string) *ops {
	t.Helper()
	rc := te.dialAdmin(t)
	for _, id := range []string{"ops::wipe", "ops::log"} {
		m := &protocol.RegisterFunction{ID: id}
		for _, p := range privileged {
			if p == id {
				m.Metadata = json.RawMessage(`{"privileged":true}`)
			}
		}
		rc.send(m)
	}
	rc.registerIn("", "ops")
	o := &ops{rc: rc, calls: make(chan string, 64)}
	go func() {
		for {
			var m inbound
			select {
			case m = <-rc.in:
			case <-rc.closed:
				return
			}
			if m.f.typ() != "invokefunction" {
				continue
			}
			o.calls <- m.f.str("function_id")
			if id := m.f.str("invocation_id"); id != "" {
				b := appendResultFrame(nil, id, m.f.str("function_id"), json.RawMessage(`{"ran":true}`), nil, "", "")
				_ = rc.c.Write(context.Background(), websocket.MessageText, b)
			}
		}
	}()
	return o
}

// next is the next function ops was called with.
func (o *ops) next(t *testing.T) string {
	t.Helper()
	select {
	case id := <-o.calls:
		return id
	case <-o.rc.closed:
		t.Fatal("ops worker closed")
	case <-time.After(waitFor):
		t.Fatal("ops was not called")
	}
	return ""
}

// none asserts ops has not been called (after the control call proved the
// path delivers).
func (o *ops) none(t *testing.T) {
	t.Helper()
	select {
	case id := <-o.calls:
		t.Fatalf("ops was called: %s", id)
	default:
	}
}

// localProvider is an in-process trigger type that keeps its bindings.
type localProvider struct {
	mu sync.Mutex
	b  map[string]TriggerBinding
}

func (p *localProvider) RegisterTrigger(b TriggerBinding) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.b[b.ID] = b
	return nil
}

func (p *localProvider) UnregisterTrigger(b TriggerBinding) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.b, b.ID)
}

func (p *localProvider) get(id string) (TriggerBinding, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.b[id]
	return b, ok
}

func startLocalProvider(t *testing.T, te *testEngine, typ string) *localProvider {
	t.Helper()
	lw, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "provider-" + typ})
	assert.NilError(t, err)
	p := &localProvider{b: map[string]TriggerBinding{}}
	assert.NilError(t, lw.RegisterTriggerType(typ, "test", p))
	return p
}

func (p *localProvider) binding(t *testing.T, id string) TriggerBinding {
	t.Helper()
	pollUntil(t, "binding "+id+" handed to the provider", func() bool { _, ok := p.get(id); return ok })
	b, _ := p.get(id)
	return b
}

func fire(te *testEngine, b TriggerBinding, cond string) error {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	return te.Fire(ctx, b, cond, json.RawMessage(`{"payload":"attacker"}`))
}

func codeOf(err error) string {
	var eb *protocol.ErrorBody
	if errors.As(err, &eb) {
		return eb.Code
	}
	return ""
}

// TestAuthorityInProcessTrigger is the issue's case on an in-process
// provider (as iii-stream's and configuration's): an anonymous worker binds
// a trigger to ops::wipe before it exists; an admin then registers it
// privileged. Firing runs as the anonymous registrant: refused, logged
// with who set it up, and ops::wipe never runs; its open control does.
func TestAuthorityInProcessTrigger(t *testing.T) {
	te, logs := authorityEngine(t)
	p := startLocalProvider(t, te, "local-x")
	attacker := te.dial(t)
	attacker.registerIn("", "attacker")
	attacker.send(&protocol.RegisterTrigger{ID: "evil", TriggerType: "local-x", FunctionID: "ops::wipe"})
	attacker.send(&protocol.RegisterTrigger{ID: "control", TriggerType: "local-x", FunctionID: "ops::log"})
	attacker.send(&protocol.RegisterTrigger{ID: "evil-cond", TriggerType: "local-x", FunctionID: "ops::log",
		Config: json.RawMessage(`{"condition_function_id":"ops::wipe"}`)})
	attacker.sync()
	o := startOps(t, te, "ops::wipe")

	assert.NilError(t, fire(te, p.binding(t, "control"), ""))
	assert.Equal(t, o.next(t), "ops::log")

	err := fire(te, p.binding(t, "evil"), "")
	assert.Equal(t, codeOf(err), CodeUnauthorized, "%v", err)
	log := logs.String()
	assert.Check(t, is.Contains(log, "refused"))
	assert.Check(t, is.Contains(log, "trigger_id=evil"))
	assert.Check(t, is.Contains(log, "principal=anonymous"))
	assert.Check(t, is.Contains(log, "worker_id="+attacker.workerID))

	// The condition runs as the registrant too: refused, so neither it nor
	// the target runs.
	err = fire(te, p.binding(t, "evil-cond"), "ops::wipe")
	var ce *ConditionError
	assert.Assert(t, errors.As(err, &ce), "%v", err)
	assert.Equal(t, codeOf(err), CodeUnauthorized)

	// A control through the same path afterwards proves nothing was in
	// flight to ops in between.
	assert.NilError(t, fire(te, p.binding(t, "control"), ""))
	assert.Equal(t, o.next(t), "ops::log")
	o.none(t)

	// The attacker's direct call answers the same.
	code, _ := errBody(t, attacker.call("d1", "ops::wipe", nil, `{}`))
	assert.Equal(t, code, CodeUnauthorized)
}

// TestAuthorityAdminTriggerKeepsRights: a binding the engine token's
// holder registers, or an in-process worker's, runs with admin rights.
func TestAuthorityAdminTriggerKeepsRights(t *testing.T) {
	te, _ := authorityEngine(t)
	p := startLocalProvider(t, te, "local-x")
	o := startOps(t, te, "ops::wipe")
	admin := te.dialAdmin(t)
	admin.registerIn("", "admin")
	admin.send(&protocol.RegisterTrigger{ID: "ok", TriggerType: "local-x", FunctionID: "ops::wipe",
		Config: json.RawMessage(`{"condition_function_id":"ops::wipe"}`)})
	admin.sync()
	b := p.binding(t, "ok")
	assert.Assert(t, b.RegistrantAdmin && b.Caller().Admin())
	assert.NilError(t, fire(te, b, "ops::wipe"))
	assert.Equal(t, o.next(t), "ops::wipe")
	assert.Equal(t, o.next(t), "ops::wipe")
}

// TestAuthorityNoPrincipal: a binding the engine did not hand over (a
// provider's own literal) carries no principal and fires nothing.
func TestAuthorityNoPrincipal(t *testing.T) {
	te, logs := authorityEngine(t)
	o := startOps(t, te)
	err := fire(te, TriggerBinding{ID: "forged", FunctionID: "ops::log", Namespace: DefaultNamespace}, "")
	assert.Equal(t, codeOf(err), CodeForbidden, "%v", err)
	assert.Check(t, is.Contains(logs.String(), "principal=none"))
	_, err = te.InvokeAs(context.Background(), Caller{}, "", "ops::log", nil, nil)
	assert.Equal(t, codeOf(err), CodeForbidden)
	o.none(t)
}

// TestAuthorityTriggerIDNotUpgradeable: another worker cannot take over
// an admin's trigger id while the admin is connected; once it is gone, a
// binding under the same id is the newcomer's, with the newcomer's rights.
func TestAuthorityTriggerIDNotUpgradeable(t *testing.T) {
	te, _ := authorityEngine(t)
	p := startLocalProvider(t, te, "local-x")
	o := startOps(t, te, "ops::wipe")
	admin := te.dialAdmin(t)
	admin.registerIn("", "admin")
	admin.send(&protocol.RegisterTrigger{ID: "t", TriggerType: "local-x", FunctionID: "ops::log"})
	admin.sync()
	p.binding(t, "t")

	attacker := te.dial(t)
	attacker.registerIn("", "attacker")
	attacker.send(&protocol.RegisterTrigger{ID: "t", TriggerType: "local-x", FunctionID: "ops::new"})
	res := attacker.expect("triggerregistrationresult")
	code, _ := errBody(t, res)
	assert.Equal(t, code, codeTriggerIDConflict)
	b := p.binding(t, "t")
	assert.Equal(t, b.FunctionID, "ops::log")
	assert.Assert(t, b.Caller().Admin())

	assert.NilError(t, admin.c.CloseNow())
	pollUntil(t, "the admin's binding gone", func() bool { _, ok := p.get("t"); return !ok })
	attacker.send(&protocol.RegisterTrigger{ID: "t", TriggerType: "local-x", FunctionID: "ops::new"})
	attacker.sync()
	b = p.binding(t, "t")
	assert.Assert(t, !b.Caller().Admin())
	later := te.dialAdmin(t)
	later.send(&protocol.RegisterFunction{ID: "ops::new", Metadata: json.RawMessage(`{"privileged":true}`)})
	later.registerIn("", "later")
	assert.Equal(t, codeOf(fire(te, b, "")), CodeUnauthorized)
	o.none(t)
	later.sync()
}

// TestAuthorityRBACSession: a binding registered through an RBAC listener
// fires as that session, checked when it fires: a function the session was
// allowed when the trigger was bound (by its metadata) and is not any more
// is FORBIDDEN, and an allowed one goes through the listener's middleware,
// exactly as the session's direct calls do.
func TestAuthorityRBACSession(t *testing.T) {
	te, _ := authorityEngine(t)
	p := startLocalProvider(t, te, "local-x")
	mw := te.dialAdmin(t)
	mw.send(&protocol.RegisterFunction{ID: "meta::fn", Metadata: json.RawMessage(`{"tier":"gold"}`)})
	mw.registerIn("", "mw", "auth::authenticate", "auth::middleware")
	mwCalls := make(chan frame, 8)
	go func() {
		for {
			var m inbound
			select {
			case m = <-mw.in:
			case <-mw.closed:
				return
			}
			if m.f.typ() != "invokefunction" {
				continue
			}
			out := json.RawMessage(`{"allowed_functions":["ops::log"],"context":{"user":"alice"}}`)
			switch m.f.str("function_id") {
			case "auth::middleware":
				mwCalls <- m.f.obj("data")
				out = json.RawMessage(`{"via":"middleware"}`)
			case "meta::fn":
				mwCalls <- frame{"function_id": "meta::fn"}
			}
			b := appendResultFrame(nil, m.f.str("invocation_id"), m.f.str("function_id"), out, nil, "", "")
			_ = mw.c.Write(context.Background(), websocket.MessageText, b)
		}
	}()
	url := te.listen(t, ListenerPolicy{Name: "rbac", LoopbackHostOnly: true, MiddlewareFunctionID: "auth::middleware",
		RBAC: &rbac.Config{AuthFunctionID: "auth::authenticate", ExposeFunctions: []rbac.Filter{{Metadata: map[string]any{"tier": "gold"}}}}})
	alice := dialURL(t, url, http.Header{"X-User": {"alice"}})
	alice.register(map[string]any{"name": "alice"})
	alice.send(&protocol.RegisterTrigger{ID: "allowed", TriggerType: "local-x", FunctionID: "ops::log"})
	alice.send(&protocol.RegisterTrigger{ID: "meta", TriggerType: "local-x", FunctionID: "meta::fn"})
	alice.sync()

	res, err := te.InvokeAs(context.Background(), p.binding(t, "allowed").Caller(), "", "ops::log", json.RawMessage(`{"n":1}`), nil)
	assert.NilError(t, err)
	assert.Equal(t, string(res), `{"via":"middleware"}`)
	in := waitfor.Recv(t, mwCalls, waitFor, "the middleware to be called for ops::log")
	assert.Equal(t, in.str("function_id"), "ops::log")
	assert.Equal(t, in.obj("context").str("user"), "alice")

	// meta::fn is re-registered without the metadata that exposed it.
	mw.send(&protocol.RegisterFunction{ID: "meta::fn", Metadata: json.RawMessage(`{"tier":"silver"}`)})
	pollUntil(t, "meta::fn re-registered", func() bool {
		f := te.reg.get(DefaultNamespace, "meta::fn")
		return f != nil && strings.Contains(string(f.metadata), "silver")
	})
	err = fire(te, p.binding(t, "meta"), "")
	assert.Equal(t, codeOf(err), CodeForbidden, "%v", err)
	// Control: the allowed binding still reaches the middleware, and
	// meta::fn was never called, directly or through it.
	assert.NilError(t, fire(te, p.binding(t, "allowed"), ""))
	assert.Equal(t, waitfor.Recv(t, mwCalls, waitFor, "the middleware to be called again for ops::log").str("function_id"), "ops::log")
	select {
	case f := <-mwCalls:
		t.Fatalf("called: %v", f)
	default:
	}
}

// dialURL connects a raw client to another listener of the engine.
func dialURL(t *testing.T, url string, h http.Header) *rawClient {
	t.Helper()
	te := &testEngine{url: url}
	return te.dialWith(t, h)
}

// TestAuthorityWireProvider: a trigger type served by a socket worker that
// holds the engine token fires by calling the target from its own
// connection. While it holds another principal's binding of a function,
// its call of it is checked as that principal: ops::wipe is refused (and
// logged), the control runs, and once the binding is gone the provider's
// own call is its own again.
func TestAuthorityWireProvider(t *testing.T) {
	te, logs := authorityEngine(t)
	provider := te.dialAdmin(t)
	provider.send(&protocol.RegisterTriggerType{ID: "webhook"})
	provider.registerIn("", "webhook")
	attacker := te.dial(t)
	attacker.registerIn("", "attacker")
	attacker.send(&protocol.RegisterTrigger{ID: "evil", TriggerType: "webhook", FunctionID: "ops::wipe"})
	assert.Equal(t, provider.expect("registertrigger").str("function_id"), "ops::wipe")
	attacker.send(&protocol.RegisterTrigger{ID: "cond", TriggerType: "webhook", FunctionID: "ops::log",
		Config: json.RawMessage(`{"condition_function_id":"ops::wipe"}`)})
	assert.Equal(t, provider.expect("registertrigger").str("id"), "cond")
	o := startOps(t, te, "ops::wipe")

	f := provider.call("c1", "ops::log", nil, `{}`)
	assert.Assert(t, f.obj("error") == nil, "%v", f)
	assert.Equal(t, o.next(t), "ops::log")

	code, _ := errBody(t, provider.call("w1", "ops::wipe", nil, `{"payload":"attacker"}`))
	assert.Equal(t, code, CodeUnauthorized)
	assert.Check(t, is.Contains(logs.String(), "trigger_id=evil"))
	assert.Check(t, is.Contains(logs.String(), "delivery by a provider refused"))
	assert.Check(t, is.Contains(logs.String(), "provider_worker_id="+provider.workerID))

	attacker.send(&protocol.UnregisterTrigger{ID: "evil", TriggerType: "webhook"})
	provider.expect("unregistertrigger")
	// Still the condition of "cond".
	code, _ = errBody(t, provider.call("w2", "ops::wipe", nil, `{}`))
	assert.Equal(t, code, CodeUnauthorized)
	o.none(t)

	assert.NilError(t, attacker.c.CloseNow())
	provider.expect("unregistertrigger")
	f = provider.call("w3", "ops::wipe", nil, `{}`)
	assert.Assert(t, f.obj("error") == nil, "the provider's own call: %v", f)
	assert.Equal(t, o.next(t), "ops::wipe")
}

// TestAuthorityEnqueue: the queue provider (engine token) delivers an
// enqueued call from its own connection; it runs as the enqueuer. A target
// that did not exist when it was enqueued and is privileged by delivery is
// refused; the control is delivered; an enqueuer whose credential was
// revoked meanwhile gets nothing delivered.
func TestAuthorityEnqueue(t *testing.T) {
	te, logs := authorityEngine(t)
	queue := te.dialAdmin(t)
	queue.registerIn("", "queue", EnqueueProviderFunctionID)
	handed := make(chan frame, 8)
	go func() {
		for {
			var m inbound
			select {
			case m = <-queue.in:
			case <-queue.closed:
				return
			}
			if m.f.typ() == "invokefunction" {
				handed <- m.f.obj("data")
				b := appendResultFrame(nil, m.f.str("invocation_id"), m.f.str("function_id"), json.RawMessage(`{}`), nil, "", "")
				_ = queue.c.Write(context.Background(), websocket.MessageText, b)
				continue
			}
			handed <- m.f // a delivery's answer
		}
	}()
	enqueue := func(rc *rawClient, id, fn string) {
		t.Helper()
		rc.send(&protocol.InvokeFunction{InvocationID: id, FunctionID: fn, Data: json.RawMessage(`{"payload":"attacker"}`),
			Action: &protocol.TriggerAction{Type: protocol.ActionEnqueue, Queue: "jobs"}})
		res := rc.expect("invocationresult")
		assert.Assert(t, res.obj("error") == nil, "%v", res)
		assert.Equal(t, waitfor.Recv(t, handed, waitFor, "the queue provider to be handed "+fn).str("function_id"), fn)
	}
	deliver := func(id, fn string) frame {
		t.Helper()
		queue.send(&protocol.InvokeFunction{InvocationID: id, FunctionID: fn, Data: json.RawMessage(`{"payload":"attacker"}`)})
		return waitfor.Recv(t, handed, waitFor, "the answer to delivery "+id)
	}

	attacker := te.dial(t)
	attacker.registerIn("", "attacker")
	enqueue(attacker, "e1", "ops::wipe")
	enqueue(attacker, "e2", "ops::log")
	o := startOps(t, te, "ops::wipe")

	assert.Assert(t, deliver("d1", "ops::log").obj("error") == nil)
	assert.Equal(t, o.next(t), "ops::log")
	code, _ := errBody(t, deliver("d2", "ops::wipe"))
	assert.Equal(t, code, CodeUnauthorized)
	assert.Check(t, is.Contains(logs.String(), "worker_id="+attacker.workerID+" via=enqueue"))
	// The enqueuer's leaving does not upgrade what it enqueued.
	assert.NilError(t, attacker.c.CloseNow())
	code, _ = errBody(t, deliver("d3", "ops::wipe"))
	assert.Equal(t, code, CodeUnauthorized)
	o.none(t)

	// A credential's enqueue, revoked before the delivery.
	admin := te.dialAdmin(t)
	admin.registerIn("", "admin")
	tok := issue(t, admin, "i1", `{"label":"vm","namespace":"default"}`)
	vm := te.dialWith(t, http.Header{"Authorization": {"Bearer " + tok}})
	enqueue(vm, "e3", "ops::log2")
	o2 := te.dialAdmin(t)
	o2.registerIn("", "ops2", "ops::log2")
	f := admin.call("r1", FnCredentialsRevoke, nil, `{"token":"`+tok+`"}`)
	assert.Assert(t, f.obj("error") == nil, "%v", f)
	code, msg := errBody(t, deliver("d4", "ops::log2"))
	assert.Equal(t, code, CodeForbidden)
	assert.Check(t, strings.Contains(msg, "revoked"), msg)
	assert.Check(t, is.Contains(logs.String(), "label=vm"))
}

// TestAuthorityHTTPRegistrant: the engine makes an HTTP invocation's
// request only while its registrant could still register it.
func TestAuthorityHTTPRegistrant(t *testing.T) {
	te, _ := authorityEngine(t)
	anon := &worker{principal: &principal{kind: "anonymous"}}
	cred := &worker{principal: &principal{kind: "credential", label: "vm", cred: &credential{label: "vm"}}}
	for _, tc := range []struct {
		name string
		f    *function
		code string
	}{
		{"anonymous without auth", &function{id: "h::a", owner: anon, http: &protocol.HTTPInvocationRef{}}, ""},
		{"anonymous with auth", &function{id: "h::b", owner: anon, http: &protocol.HTTPInvocationRef{Auth: json.RawMessage(`{"type":"bearer"}`)}}, CodeForbidden},
		{"credential", &function{id: "h::c", owner: cred, http: &protocol.HTTPInvocationRef{}}, CodeForbidden},
		{"admin with auth", &function{id: "h::d", owner: &worker{principal: adminPrincipal}, http: &protocol.HTTPInvocationRef{Auth: json.RawMessage(`{}`)}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errb := te.httpRegistrantAllowed(tc.f)
			if tc.code == "" {
				assert.Assert(t, errb == nil, "%v", errb)
				return
			}
			assert.Assert(t, errb != nil)
			assert.Equal(t, errb.Code, tc.code)
		})
	}
}

// TestEnqueueDelegationsBounded: the enqueuers remembered per target are
// deduplicated by rights (anonymous connections of one listener count
// once) and capped; past the cap the target's deliveries are checked as
// nobody, refused, never as fewer principals than enqueued it.
func TestEnqueueDelegationsBounded(t *testing.T) {
	var d delegations
	k := fnKey{DefaultNamespace, "ops::x"}
	policy := &ListenerPolicy{Name: "l"}
	for range 3 {
		assert.Assert(t, d.add(k, Caller{p: &principal{kind: "anonymous", policy: policy}}))
	}
	assert.Equal(t, len(d.callers(k)), 1)
	assert.Equal(t, d.n.Load(), int64(1))
	for i := range maxDelegatorsPerTarget {
		assert.Assert(t, d.add(k, Caller{p: &principal{kind: "credential", label: strings.Repeat("c", i+1)}}))
	}
	cs := d.callers(k)
	assert.Equal(t, len(cs), 1, "collapsed to nobody")
	assert.Equal(t, d.n.Load(), int64(1))
	errb := cs[0].authorize(DefaultNamespace, "ops::x", nil)
	assert.Assert(t, errb != nil && errb.Code == CodeForbidden, "%v", errb)
	assert.Assert(t, d.add(k, Caller{p: &principal{kind: "credential", label: "late"}}), "nobody absorbs later enqueuers")
	assert.Equal(t, len(d.callers(k)), 1)
}

// TestAuthorityReattachDoesNotInherit: a connection that reattaches in
// place of an admin's (here with the admin's stolen reattach token) evicts
// it and takes none of its rights: the admin's trigger goes with it, and
// the newcomer's own trigger of the privileged function is its own, and
// refused.
func TestAuthorityReattachDoesNotInherit(t *testing.T) {
	te, _ := authorityEngine(t)
	p := startLocalProvider(t, te, "local-x")
	o := startOps(t, te, "ops::wipe")
	admin := te.dialAdmin(t)
	admin.registerIn("", "admin")
	admin.send(&protocol.RegisterTrigger{ID: "t", TriggerType: "local-x", FunctionID: "ops::wipe"})
	admin.sync()
	assert.Assert(t, p.binding(t, "t").Caller().Admin())

	thief := te.dial(t)
	thief.send(&protocol.Reattach{PreviousWorkerID: admin.workerID, ReattachToken: admin.token})
	thief.sync()
	_ = admin.waitClosed()
	pollUntil(t, "the admin's binding gone with it", func() bool { _, ok := p.get("t"); return !ok })

	thief.registerIn("", "admin")
	thief.send(&protocol.RegisterTrigger{ID: "t", TriggerType: "local-x", FunctionID: "ops::wipe"})
	code, _ := errBody(t, thief.expect("triggerregistrationresult"))
	assert.Equal(t, code, CodeUnauthorized)
	_, bound := p.get("t")
	assert.Assert(t, !bound)
	o.none(t)
}
