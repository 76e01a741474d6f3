package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/host/config"
	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// TestMain lets the test binary be the reaper of the Compose daemon the
// privilege test attaches (`<exe> __compose-reaper`), and checks that no
// goroutine outlives the tests.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == proc.ReaperCommand {
		os.Exit(proc.ReaperMain(os.Stdin, os.Stdout, os.Stderr, os.Args[2:]))
	}
	goleak.VerifyTestMain(m)
}

type running struct {
	s      *Server
	path   string
	stderr *syncbuf.Buffer
	cancel context.CancelFunc
	done   chan error
}

// engineEnv is an engine's environment in a test: a home of its own (so
// its ~/.iii token and credentials files are its own) and the test's
// name-value pairs, which may replace HOME; nothing of the process's
// environment, so that tests run side by side and a developer's
// III_ENGINE_TOKEN changes nothing.
func engineEnv(t *testing.T, kv ...string) map[string]string {
	t.Helper()
	if len(kv)%2 != 0 {
		t.Fatalf("engineEnv: odd name-value list %q", kv)
	}
	env := map[string]string{"HOME": t.TempDir()}
	for i := 0; i < len(kv); i += 2 {
		env[kv[i]] = kv[i+1]
	}
	return env
}

// lookupIn is Options.LookupEnv over env.
func lookupIn(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	}
}

// serve starts a server on the config at path, with an environment of its
// own, and serves it in the background; the test's cleanup stops it.
func serve(t *testing.T, path string) *running {
	t.Helper()
	return serveWith(t, path, engineEnv(t), hclog.NewNullLogger())
}

// serveWith is serve with the engine's environment env (engineEnv).
func serveWith(t *testing.T, path string, env map[string]string, log hclog.Logger) *running {
	t.Helper()
	r := &running{path: path, stderr: &syncbuf.Buffer{}, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	s, err := Start(ctx, Options{ConfigPath: path, Stderr: r.stderr, Logger: log, Version: "0.26.0", LookupEnv: lookupIn(env)})
	if err != nil {
		cancel()
		t.Fatalf("start: %v", err)
	}
	r.s = s
	go func() { r.done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Error("server did not stop")
		}
	})
	return r
}

// stopped waits for Serve to return on its own and gives its error.
func (r *running) stopped(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // let the cleanup see it too
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("server kept running")
		return nil
	}
}

func writeConfig(t *testing.T, path, content string) {
	t.Helper()
	// Write and rename, as editors do, so the watcher never sees half a file.
	tmp := path + ".tmp"
	assert.NilError(t, os.WriteFile(tmp, []byte(content), 0o644))
	assert.NilError(t, os.Rename(tmp, path))
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := loopback.FreePort()
	assert.NilError(t, err)
	return p
}

func listenerConfig(ports ...int) string {
	var b strings.Builder
	b.WriteString("workers:\n")
	for i, p := range ports {
		name := "iii-worker-manager"
		if i > 0 {
			name += "#" + strconv.Itoa(i)
		}
		fmt.Fprintf(&b, "  - name: %s\n    config: { host: 127.0.0.1, port: %d }\n", name, p)
	}
	return b.String()
}

// wsWorker is a raw-frame WebSocket worker.
type wsWorker struct {
	conn   *websocket.Conn
	frames chan protocol.Message
	next   int
}

// dial connects a raw worker without a token: what a worker, a VM worker
// or another user gets (privileged functions answer UNAUTHORIZED).
func dial(t *testing.T, addr string) *wsWorker { return dialToken(t, addr, "") }

// dialAdmin connects a raw worker that presents the server's engine token,
// as the same user's iii call does.
func dialAdmin(t *testing.T, r *running) *wsWorker {
	return dialToken(t, r.s.Addrs()["iii-worker-manager"], r.s.engineToken())
}

