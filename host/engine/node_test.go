package engine

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/protocol"
)

// The published Node SDK (iii-sdk 0.22.1, installed by make setup-test) must
// work against this engine unchanged. These tests run it for real.

type nodeEnv struct {
	node   string
	script string
	sdkURL string
}

func findNode(t *testing.T) nodeEnv {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed; the Node SDK acceptance tests need it (make setup-test)")
	}
	dir, err := os.Getwd()
	assert.NilError(t, err)
	root := dir
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			t.Fatal("repository root (go.mod) not found above " + dir)
		}
		root = parent
	}
	entry := filepath.Join(root, "testdata", "nodesdk", "node_modules", "iii-sdk", "dist", "index.mjs")
	if _, err := os.Stat(entry); err != nil {
		t.Skipf("the Node SDK is not installed at %s; run make setup-test", entry)
	}
	return nodeEnv{
		node:   node,
		script: filepath.Join(dir, "testdata", "node", "sdk.mjs"),
		sdkURL: (&url.URL{Scheme: "file", Path: entry}).String(),
	}
}

type nodeProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan map[string]any
	done  chan struct{}
	err   error
}

func (ne nodeEnv) start(t *testing.T, job map[string]any) *nodeProc {
	t.Helper()
	cmd := exec.Command(ne.node, ne.script, string(mustJSON(t, job)))
	cmd.Env = append(os.Environ(), "III_SDK_URL="+ne.sdkURL)
	stdin, err := cmd.StdinPipe()
	assert.NilError(t, err)
	stdout, err := cmd.StdoutPipe()
	assert.NilError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &syncWriter{w: &stderr}
	assert.NilError(t, cmd.Start())
	p := &nodeProc{cmd: cmd, stdin: stdin, lines: make(chan map[string]any, 100), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				t.Errorf("node printed a non-JSON line: %q", sc.Text())
				continue
			}
			p.lines <- m
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		select {
		case <-p.done:
		case <-time.After(waitFor):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("node stderr (%v):\n%s", job["name"], stderr.String())
		}
	})
	return p
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// String returns what was written so far (the writer must be a
// *strings.Builder).
func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.(*strings.Builder).String()
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

func (p *nodeProc) line(t *testing.T) map[string]any {
	t.Helper()
	select {
	case m := <-p.lines:
		return m
	case <-p.done:
		select {
		case m := <-p.lines:
			return m
		default:
		}
		t.Fatalf("node exited before printing: %v", p.err)
	case <-time.After(2 * waitFor):
		t.Fatal("node printed nothing")
	}
	return nil
}

// run runs a caller job to completion and returns its result lines.
func (ne nodeEnv) run(t *testing.T, job map[string]any) []map[string]any {
	t.Helper()
	p := ne.start(t, job)
	calls := job["calls"].([]map[string]any)
	out := make([]map[string]any, 0, len(calls))
	for range calls {
		out = append(out, p.line(t))
	}
	select {
	case <-p.done:
		assert.NilError(t, p.err, "the caller exits cleanly")
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
	ne := findNode(t)
	te := startEngine(t, Options{})
	ne.start(t, map[string]any{"mode": "serve", "url": te.url, "name": "node-svc", "functions": []string{"nodeacc::echo", "nodeacc::fail"}})
	pollUntil(t, "node worker registered", func() bool {
		return ownerOf(te, DefaultNamespace, "nodeacc::echo") == "node-svc" && ownerOf(te, DefaultNamespace, "nodeacc::fail") == "node-svc"
	})

	res := ne.run(t, map[string]any{"mode": "call", "url": te.url, "name": "node-caller", "calls": []map[string]any{
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
	ne := findNode(t)
	te := startEngine(t, Options{})
	ne.start(t, map[string]any{"mode": "serve", "url": te.url, "name": "orders-svc", "namespace": "orders",
		"functions": []string{"shared::echo", "only::orders"}})
	ne.start(t, map[string]any{"mode": "serve", "url": te.url, "name": "default-svc", "functions": []string{"shared::echo"}})
	pollUntil(t, "both workers registered", func() bool {
		return ownerOf(te, "orders", "shared::echo") == "orders-svc" && ownerOf(te, "orders", "only::orders") == "orders-svc" &&
			ownerOf(te, DefaultNamespace, "shared::echo") == "default-svc"
	})
	assert.Equal(t, ownerOf(te, DefaultNamespace, "only::orders"), "", "namespaced registrations never leak into default")

	// A namespaced Node caller: 0.22.1 sends no namespace on invokes, so its
	// calls route strictly to default, and engine::* resolves there too.
	res := ne.run(t, map[string]any{"mode": "call", "url": te.url, "name": "orders-caller", "namespace": "orders", "calls": []map[string]any{
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
	p := &partitionProxy{ln: ln, target: target}
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
	p.wg.Wait()
}

func TestNodeSDKReconnectKeepsFunctions(t *testing.T) {
	ne := findNode(t)

	t.Run("engine drops the connection", func(t *testing.T) {
		te := startEngine(t, Options{})
		ne.start(t, map[string]any{"mode": "serve", "url": te.url, "name": "re-svc", "functions": []string{"re::echo"}})
		pollUntil(t, "registered", func() bool { return ownerOf(te, DefaultNamespace, "re::echo") == "re-svc" })
		old := te.reg.get(DefaultNamespace, "re::echo").owner
		// Test hook: cut the socket from the engine side, abruptly.
		_ = old.conn.c.CloseNow()
		pollUntil(t, "re-registered by the reconnected worker", func() bool {
			f := te.reg.get(DefaultNamespace, "re::echo")
			return f != nil && f.owner != old && f.owner.name() == "re-svc"
		})
		res := ne.run(t, map[string]any{"mode": "call", "url": te.url, "name": "re-caller", "calls": []map[string]any{
			{"function_id": "re::echo", "payload": map[string]any{"after": "reconnect"}},
		}})
		assert.Equal(t, res[0]["ok"], true, "%v", res[0])
	})

	t.Run("reattach evicts a half-open previous connection", func(t *testing.T) {
		var buf strings.Builder
		logs := &syncWriter{w: &buf}
		logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: logs})
		te := startEngine(t, Options{Logger: logger})
		proxy := newPartitionProxy(t, strings.TrimPrefix(te.url, "ws://"))
		ne.start(t, map[string]any{"mode": "serve", "url": "ws://" + proxy.ln.Addr().String(), "name": "ra-svc", "functions": []string{"ra::echo"}})
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
		res := ne.run(t, map[string]any{"mode": "call", "url": te.url, "name": "ra-caller", "calls": []map[string]any{
			{"function_id": "ra::echo", "payload": map[string]any{"after": "reattach"}},
		}})
		assert.Equal(t, res[0]["ok"], true, "%v", res[0])
		assert.Equal(t, res[0]["result"].(map[string]any)["by"], "ra-svc")
	})
}
