package engine

import (
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// The published Node SDK (iii-sdk 0.22.1, installed by make setup-test) must
// work against this engine unchanged. These tests run it for real.

// sdkScript drives the SDK as a worker or a caller (see its header); every
// line it prints is JSON.
var sdkScript = nodesdk.Script{Path: filepath.Join("testdata", "node", "sdk.mjs"), RejectNonJSON: true}

// startNode runs a job; the process ends when the test does.
func startNode(t *testing.T, ne nodesdk.SDK, job map[string]any) *nodesdk.Proc {
	t.Helper()
	return ne.Start(t, sdkScript, job, waitFor)
}

// runNode runs a caller job to completion and returns its result lines.
func runNode(t *testing.T, ne nodesdk.SDK, job map[string]any) []map[string]any {
	t.Helper()
	p := startNode(t, ne, job)
	calls := job["calls"].([]map[string]any)
	out := make([]map[string]any, 0, len(calls))
	for range calls {
		out = append(out, p.Line(t, 2*waitFor))
	}
	select {
	case <-p.Done():
		assert.NilError(t, p.Err(), "the caller exits cleanly")
	case <-time.After(waitFor):
		t.Fatal("caller did not exit")
	}
	return out
}

// ownerName of (ns, id), or "" while it is not registered.
func ownerOf(te *testEngine, ns, id string) string {
	f := te.reg.get(ns, id)
	if f == nil {
		return ""
	}
	return f.owner.name()
}

func TestNodeSDKCallsAndErrors(t *testing.T) {
	ne := nodesdk.Find(t)
	te := startEngine(t, Options{})
	startNode(t, ne, map[string]any{"mode": "serve", "url": te.url, "name": "node-svc", "functions": []string{"nodeacc::echo", "nodeacc::fail"}})
	pollUntil(t, "node worker registered", func() bool {
		return ownerOf(te, DefaultNamespace, "nodeacc::echo") == "node-svc" && ownerOf(te, DefaultNamespace, "nodeacc::fail") == "node-svc"
	})

	res := runNode(t, ne, map[string]any{"mode": "call", "url": te.url, "name": "node-caller", "calls": []map[string]any{
		{"function_id": "nodeacc::echo", "payload": map[string]any{"x": 1, "s": "héllo"}},
		{"function_id": "nodeacc::fail", "payload": map[string]any{"reason": "bad input"}},
		{"function_id": "nodeacc::missing", "payload": map[string]any{}},
	}})

	assert.Equal(t, res[0]["ok"], true, "%v", res[0])
	result := res[0]["result"].(map[string]any)
	assert.Equal(t, result["by"], "node-svc")
	echo := result["echo"].(map[string]any)
	assert.Equal(t, echo["x"], 1.0)
	assert.Equal(t, echo["s"], "héllo")
	assert.Assert(t, echo["_caller_worker_id"] != nil, "the engine told the handler who called")

	assert.Equal(t, res[1]["ok"], false)
	assert.Equal(t, res[1]["code"], protocol.CodeInvocationFailed)
	assert.Check(t, is.Contains(res[1]["message"].(string), "handler exploded: bad input"))

	assert.Equal(t, res[2]["ok"], false)
	assert.Equal(t, res[2]["code"], protocol.CodeFunctionNotFound)
	assert.Check(t, is.Contains(res[2]["message"].(string), "Function nodeacc::missing not found in namespace default."))

	// The SDK's self-description reached engine::workers::list.
	out := invokeJSON(t, te, FnWorkersList, map[string]any{"search": "node-svc"})
	w := out["workers"].([]any)[0].(map[string]any)
	assert.Equal(t, w["runtime"], "node")
	assert.Equal(t, w["version"], "0.22.1")
	assert.Equal(t, w["namespace"], "default")
}

func TestNodeSDKNamespaces(t *testing.T) {
	ne := nodesdk.Find(t)
	te := startEngine(t, Options{})
	startNode(t, ne, map[string]any{"mode": "serve", "url": te.url, "name": "orders-svc", "namespace": "orders",
		"functions": []string{"shared::echo", "only::orders"}})
	startNode(t, ne, map[string]any{"mode": "serve", "url": te.url, "name": "default-svc", "functions": []string{"shared::echo"}})
	pollUntil(t, "both workers registered", func() bool {
		return ownerOf(te, "orders", "shared::echo") == "orders-svc" && ownerOf(te, "orders", "only::orders") == "orders-svc" &&
			ownerOf(te, DefaultNamespace, "shared::echo") == "default-svc"
	})
	assert.Equal(t, ownerOf(te, DefaultNamespace, "only::orders"), "", "namespaced registrations never leak into default")

	// A namespaced Node caller: 0.22.1 sends no namespace on invokes, so its
	// calls route strictly to default, and engine::* resolves there too.
	res := runNode(t, ne, map[string]any{"mode": "call", "url": te.url, "name": "orders-caller", "namespace": "orders", "calls": []map[string]any{
		{"function_id": "shared::echo", "payload": map[string]any{"n": 1}},
		{"function_id": "only::orders", "payload": map[string]any{}},
		{"function_id": "engine::functions::list", "payload": map[string]any{"prefix": "only::"}},
		{"function_id": "engine::workers::list", "payload": map[string]any{"search": "orders-caller"}},
	}})
	assert.Equal(t, res[0]["ok"], true, "%v", res[0])
	assert.Equal(t, res[0]["result"].(map[string]any)["by"], "default-svc")
	assert.Equal(t, res[1]["ok"], false)
	assert.Equal(t, res[1]["code"], protocol.CodeFunctionNotFound)
	assert.Check(t, is.Contains(res[1]["message"].(string), "Function only::orders not found in namespace default. It is registered in namespace(s): orders."))
	assert.Equal(t, res[2]["ok"], true, "%v", res[2])
	fns := res[2]["result"].(map[string]any)["functions"].([]any)
	assert.Equal(t, len(fns), 1)
	assert.Equal(t, fns[0].(map[string]any)["namespace"], "orders")
	assert.Equal(t, res[3]["ok"], true, "%v", res[3])
	ws := res[3]["result"].(map[string]any)["workers"].([]any)
	assert.Equal(t, len(ws), 1)
	assert.Equal(t, ws[0].(map[string]any)["namespace"], "orders", "the worker's own register (namespace first) won over the SDK's")

	// A caller naming the namespace reaches the namespaced worker.
	g := te.dial(t)
	r := g.call("ns-1", "shared::echo", ptr("orders"), `{"n":2}`)
	assert.Equal(t, r.obj("result").str("by"), "orders-svc")
}

// partitionProxy relays TCP between SDK workers and the engine. Partition
// cuts the worker side only, leaving the engine side open: to the engine the
// old connection still looks alive, as after a network partition.
type partitionProxy struct {
	t       testing.TB
	ln      net.Listener
	target  string
	mu      sync.Mutex
	clients []net.Conn
	engines []net.Conn
	wg      sync.WaitGroup
}

func newPartitionProxy(t *testing.T, target string) *partitionProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	p := &partitionProxy{t: t, ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *partitionProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		e, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.clients = append(p.clients, c)
		p.engines = append(p.engines, e)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); _, _ = io.Copy(e, c) }()
		go func() { defer p.wg.Done(); _, _ = io.Copy(c, e) }()
	}
}