// dialSocket opens a raw worker socket to addr, presenting token when it
// is not empty.
func dialSocket(ctx context.Context, t *testing.T, addr, token string) *websocket.Conn {
	t.Helper()
	var opts *websocket.DialOptions
	if token != "" {
		opts = &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}}
	}
	conn, _, err := websocket.Dial(ctx, "ws://"+addr+"/", opts)
	assert.NilError(t, err)
	return conn
}

func dialToken(t *testing.T, addr, token string) *wsWorker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := dialSocket(ctx, t, addr, token)
	w := &wsWorker{conn: conn, frames: make(chan protocol.Message, 64)}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer close(w.frames)
		for {
			_, data, err := conn.Read(context.Background())
			if err != nil {
				return
			}
			if m, err := protocol.Decode(data); err == nil {
				w.frames <- m
			}
		}
	}()
	t.Cleanup(func() {
		conn.CloseNow()
		waitfor.Closed(t, readerDone, waitfor.Default, "the frame reader to stop")
	})
	m := w.read(t)
	_, ok := m.(*protocol.WorkerRegistered)
	assert.Assert(t, ok, "first frame is %T", m)
	return w
}

func (w *wsWorker) read(t *testing.T) protocol.Message {
	t.Helper()
	select {
	case m, ok := <-w.frames:
		if !ok {
			t.Fatal("connection closed")
		}
		return m
	case <-time.After(20 * time.Second):
		t.Fatal("no frame")
		return nil
	}
}

func (w *wsWorker) send(t *testing.T, m protocol.Message) {
	t.Helper()
	data, err := protocol.Encode(m)
	assert.NilError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	assert.NilError(t, w.conn.Write(ctx, websocket.MessageText, data))
}

// call invokes fn in the default namespace and waits for its result.
func (w *wsWorker) call(t *testing.T, fn, data string) (json.RawMessage, *protocol.ErrorBody) {
	t.Helper()
	w.next++
	id := fmt.Sprintf("call-%d", w.next)
	w.send(t, &protocol.InvokeFunction{InvocationID: id, FunctionID: fn, Data: json.RawMessage(data)})
	for {
		m := w.read(t)
		if r, ok := m.(*protocol.InvocationResult); ok && r.InvocationID == id {
			return r.Result, r.Error
		}
	}
}

