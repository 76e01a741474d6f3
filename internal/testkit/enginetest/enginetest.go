// Package enginetest runs a real engine on a loopback WebSocket server
// with a Go client connected to it as a worker: the base of the
// integration tests of the parts that attach to an engine (the plugin
// host, the router) and of the VM worker tests that drive an adapter
// through one. The engine has an engine token (Env.Token) and the client
// presents it, as the same user's clients do, so it may call privileged
// functions; Anonymous connects one that does not.
package enginetest

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
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/enginetoken"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/protocol"
)

// Options say how the client connects.
type Options struct {
	// ClientName is the connected client's worker name.
	ClientName string
	// CallTimeout bounds each of the client's calls.
	CallTimeout time.Duration
	// Wait bounds the client's dial and, at clean-up, its close and the
	// engine's: a hang guard, not a timing.
	Wait time.Duration
}

// Env is the running engine and its client.
type Env struct {
	Engine *engine.Engine
	// URL is the engine's ws:// address.
	URL    string
	Client *client.Client
	// Log is a debug-level logger for the engine and the parts a test
	// attaches; Logs holds what it wrote, and is printed if the test fails.
	Log  hclog.Logger
	Logs *syncbuf.Buffer
	// Token is the engine token; Client presents it.
	Token string

	wait time.Duration
}

// Start starts the engine, serves it on a loopback port and connects the
// client; all are closed when the test ends. Attach the parts under test
// to Engine afterwards and register their Close with t.Cleanup: clean-ups
// run last in, first out, so they close before the client and the engine.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	logs := &syncbuf.Buffer{}
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: logs})
	token, err := enginetoken.New()
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(engine.Options{Logger: log.Named("engine"), AdminToken: func() string { return token }})
	srv := httptest.NewServer(eng.Handler())
	env := &Env{Engine: eng, URL: "ws" + strings.TrimPrefix(srv.URL, "http"), Log: log, Logs: logs, Token: token, wait: o.Wait}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), o.Wait)
		defer cancel()
		if env.Client != nil {
			if err := env.Client.Close(ctx); err != nil {
				t.Errorf("close the client: %v", err)
			}
		}
		if err := eng.Close(ctx); err != nil {
			t.Errorf("close the engine: %v", err)
		}
		srv.Close()
		if t.Failed() {
			t.Logf("engine log:\n%s", logs.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), o.Wait)
	defer cancel()
	cl, err := client.Dial(ctx, env.URL, client.Options{Name: o.ClientName, IgnoreEnv: true, Token: token,
		Reconnect: client.ReconnectPolicy{Disable: true}, CallTimeout: o.CallTimeout})
	if err != nil {
		t.Fatalf("connect to the engine: %v", err)
	}
	env.Client = cl
	return env
}

// Anonymous connects another client, named name, that presents no token:
// a worker's view of the engine (privileged functions answer
// UNAUTHORIZED). It is closed when the test ends.
func (e *Env) Anonymous(t testing.TB, name string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.wait)
	defer cancel()
	cl, err := client.Dial(ctx, e.URL, client.Options{Name: name, IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}})
	if err != nil {
		t.Fatalf("connect to the engine: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), e.wait)
		defer cancel()
		_ = cl.Close(ctx)
	})
	return cl
}

// Call calls fn through the engine as the client, bounded by Wait.
func (e *Env) Call(t testing.TB, fn string, payload any, opts ...client.CallOption) (json.RawMessage, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e.wait)
	defer cancel()
	return e.Client.Call(ctx, fn, payload, opts...)
}

// MustCall calls fn, which must succeed with a JSON object, and returns it.
func (e *Env) MustCall(t testing.TB, fn string, payload any, opts ...client.CallOption) map[string]any {
	t.Helper()
	out, err := e.Call(t, fn, payload, opts...)
	assert.NilError(t, err, "call %s", fn)
	var m map[string]any
	assert.NilError(t, json.Unmarshal(out, &m))
	return m
}

// SandboxError is the S-code error of a failed sandbox call, as the engine
// carries it: the remote error's code is the S-code and its message the
// error's wire JSON.
func SandboxError(t testing.TB, err error) *contract.Error {
	t.Helper()
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb), "a remote error, got %v", err)
	se, ok := contract.FromErrorBody(eb)
	assert.Assert(t, ok, "the message carries a sandbox error: %q", eb.Message)
	assert.Equal(t, string(se.Code), eb.Code, "the error code is the S-code")
	return se
}
