package configuration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/protocol"
)

// TestThroughEngine calls configuration::* through a real engine, the way
// any worker or the CLI reaches them.
func TestThroughEngine(t *testing.T) {
	ctx := context.Background()
	eng := engine.New(engine.Options{Logger: hclog.NewNullLogger(), Version: "0.26.0"})
	t.Cleanup(func() { assert.NilError(t, eng.Close(context.Background())) })
	f := newWorker(t, env{"PORT": "7000"})
	assert.NilError(t, f.w.Attach(eng))
	assert.ErrorContains(t, f.w.Attach(eng), "already attached")

	call := func(fn, data string) (string, error) {
		out, err := eng.Invoke(ctx, engine.DefaultNamespace, fn, json.RawMessage(data))
		return string(out), err
	}
	out, err := call(FnRegister, `{"id":"http","name":"HTTP","description":"listener","schema":`+portSchema+`,"initial_value":{"port":"${PORT:3111}"}}`)
	assert.NilError(t, err)
	assert.Assert(t, strings.Contains(out, `"value":{"port":"${PORT:3111}"}`), out)

	out, err = call(FnGet, `{"id":"http"}`)
	assert.NilError(t, err)
	assert.Equal(t, out, `{"id":"http","value":{"port":7000}}`)

	out, err = call(FnSet, `{"id":"http","value":{"port":8080}}`)
	assert.NilError(t, err)
	assert.Equal(t, out, `{"old_value":{"port":"${PORT:3111}"},"new_value":{"port":8080}}`)

	out, err = call(FnEnsure, `{"id":"http","name":"HTTP","description":"listener","schema":`+portSchema+`,"initial_value":{"port":1}}`)
	assert.NilError(t, err)
	assert.Assert(t, strings.Contains(out, `"value":{"port":8080}`), out)

	out, err = call(FnList, `{}`)
	assert.NilError(t, err)
	assert.Assert(t, strings.HasPrefix(out, `{"configurations":[{"id":"http","name":"HTTP"`), out)
	out, err = call(FnSchema, `{"id":"http"}`)
	assert.NilError(t, err)
	assert.Assert(t, strings.Contains(out, `"schema":`+portSchema), out)

	assert.NilError(t, f.w.SetInMemory("default-sandbox-libkrun", json.RawMessage(`{"image_allowlist":["python"]}`)))
	out, err = call(FnGet, `{"id":"default-sandbox-libkrun"}`)
	assert.NilError(t, err)
	assert.Equal(t, out, `{"id":"default-sandbox-libkrun","value":{"image_allowlist":["python"]}}`)

	// Each code reaches the caller as a coded error.
	for _, tc := range []struct{ fn, data, code string }{
		{FnGet, `{"id":"iii-sandbox","raw":true}`, CodeNotFound},
		{FnGet, `{"id":"NO"}`, CodeInvalidID},
		{FnSet, `{"id":"ghost","value":1}`, CodeNotRegistered},
		{FnSet, `{"id":"default-sandbox-libkrun","value":{}}`, CodeNotRegistered},
		{FnSet, `{"id":"http","value":{"port":-1}}`, CodeSchemaInvalid},
		{FnRegister, `{"id":"x","schema":{"type":"nope"}}`, CodeSchemaInvalid},
		{FnGet, `[1]`, CodeInvalidRequest},
	} {
		_, err := call(tc.fn, tc.data)
		var eb *protocol.ErrorBody
		assert.Assert(t, errors.As(err, &eb), "%s %s: %v", tc.fn, tc.data, err)
		assert.Equal(t, eb.Code, tc.code, "%s %s: %s", tc.fn, tc.data, eb.Message)
	}

	// The functions carry their schemas for engine::functions::info.
	out, err = call("engine::functions::info", `{"function_id":"configuration::get"}`)
	assert.NilError(t, err)
	assert.Assert(t, strings.Contains(out, `"request_schema"`) && strings.Contains(out, `"raw"`), out)

	// After Close the functions are gone.
	f.w.Close()
	_, err = call(FnGet, `{"id":"http"}`)
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb), "%v", err)
	assert.Equal(t, eb.Code, "function_not_found")
}

