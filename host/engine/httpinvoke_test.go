package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/host/httpfn"
	"github.com/iii-sandbox/iii/protocol"
)

// httpEndpoints serves /echo (the request as JSON), /invalid (not JSON)
// and /slow (answers when the request ends) on 127.0.0.1.
func httpEndpoints(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var in any
		_ = json.Unmarshal(b, &in)
		_ = json.NewEncoder(w).Encode(map[string]any{"got": in, "path": r.Header.Get("x-iii-function-path"), "auth": r.Header.Get("Authorization")})
	})
	mux.HandleFunc("/invalid", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "<html>not json</html>") })
	mux.HandleFunc("/slow", func(_ http.ResponseWriter, r *http.Request) {
		// Reading the body lets the server notice the client leave.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// setHTTP runs iii-http-functions on te with sec.
func setHTTP(t *testing.T, te *testEngine, sec httpfn.Security, env map[string]string) {
	t.Helper()
	inv, err := httpfn.New(httpfn.Options{Security: sec, LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	assert.NilError(t, err)
	te.SetHTTPFunctions(httpfn.EngineHook{Invoker: inv})
	t.Cleanup(func() { te.SetHTTPFunctions(nil) })
}

// loopbackAllowed reaches the test's servers.
var loopbackAllowed = httpfn.Security{URLAllowlist: []string{"127.0.0.1", "localhost"}}

// registerHTTP registers id with an HTTP invocation from rc, settles rc's
// name and returns the registrationrejected frame when want is a code
// ("" when the registration must pass).
func registerHTTP(t *testing.T, rc *rawClient, name, id string, ref protocol.HTTPInvocationRef, want string) {
	t.Helper()
	rc.send(&protocol.RegisterFunction{ID: id, Invocation: &ref})
	rc.register(map[string]any{"name": name})
	if want != "" {
		rej := rc.expect("registrationrejected")
		assert.Equal(t, rej.str("code"), want)
		assert.Equal(t, rej.str("function_id"), id)
	}
	rc.sync()
}

func callCode(t *testing.T, rc *rawClient, id, fn string) (code, message string) {
	t.Helper()
	return errBody(t, rc.call(id, fn, nil, `{}`))
}

// Without the worker, as upstream: the registration does not happen, and
// the function is not found.
func TestHTTPFunctionsOff(t *testing.T) {
	te := startEngine(t, Options{})
	srv := httpEndpoints(t)
	w := te.dial(t)
	registerHTTP(t, w, "http-owner", "remote::echo", protocol.HTTPInvocationRef{URL: srv.URL + "/echo"}, protocol.CodeFunctionNotInvokable)
	code, _ := callCode(t, te.dial(t), "c1", "remote::echo")
	assert.Equal(t, code, protocol.CodeFunctionNotFound)
}

func TestHTTPFunctionCalls(t *testing.T) {
	te := startEngine(t, Options{})
	srv := httpEndpoints(t)
	setHTTP(t, te, loopbackAllowed, nil)
	w := te.dial(t)
	registerHTTP(t, w, "http-owner", "remote::echo", protocol.HTTPInvocationRef{URL: srv.URL + "/echo"}, "")
	w.send(&protocol.RegisterFunction{ID: "remote::invalid", Invocation: &protocol.HTTPInvocationRef{URL: srv.URL + "/invalid"}})
	w.sync()

	// Listed like any function.
	out := invokeJSON(t, te, FnFunctionsList, map[string]any{"prefix": "remote::"})
	assert.DeepEqual(t, ids(out["functions"], "function_id"), []string{"remote::echo", "remote::invalid"})

	// A socket caller: the endpoint's JSON, with the caller's id injected
	// as for any worker.
	caller := te.dial(t)
	res := caller.call("c1", "remote::echo", nil, `{"x":1}`)
	assert.Assert(t, res["error"] == nil, "%v", res)
	got := res.obj("result")
	assert.Equal(t, got["path"], "remote::echo")
	assert.Equal(t, got.obj("got")["x"], 1.0)
	assert.Equal(t, got.obj("got")["_caller_worker_id"], caller.workerID)

	// In-process callers (the router, builtins) reach it too.
	raw, err := te.Invoke(context.Background(), DefaultNamespace, "remote::echo", json.RawMessage(`{"y":2}`))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(raw), `"y":2`))

	code, msg := callCode(t, caller, "c2", "remote::invalid")
	assert.Equal(t, code, httpfn.CodeInvalidResponse)
	assert.Check(t, is.Contains(msg, "not JSON"))

	// The read loop is not held by a call in flight.
	w.send(&protocol.RegisterFunction{ID: "remote::slow", Invocation: &protocol.HTTPInvocationRef{URL: srv.URL + "/slow", TimeoutMS: ptr(uint64(300))}})
	w.sync()
	caller.send(&protocol.InvokeFunction{InvocationID: "s1", FunctionID: "remote::slow"})
	caller.sync()
	code, msg = errBody(t, caller.expect("invocationresult"))
	assert.Equal(t, code, httpfn.CodeHTTPRequestFailed)
	assert.Check(t, is.Contains(msg, "no answer within 300ms"))

	// The owner leaves: its functions go with it.
	assert.NilError(t, w.c.CloseNow())
	pollUntil(t, "the owner's HTTP functions are gone", func() bool { return te.reg.get(DefaultNamespace, "remote::echo") == nil })
	code, _ = callCode(t, caller, "c3", "remote::echo")
	assert.Equal(t, code, protocol.CodeFunctionNotFound)
}

// Under the default security nothing on this host can be reached: a
// loopback literal is refused at registration, a name that resolves to
// loopback at the call.
func TestHTTPFunctionsDefaultSecurity(t *testing.T) {
	te := startEngine(t, Options{})
	srv := httpEndpoints(t)
	setHTTP(t, te, httpfn.DefaultSecurity(), nil)
	port := srv.URL[strings.LastIndex(srv.URL, ":")+1:]
	w := te.dial(t)
	w.register(map[string]any{"name": "http-owner"})
	for i, url := range []string{
		srv.URL + "/echo",                           // http
		"https://127.0.0.1:" + port + "/echo",       // loopback
		"https://[::1]:" + port + "/echo",           // loopback v6
		"https://[::ffff:127.0.0.1]:" + port + "/x", // mapped
		"https://169.254.169.254/latest/meta-data/", // metadata
		"https://10.0.0.1/", "https://[fd00::1]/", "https://[fe80::1]/",
	} {
		w.send(&protocol.RegisterFunction{ID: "bad::" + string(rune('a'+i)), Invocation: &protocol.HTTPInvocationRef{URL: url}})
		rej := w.expect("registrationrejected")
		assert.Equal(t, rej.str("code"), httpfn.CodeURLValidationFailed, url)
	}
	w.send(&protocol.RegisterFunction{ID: "remote::local", Invocation: &protocol.HTTPInvocationRef{URL: "https://localhost:" + port + "/echo"}})
	w.sync()
	code, msg := callCode(t, te.dial(t), "c1", "remote::local")
	assert.Equal(t, code, httpfn.CodeURLValidationFailed)
	assert.Check(t, is.Contains(msg, "Private IP blocked"))
	_, err := te.Invoke(context.Background(), DefaultNamespace, "remote::local", nil)
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, httpfn.CodeURLValidationFailed)
}

// Who may register one (docs/http-functions.md): anonymous workers
// without auth; auth (engine environment variables) only with the engine
// token; never an issued credential.
func TestHTTPFunctionsRegistrationRights(t *testing.T) {
	te := startEngine(t, Options{})
	srv := httpEndpoints(t)
	setHTTP(t, te, loopbackAllowed, map[string]string{"SECRET_TOKEN": "s3cret"})
	withAuth := protocol.HTTPInvocationRef{URL: srv.URL + "/echo", Auth: json.RawMessage(`{"type":"bearer","token_key":"SECRET_TOKEN"}`)}

	anon := te.dial(t)
	registerHTTP(t, anon, "anon", "anon::auth", withAuth, CodeForbidden)

	admin := te.dialAdmin(t)
	issued := issue(t, admin, "1", `{"label":"vm","namespace":"default"}`)
	cred := te.dialWith(t, bearerHeader(issued))
	registerHTTP(t, cred, "vm-worker", "vm::plain", protocol.HTTPInvocationRef{URL: srv.URL + "/echo"}, CodeForbidden)

	registerHTTP(t, admin, "admin", "admin::auth", withAuth, "")
	res := te.dial(t).call("c1", "admin::auth", nil, `{}`)
	assert.Equal(t, res.obj("result")["auth"], "Bearer s3cret")

	// The auth variable must be set when it is registered.
	admin.send(&protocol.RegisterFunction{ID: "admin::unset", Invocation: &protocol.HTTPInvocationRef{URL: srv.URL + "/echo",
		Auth: json.RawMessage(`{"type":"bearer","token_key":"UNSET"}`)}})
	assert.Equal(t, admin.expect("registrationrejected").str("code"), httpfn.CodeTokenNotFound)
}

// Stopping the worker (a reload that removes it) drops every
// HTTP-invocation function; starting it again takes new registrations.
func TestHTTPFunctionsStopDropsFunctions(t *testing.T) {
	te := startEngine(t, Options{})
	srv := httpEndpoints(t)
	setHTTP(t, te, loopbackAllowed, nil)
	w := te.dial(t)
	registerHTTP(t, w, "http-owner", "remote::echo", protocol.HTTPInvocationRef{URL: srv.URL + "/echo"}, "")
	w.send(&protocol.RegisterFunction{ID: "plain::fn"})
	w.sync()

	te.SetHTTPFunctions(nil)
	assert.Assert(t, te.reg.get(DefaultNamespace, "remote::echo") == nil)
	assert.Assert(t, te.reg.get(DefaultNamespace, "plain::fn") != nil, "other functions stay")
	code, _ := callCode(t, te.dial(t), "c1", "remote::echo")
	assert.Equal(t, code, protocol.CodeFunctionNotFound)

	setHTTP(t, te, loopbackAllowed, nil)
	w.send(&protocol.RegisterFunction{ID: "remote::echo", Invocation: &protocol.HTTPInvocationRef{URL: srv.URL + "/echo"}})
	w.sync()
	res := te.dial(t).call("c2", "remote::echo", nil, `{}`)
	assert.Equal(t, res.obj("result")["path"], "remote::echo")
}

// A call in flight ends when the function's owner leaves
// (invocation_stopped), as a call to a worker's own handler does.
func TestHTTPFunctionCallStoppedWithItsOwner(t *testing.T) {
	te := startEngine(t, Options{})
	srv := httpEndpoints(t)
	setHTTP(t, te, loopbackAllowed, nil)
	w := te.dial(t)
	registerHTTP(t, w, "http-owner", "remote::slow", protocol.HTTPInvocationRef{URL: srv.URL + "/slow"}, "")
	caller := te.dial(t)
	caller.send(&protocol.InvokeFunction{InvocationID: "s1", FunctionID: "remote::slow"})
	caller.sync()
	start := time.Now()
	assert.NilError(t, w.c.CloseNow())
	code, _ := errBody(t, caller.expect("invocationresult"))
	assert.Equal(t, code, protocol.CodeInvocationStopped)
	assert.Assert(t, time.Since(start) < 5*time.Second)
}

// Registrations racing the stop of iii-http-functions: once it is off and
// the registrations have settled, no HTTP-invocation function is left.
func TestHTTPFunctionsStopRacesRegistrations(t *testing.T) {
	te := startEngine(t, Options{})
	srv := httpEndpoints(t)
	w := te.dial(t)
	w.register(map[string]any{"name": "racer"})
	inv, err := httpfn.New(httpfn.Options{Security: loopbackAllowed})
	assert.NilError(t, err)
	t.Cleanup(func() { te.SetHTTPFunctions(nil) })
	// The engine applies the frames on the connection's goroutine while
	// this one stops and restarts the worker.
	for round := range 50 {
		te.SetHTTPFunctions(httpfn.EngineHook{Invoker: inv})
		for i := range 20 {
			w.send(&protocol.RegisterFunction{ID: fmt.Sprintf("race::r%d-%d", round, i), Invocation: &protocol.HTTPInvocationRef{URL: srv.URL + "/echo"}})
		}
		te.SetHTTPFunctions(nil)
	}
	w.sendRaw(`{"type":"ping"}`)
	for f := w.next(); f.typ() != "pong"; f = w.next() {
		assert.Equal(t, f.typ(), "registrationrejected", "frame: %v", f)
	}
	for _, f := range te.reg.snapshot() {
		assert.Assert(t, f.http == nil, "%s outlived iii-http-functions", f.id)
	}
}
