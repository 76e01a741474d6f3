package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"testing"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/host/httpfn"
	"github.com/iii-sandbox/iii/protocol"
)

// A config.yaml naming iii-http-functions starts, its functions call their
// endpoints, and reloads add, change and remove the worker.
func TestHTTPFunctionsWorkerReload(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_ = json.NewEncoder(w).Encode(map[string]any{"path": r.Header.Get("x-iii-function-path"), "body": json.RawMessage(b)})
	}))
	defer srv.Close()
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	path := filepath.Join(t.TempDir(), "config.yaml")
	loopback := listenerConfig(port) + "  - name: iii-http-functions\n    config:\n      security: { url_allowlist: ['127.0.0.1'], block_private_ips: false, require_https: false }\n"
	writeConfig(t, path, loopback)
	r := serve(t, path)
	sec, on := httpSecurity(t, r)
	assert.Assert(t, on)
	assert.DeepEqual(t, sec, httpfn.Security{URLAllowlist: []string{"127.0.0.1"}})

	owner := dial(t, addr)
	register := func() {
		owner.send(t, &protocol.RegisterFunction{ID: "remote::echo", Invocation: &protocol.HTTPInvocationRef{URL: srv.URL + "/echo"}})
		// A call of its own proves the registration was applied.
		_, _ = owner.call(t, "engine::functions::list", `{}`)
	}
	owner.send(t, &protocol.InvokeFunction{FunctionID: "engine::workers::register", Data: json.RawMessage(`{"name":"http-owner"}`),
		Action: &protocol.TriggerAction{Type: protocol.ActionVoid}})
	register()
	caller := dial(t, addr)
	out, errb := caller.call(t, "remote::echo", `{"n":1}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	var got struct {
		Path string         `json:"path"`
		Body map[string]any `json:"body"`
	}
	assert.NilError(t, json.Unmarshal(out, &got))
	assert.Equal(t, got.Path, "remote::echo")
	assert.Equal(t, got.Body["n"], 1.0)

	// The defaults (a reload that drops the security: block) refuse the
	// loopback endpoint at the next call.
	writeConfig(t, path, listenerConfig(port)+"  - name: iii-http-functions\n")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if sec, on := httpSecurity(t, r); !on || !sec.RequireHTTPS {
			return poll.Continue("the new security block is not in force")
		}
		return poll.Success()
	})
	_, errb = caller.call(t, "remote::echo", `{}`)
	assert.Assert(t, errb != nil)
	assert.Equal(t, errb.Code, httpfn.CodeURLValidationFailed)

	// Removing the worker drops the function.
	writeConfig(t, path, listenerConfig(port))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if r.s.Engine().HTTPFunctions() != nil {
			return poll.Continue("iii-http-functions still runs")
		}
		return poll.Success()
	})
	_, errb = caller.call(t, "remote::echo", `{}`)
	assert.Assert(t, errb != nil)
	assert.Equal(t, errb.Code, protocol.CodeFunctionNotFound)

	// Adding it again: new registrations are taken and called.
	writeConfig(t, path, loopback)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if r.s.Engine().HTTPFunctions() == nil {
			return poll.Continue("iii-http-functions not started")
		}
		return poll.Success()
	})
	register()
	_, errb = caller.call(t, "remote::echo", `{}`)
	assert.Assert(t, errb == nil, "%+v", errb)
}

// httpSecurity is the security: block of the invoker the engine calls;
// on is false while iii-http-functions is off.
func httpSecurity(t *testing.T, r *running) (sec httpfn.Security, on bool) {
	t.Helper()
	h := r.s.Engine().HTTPFunctions()
	if h == nil {
		return httpfn.Security{}, false
	}
	hook, ok := h.(httpfn.EngineHook)
	assert.Assert(t, ok, "the engine calls a %T, not host/httpfn's invoker", h)
	return hook.Invoker.Security(), true
}

// An unknown key is INVALID_CONFIG at start, as upstream's
// deny_unknown_fields.
func TestHTTPFunctionsUnknownKey(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, path, listenerConfig(freePort(t))+"  - name: iii-http-functions\n    config: { security: { fake_key: true } }\n")
	_, err := Start(t.Context(), Options{ConfigPath: path, LookupEnv: lookupIn(engineEnv(t))})
	assert.ErrorContains(t, err, "INVALID_CONFIG")
	assert.ErrorContains(t, err, `unknown key "fake_key"`)
}