func TestConfigurationOverWebSocket(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	port := freePort(t)
	writeConfig(t, path, fmt.Sprintf(`workers:
  - name: configuration
    config:
      adapter: { name: fs, config: { directory: ./settings } }
  - name: iii-worker-manager
    config: { port: %d }
`, port))
	r := serve(t, path)
	assert.DeepEqual(t, r.s.Addrs(), map[string]string{"iii-worker-manager": "127.0.0.1:" + strconv.Itoa(port)})

	w := dialAdmin(t, r)
	out, errb := w.call(t, "configuration::register", `{"id":"http","name":"HTTP","description":"d","schema":{"type":"object","properties":{"port":{"type":"integer"}}},"initial_value":{"port":"${III_TEST_UNSET_PORT:3111}"}}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	assert.Assert(t, strings.Contains(string(out), `"value":{"port":"${III_TEST_UNSET_PORT:3111}"}`), string(out))
	out, errb = w.call(t, "configuration::get", `{"id":"http"}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	assert.Equal(t, string(out), `{"id":"http","value":{"port":3111}}`)
	_, errb = w.call(t, "configuration::get", `{"id":"iii-sandbox","raw":true}`)
	assert.Assert(t, errb != nil)
	assert.Equal(t, errb.Code, "NOT_FOUND")
	_, errb = w.call(t, "configuration::set", `{"id":"http","value":{"port":"x"}}`)
	assert.Assert(t, errb != nil)
	assert.Equal(t, errb.Code, "SCHEMA_INVALID")

	// The value is in the directory named by config.yaml, relative to it.
	data, err := os.ReadFile(filepath.Join(dir, "settings", "http.yaml"))
	assert.NilError(t, err)
	assert.Assert(t, strings.Contains(string(data), "port: ${III_TEST_UNSET_PORT:3111}"), string(data))

	// Moving the directory in config.yaml reloads the worker over the new
	// one; the registration survives and the socket is untouched.
	other := filepath.Join(dir, "other")
	assert.NilError(t, os.MkdirAll(other, 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(other, "http.yaml"), []byte("id: http\nname: HTTP\ndescription: d\nvalue: {port: 9999}\n"), 0o644))
	writeConfig(t, path, fmt.Sprintf(`workers:
  - name: configuration
    config:
      adapter: { name: fs, config: { directory: ./other } }
  - name: iii-worker-manager
    config: { port: %d }
`, port))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		out, errb := w.call(t, "configuration::get", `{"id":"http"}`)
		if errb != nil || string(out) != `{"id":"http","value":{"port":9999}}` {
			return poll.Continue("get: %s %+v", out, errb)
		}
		return poll.Success()
	})
	_, errb = w.call(t, "configuration::set", `{"id":"http","value":{"port":1}}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	assert.Equal(t, r.s.Configuration().StoreDescription(), "fs:"+other)
}

func TestReloadListenerPort(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config.yaml")
	p1, p2 := freePort(t), freePort(t)
	writeConfig(t, path, listenerConfig(p1))
	r := serve(t, path)
	old := dial(t, "127.0.0.1:"+strconv.Itoa(p1))

	writeConfig(t, path, listenerConfig(p2))
	want := map[string]string{"iii-worker-manager": "127.0.0.1:" + strconv.Itoa(p2)}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if got := r.s.Addrs(); fmt.Sprint(got) != fmt.Sprint(want) {
			return poll.Continue("listening on %v", got)
		}
		return poll.Success()
	})
	dial(t, "127.0.0.1:"+strconv.Itoa(p2))
	_, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(p1), 5*time.Second)
	assert.Assert(t, err != nil, "the old port is closed")

	// The worker connected through the old port is still served.
	out, errb := old.call(t, "configuration::list", `{}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	assert.Equal(t, string(out), `{"configurations":[]}`)

	// A second instance comes and goes on its own port.
	p3 := freePort(t)
	writeConfig(t, path, listenerConfig(p2, p3))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if len(r.s.Addrs()) != 2 {
			return poll.Continue("listening on %v", r.s.Addrs())
		}
		return poll.Success()
	})
	dial(t, "127.0.0.1:"+strconv.Itoa(p3))
	assert.Equal(t, r.s.Addrs()["iii-worker-manager"], "127.0.0.1:"+strconv.Itoa(p2))
}

func TestInvalidReloadStops(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, content, code string
	}{
		{name: "syntax", content: "workers: [\n", code: config.CodeInvalidConfig},
		{name: "iii-sandbox", content: "workers:\n  - name: iii-sandbox\n    config: { image_allowlist: [python] }\n", code: config.CodeUnsupportedConfigWorkers},
		{name: "project worker", content: "workers:\n  - name: my-api\n", code: config.CodeUnsupportedConfigWorkers},
		{name: "unset variable", content: "sandbox: { namespace: '${III_TEST_UNSET_NS}' }\n", code: config.CodeUnsetVariable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "config.yaml")
			port := freePort(t)
			writeConfig(t, path, listenerConfig(port))
			r := serve(t, path)
			w := dial(t, "127.0.0.1:"+strconv.Itoa(port))

			writeConfig(t, path, tc.content)
			err := r.stopped(t)
			var ce *config.Error
			assert.Assert(t, errors.As(err, &ce), "%v", err)
			assert.Equal(t, ce.Code, tc.code)
			assert.Assert(t, strings.HasPrefix(r.stderr.String(), "engine stopped: "+path+" changed and cannot be applied"), r.stderr.String())
			assert.Assert(t, strings.Contains(r.stderr.String(), ce.Error()), r.stderr.String())

			// Everything is down: the port refuses, the socket is closed.
			_, derr := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 5*time.Second)
			assert.Assert(t, derr != nil)
			waitfor.Closed(t, w.frames, waitfor.Default, "the closed socket's frames to end")
		})
	}
}

