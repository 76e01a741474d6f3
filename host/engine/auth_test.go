package engine

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/rbac"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
	"github.com/iii-sandbox/iii/protocol"
)

// listen serves the engine under another listener policy; the URL is ws://.
func (te *testEngine) listen(t *testing.T, p ListenerPolicy) string {
	t.Helper()
	srv := httptest.NewServer(te.HandlerFor(p))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// dialRefused dials url with h and returns the error frame the engine sends
// before it closes the socket.
func dialRefused(t *testing.T, url string, h http.Header) frame {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: h})
	assert.NilError(t, err)
	defer c.CloseNow()
	_, data, err := c.Read(ctx)
	assert.NilError(t, err)
	var f frame
	assert.NilError(t, json.Unmarshal(data, &f))
	_, _, err = c.Read(ctx)
	assert.Assert(t, err != nil, "the engine closes the socket after the error frame")
	return f
}

func (te *testEngine) dialURL(t *testing.T, url string, h http.Header) *rawClient {
	t.Helper()
	saved := te.url
	te.url = url
	defer func() { te.url = saved }()
	return te.dialWith(t, h)
}

func bearerHeader(tok string) http.Header {
	return http.Header{"Authorization": {"Bearer " + tok}}
}

// privilegedWorker attaches an in-process worker with one privileged and one
// open function.
func privilegedWorker(t *testing.T, te *testEngine) {
	t.Helper()
	lw, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "ops"})
	assert.NilError(t, err)
	ok := func(_ context.Context, c *Call) (json.RawMessage, error) {
		return json.Marshal(map[string]any{"admin": c.CallerAdmin})
	}
	assert.NilError(t, lw.RegisterFunction(FunctionDef{ID: "ops::restart", Privileged: true}, ok))
	assert.NilError(t, lw.RegisterFunction(FunctionDef{ID: "ops::status"}, ok))
}

func TestPrivilegedFunctionsNeedTheToken(t *testing.T) {
	te := startEngine(t, Options{})
	privilegedWorker(t, te)

	anon := te.dial(t)
	code, msg := errBody(t, anon.call("1", "ops::restart", nil, `{}`))
	assert.Equal(t, code, CodeUnauthorized)
	assert.Check(t, is.Contains(msg, "engine token"))
	f := anon.call("2", "ops::status", nil, `{}`)
	assert.DeepEqual(t, f.obj("result"), frame{"admin": false})

	admin := te.dialAdmin(t)
	f = admin.call("3", "ops::restart", nil, `{}`)
	assert.DeepEqual(t, f.obj("result"), frame{"admin": true})

	// A privileged function a socket worker marks in its metadata.
	svc := te.dialAdmin(t)
	svc.send(&protocol.RegisterFunction{ID: "svc::wipe", Metadata: json.RawMessage(`{"privileged":true}`)})
	svc.registerIn("", "svc")
	svc.serveEcho()
	code, _ = errBody(t, anon.call("4", "svc::wipe", nil, `{}`))
	assert.Equal(t, code, CodeUnauthorized)
	f = admin.call("5", "svc::wipe", nil, `{"x":1}`)
	assert.Equal(t, f.obj("result").obj("echo")["x"], 1.0)

	// A token that is not the engine's is refused at the handshake.
	refused := dialRefused(t, te.url, bearerHeader("not-the-token"))
	assert.Equal(t, refused.typ(), "error")
	assert.Equal(t, refused.obj("error").str("code"), CodeAuthError)
}