// partition closes the worker-side sockets. The engine-side ones stay open
// and silent (the copy from the worker side just stops).
func (p *partitionProxy) partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.clients {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
	p.clients = nil
}

func (p *partitionProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range append(p.clients, p.engines...) {
		_ = c.Close()
	}
	p.mu.Unlock()
	waitfor.Group(p.t, &p.wg, waitFor, "the partition proxy's copy goroutines to end")
}

func TestNodeSDKReconnectKeepsFunctions(t *testing.T) {
	ne := nodesdk.Find(t)

	t.Run("engine drops the connection", func(t *testing.T) {
		te := startEngine(t, Options{})
		startNode(t, ne, map[string]any{"mode": "serve", "url": te.url, "name": "re-svc", "functions": []string{"re::echo"}})
		pollUntil(t, "registered", func() bool { return ownerOf(te, DefaultNamespace, "re::echo") == "re-svc" })
		old := te.reg.get(DefaultNamespace, "re::echo").owner
		// Test hook: cut the socket from the engine side, abruptly.
		_ = old.conn.c.CloseNow()
		pollUntil(t, "re-registered by the reconnected worker", func() bool {
			f := te.reg.get(DefaultNamespace, "re::echo")
			return f != nil && f.owner != old && f.owner.name() == "re-svc"
		})
		res := runNode(t, ne, map[string]any{"mode": "call", "url": te.url, "name": "re-caller", "calls": []map[string]any{
			{"function_id": "re::echo", "payload": map[string]any{"after": "reconnect"}},
		}})
		assert.Equal(t, res[0]["ok"], true, "%v", res[0])
	})

	t.Run("reattach evicts a half-open previous connection", func(t *testing.T) {
		logs := &syncbuf.Buffer{}
		logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: logs})
		te := startEngine(t, Options{Logger: logger})
		proxy := newPartitionProxy(t, strings.TrimPrefix(te.url, "ws://"))
		startNode(t, ne, map[string]any{"mode": "serve", "url": "ws://" + proxy.ln.Addr().String(), "name": "ra-svc", "functions": []string{"ra::echo"}})
		pollUntil(t, "registered", func() bool { return ownerOf(te, DefaultNamespace, "ra::echo") == "ra-svc" })
		old := te.reg.get(DefaultNamespace, "ra::echo").owner

		proxy.partition()
		// The SDK reconnects and proves it is the same worker with its token;
		// the engine evicts the old, still-open connection, so the resent
		// name and functions are not refused as conflicts.
		pollUntil(t, "re-registered after reattach", func() bool {
			f := te.reg.get(DefaultNamespace, "ra::echo")
			return f != nil && f.owner != old && f.owner.name() == "ra-svc"
		})
		assert.Assert(t, old.closing.Load(), "the previous connection was evicted")
		assert.Check(t, is.Contains(logs.String(), "reattach: evicting previous connection"))
		select {
		case <-old.done:
		case <-time.After(waitFor):
			t.Fatal("evicted connection not cleaned up")
		}
		res := runNode(t, ne, map[string]any{"mode": "call", "url": te.url, "name": "ra-caller", "calls": []map[string]any{
			{"function_id": "ra::echo", "payload": map[string]any{"after": "reattach"}},
		}})
		assert.Equal(t, res[0]["ok"], true, "%v", res[0])
		assert.Equal(t, res[0]["result"].(map[string]any)["by"], "ra-svc")
	})
}