func TestIiiSandboxRejectedAtStart(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, path, "workers:\n  - name: iii-sandbox\n    config:\n      image_allowlist: [python, node]\n")
	err := Run(context.Background(), Options{ConfigPath: path, LookupEnv: lookupIn(engineEnv(t))})
	var ce *config.Error
	assert.Assert(t, errors.As(err, &ce), "%v", err)
	assert.Equal(t, ce.Code, config.CodeUnsupportedConfigWorkers)
	golden.Assert(t, strings.ReplaceAll(err.Error(), path, "config.yaml")+"\n", "start_iii_sandbox.golden")
}

func TestStartErrors(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	// Held until the parallel subtests are done, after this body returns.
	t.Cleanup(func() { _ = busy.Close() })
	busyPort := busy.Addr().(*net.TCPAddr).Port
	tests := []struct {
		name    string
		content string
		env     []string
		code    string
	}{
		{name: "grace_env_text", content: "workers: []\n", env: []string{GraceEnv, "soon"}, code: config.CodeInvalidConfig},
		{name: "grace_env_zero", content: "workers: []\n", env: []string{GraceEnv, "0"}, code: config.CodeInvalidConfig},
		{name: "listen_failed", content: listenerConfig(busyPort), code: "LISTEN_FAILED"},
		{name: "configuration_store_unusable", content: "workers:\n  - name: configuration\n    config: { adapter: { config: { directory: ./config.yaml } } }\n  - name: iii-worker-manager\n    config: { port: 0 }\n", code: "ADAPTER_ERROR"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			path := filepath.Join(dir, "config.yaml")
			writeConfig(t, path, tc.content)
			err := Run(context.Background(), Options{ConfigPath: path, LookupEnv: lookupIn(engineEnv(t, tc.env...))})
			assert.Assert(t, err != nil)
			assert.Assert(t, strings.HasPrefix(err.Error(), tc.code+": "), err.Error())
			msg := strings.ReplaceAll(err.Error(), dir, "<dir>")
			msg = strings.ReplaceAll(msg, strconv.Itoa(busyPort), "<port>")
			golden.Assert(t, msg+"\n", "start_"+tc.name+".golden")
		})
	}
}

// TestMissingFile stays serial: the default path is config.yaml in the
// working directory, which only t.Chdir can give a test of its own.
func TestMissingFile(t *testing.T) {
	t.Run("interactive no", func(t *testing.T) {
		t.Chdir(t.TempDir())
		var stderr bytes.Buffer
		err := Run(context.Background(), Options{Interactive: true, Stdin: strings.NewReader("n\n"), Stderr: &stderr})
		var ce *config.Error
		assert.Assert(t, errors.As(err, &ce), "%v", err)
		assert.Equal(t, ce.Code, config.CodeConfigNotFound)
		assert.Equal(t, stderr.String(), "config.yaml does not exist. Create it with no workers (workers: [])? [y/N] ")
		_, statErr := os.Stat("config.yaml")
		assert.Assert(t, errors.Is(statErr, os.ErrNotExist))
	})
	t.Run("non-interactive creates it", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "engine.yaml")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var stderr bytes.Buffer
		s, err := Start(ctx, Options{ConfigPath: path, Stderr: &stderr, LookupEnv: lookupIn(engineEnv(t))})
		data, readErr := os.ReadFile(path)
		assert.NilError(t, readErr, "the file is created before anything else")
		assert.Equal(t, string(data), "workers: []\n")
		assert.Equal(t, stderr.String(), "", "no prompt without a terminal")
		if err != nil {
			t.Logf("default port busy: %v", err)
			// The created file declares no listener, so the engine takes the
			// default port; another engine on this machine may hold it.
			assert.Assert(t, strings.HasPrefix(err.Error(), "LISTEN_FAILED: iii-worker-manager cannot listen on 127.0.0.1:49134"), err.Error())
			return
		}
		assert.DeepEqual(t, s.Addrs(), map[string]string{"iii-worker-manager": "127.0.0.1:49134"})
		assert.Equal(t, s.Config().Configuration.Directory, filepath.Join(dir, "config"))
		cancel()
		assert.NilError(t, s.Serve(ctx))
	})
}