func TestReservedIDsAndTriggerTargets(t *testing.T) {
	te := startEngine(t, Options{})
	privilegedWorker(t, te)
	anon := te.dial(t)
	for _, id := range []string{"compose::add", "configuration::set", "sandbox::run", "engine::adapters::start"} {
		anon.send(&protocol.RegisterFunction{ID: id})
	}
	anon.register(map[string]any{"name": "squatter"})
	for range 4 {
		rej := anon.expect("registrationrejected")
		assert.Equal(t, rej.str("code"), CodeForbidden)
	}
	assert.Assert(t, !hasFn(te, DefaultNamespace, "compose::add"))

	// A trigger may not aim at what its registrant could not call.
	anon.send(&protocol.RegisterTrigger{ID: "t1", TriggerType: "cron", FunctionID: "ops::restart"})
	res := anon.expect("triggerregistrationresult")
	assert.Equal(t, res.obj("error").str("code"), CodeUnauthorized)
	anon.send(&protocol.RegisterTrigger{ID: "t2", TriggerType: "cron", FunctionID: "compose::up"})
	res = anon.expect("triggerregistrationresult")
	assert.Equal(t, res.obj("error").str("code"), CodeForbidden)

	// Nor may its condition function, which the provider calls with its
	// own rights (the configuration and stream triggers run in-process).
	anon.send(&protocol.RegisterFunction{ID: "mine::on"})
	anon.sync()
	anon.send(&protocol.RegisterTrigger{ID: "t3", TriggerType: "configuration", FunctionID: "mine::on",
		Config: json.RawMessage(`{"condition_function_id":"ops::restart"}`)})
	res = anon.expect("triggerregistrationresult")
	assert.Equal(t, res.obj("error").str("code"), CodeUnauthorized)
	anon.send(&protocol.RegisterTrigger{ID: "t4", TriggerType: "stream", FunctionID: "mine::on",
		Config: json.RawMessage(`{"stream_name":"s","condition_function_id":"engine::credentials::revoke"}`)})
	res = anon.expect("triggerregistrationresult")
	assert.Equal(t, res.obj("error").str("code"), CodeForbidden)
}

func TestCredentials(t *testing.T) {
	te := startEngine(t, Options{})
	privilegedWorker(t, te)

	// Issuing one is privileged.
	anon := te.dial(t)
	code, _ := errBody(t, anon.call("1", FnCredentialsIssue, nil, `{"namespace":"orders"}`))
	assert.Equal(t, code, CodeUnauthorized)
	admin := te.dialAdmin(t)
	f := admin.call("2", FnCredentialsIssue, nil, `{"label":"compose/orders/w","namespace":"orders","allow":{"default":["ops::status"]}}`)
	tok := f.obj("result").str("token")
	assert.Equal(t, len(tok), 64, "256 bits, hex")

	vm := te.dialWith(t, bearerHeader(tok))
	vm.send(&protocol.RegisterFunction{ID: "orders::place"})
	vm.registerIn("orders", "vm-worker")
	pollUntil(t, "registered in its namespace", func() bool { return hasFn(te, "orders", "orders::place") })

	// Its own namespace and its grants: yes. Anything else: FORBIDDEN.
	// Privileged functions: never.
	f = vm.call("3", "ops::status", nil, `{}`)
	assert.DeepEqual(t, f.obj("result"), frame{"admin": false})
	code, _ = errBody(t, vm.call("4", "ops::restart", nil, `{}`))
	assert.Assert(t, code == CodeForbidden || code == CodeUnauthorized, code)
	code, _ = errBody(t, vm.call("5", FnFunctionsList, nil, `{}`))
	assert.Equal(t, code, CodeForbidden)
	code, _ = errBody(t, vm.call("6", FnCredentialsIssue, nil, `{"namespace":"default"}`))
	assert.Assert(t, code == CodeForbidden || code == CodeUnauthorized, code)

	// It may not declare another namespace.
	other := te.dialWith(t, bearerHeader(tok))
	f = other.call("7", FnWorkersRegister, nil, `{"name":"sneaky","namespace":"default"}`)
	code, msg := errBody(t, f)
	assert.Equal(t, code, CodeForbidden)
	assert.Check(t, is.Contains(msg, "permitted: orders"))

	// Without a register, its registrations still land in its only namespace.
	quiet := te.dialWith(t, bearerHeader(tok))
	quiet.send(&protocol.RegisterFunction{ID: "orders::quiet"})
	pollUntil(t, "grace puts it in orders", func() bool { return hasFn(te, "orders", "orders::quiet") })
	assert.Assert(t, !hasFn(te, DefaultNamespace, "orders::quiet"))

	// Revoking closes its connections and refuses new ones.
	f = admin.call("8", FnCredentialsRevoke, nil, `{"token":"`+tok+`"}`)
	assert.Equal(t, f.obj("result")["revoked"], true)
	closed := vm.waitClosed()
	assert.Equal(t, websocket.CloseStatus(closed), websocket.StatusPolicyViolation, "revoking closes the worker's connection: %v", closed)
	assert.Check(t, is.Contains(closed.Error(), "credential revoked"))
	pollUntil(t, "the revoked worker's functions are gone", func() bool { return !hasFn(te, "orders", "orders::place") })
	refused := dialRefused(t, te.url, bearerHeader(tok))
	assert.Equal(t, refused.obj("error").str("code"), CodeAuthError)
}