// TestSocketCallers: through the engine's socket, a caller without the
// engine token may read entries but not change them (register, ensure and
// set answer UNAUTHORIZED), and its configuration::get expands nothing
// from the engine's environment: it gets the stored value as written. The
// engine token's holder gets the expansion.
func TestSocketCallers(t *testing.T) {
	const token = "cfg-test-token"
	sf := attachedOverSocket(t, token, env{"HOME": "/home/engine-owner", "PORT": "7000"})
	eng, dial := sf.eng, sf.dial
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, worker := dial("admin", token), dial("worker", "")

	const value = `{"home":"${HOME}","port":"${PORT:3111}","dir":"${HOME}/data"}`
	reg := `{"id":"app","schema":{"type":"object"},"initial_value":` + value + `}`
	for _, tc := range []struct{ fn, data string }{
		{FnRegister, reg},
		{FnEnsure, reg},
		{FnSet, `{"id":"app","value":{}}`},
	} {
		_, err := worker.Call(ctx, tc.fn, json.RawMessage(tc.data))
		assert.Equal(t, client.CodeOf(err), engine.CodeUnauthorized, "%s: %v", tc.fn, err)
	}
	_, err := admin.Call(ctx, FnRegister, json.RawMessage(reg))
	assert.NilError(t, err)

	out, err := worker.Call(ctx, FnGet, json.RawMessage(`{"id":"app"}`))
	assert.NilError(t, err)
	assert.Equal(t, string(out), `{"id":"app","value":`+value+`}`, "no expansion for a caller without the token")
	assert.Check(t, !strings.Contains(string(out), "/home/engine-owner"))
	out, err = admin.Call(ctx, FnGet, json.RawMessage(`{"id":"app"}`))
	assert.NilError(t, err)
	assert.Equal(t, string(out), `{"id":"app","value":{"home":"/home/engine-owner","port":7000,"dir":"/home/engine-owner/data"}}`)
	out, err = admin.Call(ctx, FnGet, json.RawMessage(`{"id":"app","raw":true}`))
	assert.NilError(t, err)
	assert.Equal(t, string(out), `{"id":"app","value":`+value+`}`)

	for _, fn := range []string{FnList, FnSchema} {
		_, err := worker.Call(ctx, fn, json.RawMessage(`{"id":"app"}`))
		assert.NilError(t, err, fn)
	}
	for _, fn := range []string{FnRegister, FnEnsure, FnSet, FnGet, FnList, FnSchema} {
		priv, ok := eng.FunctionPrivileged(engine.DefaultNamespace, fn)
		assert.Check(t, ok, fn)
		assert.Equal(t, priv, fn == FnRegister || fn == FnEnsure || fn == FnSet, fn)
	}
}

// socketFixture is a configuration worker attached to a real engine served
// on a loopback WebSocket, and a way to dial it as a worker presenting tok
// ("" for none).
type socketFixture struct {
	*fixture
	eng  *engine.Engine
	dial func(name, tok string) *client.Client
}

// attachedOverSocket runs an engine whose token is token, with a worker
// (environment vars) attached; the test's cleanup stops both.
func attachedOverSocket(t *testing.T, token string, vars env) socketFixture {
	t.Helper()
	eng := engine.New(engine.Options{Logger: hclog.NewNullLogger(), Version: "0.26.0", AdminToken: func() string { return token }})
	srv := httptest.NewServer(eng.Handler())
	t.Cleanup(func() {
		assert.NilError(t, eng.Close(context.Background()))
		srv.Close()
	})
	f := newWorker(t, vars)
	assert.NilError(t, f.w.Attach(eng))
	u := "ws" + strings.TrimPrefix(srv.URL, "http")
	dial := func(name, tok string) *client.Client {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, u, client.Options{Name: name, IgnoreEnv: true, Token: tok, Reconnect: client.ReconnectPolicy{Disable: true}})
		assert.NilError(t, err)
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	return socketFixture{f, eng, dial}
}