func TestSandboxBinding(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config.yaml")
	port := freePort(t)
	writeConfig(t, path, listenerConfig(port))
	r := serve(t, path)
	assert.Assert(t, r.s.Sandbox() == nil, "no section, no binding")

	writeConfig(t, path, listenerConfig(port)+"sandbox:\n  namespace: dev\n")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if b := r.s.Sandbox(); b == nil || *b != (config.Sandbox{Adapter: "sandbox-libkrun", Namespace: "dev"}) {
			return poll.Continue("binding %+v", b)
		}
		return poll.Success()
	})
	// The listener was not touched by a sandbox-only change.
	assert.Equal(t, r.s.Addrs()["iii-worker-manager"], "127.0.0.1:"+strconv.Itoa(port))

	writeConfig(t, path, listenerConfig(port))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if b := r.s.Sandbox(); b != nil {
			return poll.Continue("binding %+v", b)
		}
		return poll.Success()
	})
}

// TestGraceEnvOverride: III_NAMESPACE_GRACE_MS beats the file. The file
// asks for an hour; with the override, a worker that never names its
// namespace has its function registered in default almost at once.
func TestGraceEnvOverride(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config.yaml")
	port := freePort(t)
	writeConfig(t, path, "registration_namespace_grace_ms: 3600000\n"+listenerConfig(port))
	r := serveWith(t, path, engineEnv(t, GraceEnv, "20"), hclog.NewNullLogger())
	w := dial(t, "127.0.0.1:"+strconv.Itoa(port))
	w.send(t, &protocol.RegisterFunction{ID: "test::echo"})
	var answered sync.WaitGroup
	answered.Add(1)
	go func() {
		defer answered.Done()
		for m := range w.frames {
			if inv, ok := m.(*protocol.InvokeFunction); ok {
				data, _ := protocol.Encode(&protocol.InvocationResult{InvocationID: inv.InvocationID, FunctionID: inv.FunctionID, Result: inv.Data})
				_ = w.conn.Write(context.Background(), websocket.MessageText, data)
				return
			}
		}
	}()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		out, err := r.s.Engine().Invoke(ctx, "default", "test::echo", json.RawMessage(`{"x":1}`))
		if err != nil {
			return poll.Continue("invoke: %v", err)
		}
		if !strings.Contains(string(out), `"x":1`) {
			return poll.Error(fmt.Errorf("echo returned %s", out))
		}
		return poll.Success()
	})
	waitfor.Group(t, &answered, waitfor.Default, "the worker to answer the echo invocation")
}

func TestCleanStop(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config.yaml")
	port := freePort(t)
	writeConfig(t, path, listenerConfig(port))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var stderr syncbuf.Buffer
	env := lookupIn(engineEnv(t))
	go func() { done <- Run(ctx, Options{ConfigPath: path, Stderr: &stderr, LookupEnv: env}) }()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err != nil {
			return poll.Continue("not listening yet: %v", err)
		}
		c.Close()
		return poll.Success()
	})
	cancel()
	assert.NilError(t, waitfor.Recv(t, done, waitfor.Default, "Run to return after cancel"))
	assert.Equal(t, stderr.String(), "")
	_, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	assert.Assert(t, err != nil, "the listener is closed")
}

func TestRemovedFileStops(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, path, listenerConfig(freePort(t)))
	r := serve(t, path)
	assert.NilError(t, os.Remove(path))
	err := r.stopped(t)
	var ce *config.Error
	assert.Assert(t, errors.As(err, &ce), "%v", err)
	assert.Equal(t, ce.Code, config.CodeConfigNotFound)
}