func TestRequireToken(t *testing.T) {
	te := startEngine(t, Options{})
	url := te.listen(t, ListenerPolicy{Name: "wide", RequireToken: true})
	refused := dialRefused(t, url, nil)
	assert.Equal(t, refused.obj("error").str("code"), CodeAuthError)
	assert.Check(t, is.Contains(refused.obj("error").str("message"), "not bound to loopback"))
	te.dialURL(t, url, bearerHeader(testAdminToken)) // the token holder gets in
}

// TestRBACWithRawWorkers: an auth function served by a raw socket worker on
// the default listener decides for the connections of an RBAC listener.
func TestRBACWithRawWorkers(t *testing.T) {
	te := startEngine(t, Options{})
	url := te.listen(t, ListenerPolicy{Name: "rbac", LoopbackHostOnly: true,
		RBAC: &rbac.Config{
			AuthFunctionID:                   "auth::fn",
			ExposeFunctions:                  []rbac.Filter{{Match: "api::*"}, {Match: "orders::*", Namespace: "orders"}},
			OnFunctionRegistrationFunctionID: "auth::onreg",
		}})
	auth := te.dial(t)
	auth.registerIn("", "auth", "auth::fn", "auth::onreg", "api::echo", "api::secret", "other::fn")
	go func() {
		for {
			var f frame
			select {
			case m := <-auth.in:
				f = m.f
			case <-auth.closed:
				return
			}
			if f.typ() != "invokefunction" {
				continue
			}
			var res any
			var errb *protocol.ErrorBody
			if f.str("function_id") == "auth::fn" {
				hdrs := f.obj("data").obj("headers")
				switch hdrs.str("x-user") {
				case "alice":
					res = map[string]any{"allowed_functions": []string{"other::fn"}, "forbidden_functions": []string{"api::secret"},
						"namespaces": map[string][]string{"default": {"*"}, "orders": {"orders::*"}}}
				case "bob":
					res = map[string]any{"allow_function_registration": false}
				default:
					errb = &protocol.ErrorBody{Code: "nope", Message: "who are you"}
				}
			} else if f.str("function_id") == "auth::onreg" {
				id := f.obj("data").str("function_id")
				if strings.HasPrefix(id, "deny::") {
					errb = &protocol.ErrorBody{Code: "no", Message: "not that one"}
				} else {
					res = map[string]any{"function_id": "hooked::" + id}
				}
			} else {
				res = map[string]any{"ok": f.str("function_id")}
			}
			out, _ := json.Marshal(res)
			b := appendResultFrame(nil, f.str("invocation_id"), f.str("function_id"), out, errb, "", "")
			if auth.c.Write(context.Background(), websocket.MessageText, b) != nil {
				return
			}
		}
	}()

	refused := dialRefused(t, url, http.Header{"X-User": {"mallory"}})
	assert.Equal(t, refused.obj("error").str("code"), CodeAuthError)
	assert.Check(t, is.Contains(refused.obj("error").str("message"), "who are you"))

	alice := te.dialURL(t, url, http.Header{"X-User": {"alice"}})
	f := alice.call("1", "api::echo", nil, `{}`)
	assert.Equal(t, f.obj("result").str("ok"), "api::echo")
	code, _ := errBody(t, alice.call("2", "api::secret", nil, `{}`))
	assert.Equal(t, code, CodeForbidden)
	// Declaring a namespace outside the session's is refused.
	code, _ = errBody(t, alice.call("3", FnWorkersRegister, nil, `{"name":"a","namespace":"billing"}`))
	assert.Equal(t, code, CodeForbidden)

	// The registration hook renames one registration and denies another;
	// invocations reach the worker under the id it registered.
	alice.send(&protocol.RegisterFunction{ID: "x::f"})
	alice.send(&protocol.RegisterFunction{ID: "deny::f"})
	alice.register(map[string]any{"name": "alice"})
	rej := alice.expect("registrationrejected")
	assert.Equal(t, rej.str("code"), CodeForbidden)
	assert.Equal(t, rej.str("function_id"), "deny::f")
	pollUntil(t, "the renamed registration", func() bool { return hasFn(te, DefaultNamespace, "hooked::x::f") })
	assert.Assert(t, !hasFn(te, DefaultNamespace, "x::f"))
	admin := te.dialAdmin(t)
	admin.send(&protocol.InvokeFunction{InvocationID: "h1", FunctionID: "hooked::x::f", Data: json.RawMessage(`{}`)})
	inv := alice.expect("invokefunction")
	assert.Equal(t, inv.str("function_id"), "x::f")

	bob := te.dialURL(t, url, http.Header{"X-User": {"bob"}})
	code, _ = errBody(t, bob.call("4", "other::fn", nil, `{}`))
	assert.Equal(t, code, CodeForbidden, "not exposed and not granted")
	f = bob.call("5", "api::echo", nil, `{}`)
	assert.Equal(t, f.obj("result").str("ok"), "api::echo")
	code, _ = errBody(t, bob.call("6", FnFunctionsList, nil, `{}`))
	assert.Equal(t, code, CodeForbidden, "discovery is not infrastructure")
	bob.send(&protocol.RegisterFunction{ID: "bob::fn"})
	bob.register(map[string]any{"name": "bob"})
	rej = bob.expect("registrationrejected")
	assert.Equal(t, rej.str("code"), CodeForbidden)
}

