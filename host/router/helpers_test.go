package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/protocol"
)

// waitFor bounds waits; a hang guard, not a timing assertion.
const waitFor = 30 * time.Second

// testEnv is a real engine on a loopback WebSocket server with the plugin
// host and the router attached, and a Go client connected as a worker.
type testEnv struct {
	eng    *engine.Engine
	url    string
	host   *pluginhost.Host
	router *Router
	cl     *client.Client
	logs   *lockedBuffer
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newEnv(t testing.TB, configBinding func() (Binding, bool)) *testEnv {
	t.Helper()
	logs := &lockedBuffer{}
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: logs})
	eng := engine.New(engine.Options{Logger: log.Named("engine")})
	srv := httptest.NewServer(eng.Handler())
	wsURL := "ws" + strings.TrimPrefix(srv.URL, "http")
	home := t.TempDir()
	h, err := pluginhost.New(eng, pluginhost.Options{Logger: log.Named("engine"), Finder: pluginhost.Finder{
		Getenv:     func(string) string { return "" },
		HomeDir:    func() (string, error) { return home, nil },
		Executable: func() (string, error) { return filepath.Join(home, "iii"), nil },
	}})
	assert.NilError(t, err)
	r, err := New(eng, Options{Logger: log.Named(WorkerName), ConfigBinding: configBinding, Hosted: h.Hosted,
		EngineURL: func() string { return wsURL }})
	assert.NilError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cl, err := client.Dial(ctx, wsURL, client.Options{Name: "test-caller", IgnoreEnv: true,
		Reconnect: client.ReconnectPolicy{Disable: true}, CallTimeout: waitFor})
	assert.NilError(t, err)
	te := &testEnv{eng: eng, url: wsURL, host: h, router: r, cl: cl, logs: logs}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		assert.Check(t, h.Close(ctx))
		r.Close()
		assert.Check(t, cl.Close(ctx))
		assert.Check(t, eng.Close(ctx))
		srv.Close()
		assert.Check(t, len(adapterProcesses(testBinDir)) == 0, "no adapter process outlives the engine")
		if t.Failed() {
			t.Logf("engine log:\n%s", logs.String())
		}
	})
	return te
}

func (te *testEnv) startAdapter(t testing.TB, name, ns string, extra map[string]any) pluginhost.Status {
	t.Helper()
	cfg := map[string]any{"image_allowlist": []string{"python", "shell"}, "state_dir": t.TempDir()}
	for k, v := range extra {
		cfg[k] = v
	}
	raw, err := json.Marshal(cfg)
	assert.NilError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	st, err := te.host.Start(ctx, pluginhost.StartRequest{Adapter: name, Namespace: ns, Path: testBin(t, name), Config: raw})
	assert.NilError(t, err)
	return st
}

func (te *testEnv) call(t *testing.T, fn string, payload any) (json.RawMessage, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	return te.cl.Call(ctx, fn, payload)
}

func (te *testEnv) mustCall(t *testing.T, fn string, payload any) map[string]any {
	t.Helper()
	out, err := te.call(t, fn, payload)
	assert.NilError(t, err, "call %s", fn)
	var m map[string]any
	assert.NilError(t, json.Unmarshal(out, &m))
	return m
}

// sandboxErr is the S-code error of a failed call: code = the S-code and
// message = the wire JSON.
func sandboxErr(t *testing.T, err error) *contract.Error {
	t.Helper()
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb), "a remote error, got %v", err)
	se, ok := contract.FromErrorBody(eb)
	assert.Assert(t, ok, "the message carries a sandbox error: %q", eb.Message)
	assert.Equal(t, string(se.Code), eb.Code, "the error code is the S-code")
	return se
}

func pollUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if cond() {
			return poll.Success()
		}
		return poll.Continue("%s", what)
	}, poll.WithTimeout(timeout), poll.WithDelay(10*time.Millisecond))
}

// adapterProcesses lists live processes whose command line names a file
// in dir; zombies are not counted.
func adapterProcesses(dir string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(dir+"/")) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
				continue
			}
		}
		pids = append(pids, pid)
	}
	return pids
}

// ── the published Node SDK ───────────────────────────────────────────────

type nodeEnv struct {
	node, script, sdkURL string
}

func findNode(t *testing.T) nodeEnv {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed; the Node SDK tests need it (make setup-test)")
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
	return nodeEnv{node: node, script: filepath.Join(dir, "testdata", "node", "sandbox.mjs"),
		sdkURL: (&url.URL{Scheme: "file", Path: entry}).String()}
}

type nodeProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan map[string]any
	done  chan struct{}
	err   error
}

// start runs a job; the process ends when the test does (its stdin closes).
func (ne nodeEnv) start(t *testing.T, job map[string]any) *nodeProc {
	t.Helper()
	raw, err := json.Marshal(job)
	assert.NilError(t, err)
	cmd := exec.Command(ne.node, ne.script, string(raw))
	cmd.Env = append(os.Environ(), "III_SDK_URL="+ne.sdkURL)
	stdin, err := cmd.StdinPipe()
	assert.NilError(t, err)
	stdout, err := cmd.StdoutPipe()
	assert.NilError(t, err)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	assert.NilError(t, cmd.Start())
	p := &nodeProc{cmd: cmd, stdin: stdin, lines: make(chan map[string]any, 100), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				p.lines <- m
			}
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("node stderr (%v):\n%s", job["mode"], stderr.String())
		}
	})
	return p
}

// stop closes the script's stdin, which shuts its SDK down, and waits.
func (p *nodeProc) stop() {
	_ = p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(waitFor):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
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
	case <-time.After(waitFor):
		t.Fatal("node printed nothing")
	}
	return nil
}

// run runs a caller job to completion and returns its result lines.
func (ne nodeEnv) run(t *testing.T, te *testEnv, calls []map[string]any) []map[string]any {
	t.Helper()
	p := ne.start(t, map[string]any{"mode": "call", "url": te.url, "name": "node-caller", "calls": calls})
	out := make([]map[string]any, 0, len(calls))
	for range calls {
		out = append(out, p.line(t))
	}
	return out
}
