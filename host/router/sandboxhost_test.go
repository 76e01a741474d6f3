package router

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// rawHost is a remote sandbox host as the engine sees it: a raw WebSocket
// worker that presents a credential and serves <adapter>::* by answering
// every invocation with what answer returns.
type rawHost struct {
	c        *websocket.Conn
	mu       sync.Mutex
	got      []string // function ids invoked, in order
	rejected chan protocol.RegistrationRejected
	closed   chan struct{}
}

func dialHost(t *testing.T, url, credential, adapter, ns string, ids []string) *rawHost {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + credential}}})
	assert.NilError(t, err)
	t.Cleanup(func() { _ = c.CloseNow() })
	h := &rawHost{c: c, rejected: make(chan protocol.RegistrationRejected, len(ids)), closed: make(chan struct{})}
	_, data, err := c.Read(ctx)
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(data), `"workerregistered"`))
	send := func(m protocol.Message) {
		b, err := protocol.Encode(m)
		assert.NilError(t, err)
		assert.NilError(t, c.Write(ctx, websocket.MessageText, b))
	}
	for _, id := range ids {
		send(&protocol.RegisterFunction{ID: id})
	}
	send(&protocol.InvokeFunction{FunctionID: engine.FnWorkersRegister, Action: &protocol.TriggerAction{Type: protocol.ActionVoid},
		Data: json.RawMessage(`{"name":"` + adapter + `-host","namespace":"` + ns + `"}`)})
	go h.serve(adapter)
	return h
}

func (h *rawHost) serve(adapter string) {
	defer close(h.closed)
	for {
		_, data, err := h.c.Read(context.Background())
		if err != nil {
			return
		}
		m, err := protocol.Decode(data)
		if err != nil {
			continue
		}
		switch m := m.(type) {
		case *protocol.RegistrationRejected:
			h.rejected <- *m
		case *protocol.InvokeFunction:
			h.mu.Lock()
			h.got = append(h.got, m.FunctionID)
			h.mu.Unlock()
			var out any = map[string]any{"sandbox_id": "remote-1", "via": m.FunctionID}
			if strings.HasSuffix(m.FunctionID, "::adapter::info") {
				out = map[string]any{"adapter": adapter, "adapter_version": "1", "contract": map[string]int{"major": contract.Major, "minor": 1}}
			}
			res, _ := json.Marshal(out)
			b, _ := protocol.Encode(&protocol.InvocationResult{InvocationID: m.InvocationID, FunctionID: m.FunctionID, Result: res})
			if h.c.Write(context.Background(), websocket.MessageText, b) != nil {
				return
			}
		}
	}
}

func (h *rawHost) calls() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...)
}

func issueCredential(t *testing.T, te *testEnv, spec map[string]any) string {
	t.Helper()
	out := te.MustCall(t, engine.FnCredentialsIssue, spec)
	return out["token"].(string)
}

// A remote sandbox host with its own credential serves the router for its
// adapter and namespace; nothing else it tries is forwarded to; revoking
// the credential closes it and sandbox::* answers S301.
func TestSandboxHostServesTheRouter(t *testing.T) {
	te := newEnv(t, nil)
	cred := issueCredential(t, te, map[string]any{"label": "hosts/h1", "namespace": "sbx",
		"sandbox_host": map[string]any{"adapter": "remote", "host_name": "h1"}})
	host := dialHost(t, te.URL, cred, "remote", "sbx", []string{"remote::adapter::info", "remote::create", "remote::exec", "other::create"})
	rej := waitfor.Recv(t, host.rejected, waitFor, "the engine to reject other::create")
	assert.Equal(t, rej.Code, engine.CodeForbidden)
	assert.Equal(t, rej.FunctionID, "other::create")
	waitRegistered(t, te, "sbx", "remote::exec")
	o := te.router.trust.OwnerOf("sbx", "remote", "remote::create")
	assert.Assert(t, o.Trusted && o.Host == "h1", "%+v", o)

	assert.NilError(t, te.router.Bind("remote", "sbx"))
	for _, op := range []string{"create", "exec"} {
		out := te.MustCall(t, "sandbox::"+op, map[string]any{"image": "python", "sandbox_id": "remote-1", "cmd": "true"})
		assert.Equal(t, out["via"], "remote::"+op)
	}

	// The same functions bound under another adapter's name, or another
	// namespace, are not it.
	for _, tc := range []struct{ adapter, ns string }{{"other", "sbx"}, {"remote", "default"}} {
		t.Run(tc.adapter+"/"+tc.ns, func(t *testing.T) {
			assert.NilError(t, te.router.Bind(tc.adapter, tc.ns))
			_, err := te.Call(t, "sandbox::create", map[string]any{"image": "python"})
			assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S301)
		})
	}

	// A plain credential of the namespace is no adapter: never forwarded to.
	plain := issueCredential(t, te, map[string]any{"label": "plain", "namespace": "sbx"})
	squat := dialHost(t, te.URL, plain, "squat", "sbx", []string{"squat::adapter::info", "squat::create"})
	waitRegistered(t, te, "sbx", "squat::create")
	assert.NilError(t, te.router.Bind("squat", "sbx"))
	_, err := te.Call(t, "sandbox::create", map[string]any{"image": "python", "code": "secret"})
	se := enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S301)
	// Binding made squat a known adapter: the plain credential's
	// functions under it were evicted (docs/security.md, Adapter names).
	assert.Check(t, is.Contains(se.Message, "not running there"))
	assert.Check(t, !te.router.trust.OwnerOf("sbx", "squat", "squat::create").Registered)
	assert.DeepEqual(t, squat.calls(), []string(nil))

	// Revoked: the host's connection is closed, and sandbox::* is S301.
	assert.NilError(t, te.router.Bind("remote", "sbx"))
	te.MustCall(t, "sandbox::create", map[string]any{"image": "python"})
	n := len(host.calls())
	rev := te.MustCall(t, engine.FnCredentialsRevoke, map[string]any{"token": cred})
	assert.Equal(t, rev["revoked"], true)
	waitfor.Closed(t, host.closed, waitFor, "the revoked host's connection to close")
	for _, op := range []string{"create", "list", "exec"} {
		_, err := te.Call(t, "sandbox::"+op, map[string]any{"image": "python", "sandbox_id": "remote-1", "cmd": "true"})
		assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S301, op)
	}
	assert.Equal(t, len(host.calls()), n, "nothing reaches a revoked host")
}