// TestNodeSDKRBACAndMiddleware: an auth function and a middleware served
// by the published Node SDK decide for callers that are Node SDK workers
// too, through a listener configured as iii's rbac/middleware.
func TestNodeSDKRBACAndMiddleware(t *testing.T) {
	ne := nodesdk.Find(t)
	te := startEngine(t, Options{})
	url := te.listen(t, ListenerPolicy{Name: "iii-worker-manager#rbac", LoopbackHostOnly: true,
		MiddlewareFunctionID: "auth::middleware",
		RBAC:                 &rbac.Config{AuthFunctionID: "auth::authenticate", ExposeFunctions: []rbac.Filter{{Match: "api::*"}}}})
	authw := startNode(t, ne, map[string]any{"mode": "auth", "url": te.url, "name": "auth", "functions": []string{"api::echo", "api::secret", "other::fn", "hidden::fn"}})
	assert.Equal(t, authw.Line(t, waitFor)["started"], true)
	pollUntil(t, "auth worker registered", func() bool { return ownerOf(te, DefaultNamespace, "auth::middleware") == "auth" })

	res := runNode(t, ne, map[string]any{"mode": "call", "url": url, "name": "alice-caller", "headers": map[string]string{"x-user": "alice"},
		"calls": []map[string]any{
			{"function_id": "api::echo", "payload": map[string]any{"n": 1}},
			{"function_id": "api::secret", "payload": map[string]any{}},
			{"function_id": "other::fn", "payload": map[string]any{"n": 2}},
			{"function_id": "hidden::fn", "payload": map[string]any{}},
			{"function_id": "engine::functions::list", "payload": map[string]any{}},
		}})
	assert.Equal(t, res[0]["ok"], true, "%v", res[0])
	r0 := res[0]["result"].(map[string]any)
	assert.Equal(t, r0["via"], "middleware")
	assert.Equal(t, r0["result"].(map[string]any)["by"], "auth")
	assert.Equal(t, res[1]["ok"], false)
	assert.Equal(t, res[1]["code"], CodeForbidden)
	assert.Equal(t, res[2]["ok"], true, "%v", res[2])
	assert.Equal(t, res[3]["code"], CodeForbidden)
	assert.Equal(t, res[4]["code"], CodeForbidden)

	// The middleware saw exactly the two allowed non-engine invokes, with
	// the session's context; engine::workers::register (infrastructure,
	// engine-owned) went straight through.
	seen := map[string]map[string]any{}
	for range 2 {
		in := authw.Line(t, waitFor)["middleware"].(map[string]any)
		seen[in["function_id"].(string)] = in
	}
	assert.Equal(t, len(seen), 2)
	echo := seen["api::echo"]
	assert.Assert(t, echo != nil, "%v", seen)
	assert.Equal(t, echo["namespace"], "default")
	assert.Equal(t, echo["context"].(map[string]any)["user"], "alice")
	assert.Equal(t, echo["payload"].(map[string]any)["n"], 1.0)
	assert.Assert(t, seen["other::fn"] != nil)

	// A rejected handshake: the SDK's connection gets AUTH_ERROR and closes.
	refused := dialRefused(t, url, http.Header{"X-User": {"mallory"}})
	assert.Equal(t, refused.obj("error").str("code"), CodeAuthError)
	assert.Check(t, is.Contains(refused.obj("error").str("message"), "unknown user mallory"))
}
