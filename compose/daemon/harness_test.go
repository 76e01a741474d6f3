package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/host/server"
	"github.com/iii-sandbox/iii/internal/enginetoken"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// waitFor bounds every wait in these tests; a safety net, not a timing.
const waitFor = 60 * time.Second

// nodeSDK is node and the published iii-sdk, with the Node test worker;
// tests that run Node workers skip without them (make setup-test installs
// the SDK).
type nodeSDK struct {
	nodesdk.SDK
	worker string
}

func findNode(t *testing.T) nodeSDK {
	t.Helper()
	sdk := nodesdk.Find(t)
	wd, err := os.Getwd()
	assert.NilError(t, err)
	return nodeSDK{SDK: sdk, worker: filepath.Join(wd, "testdata", "node", "worker.mjs")}
}

// runCommand is the scripts.run of a Node test worker.
func (n nodeSDK) runCommand() string { return n.Node + " " + n.worker }

// testEngine is a real engine (host/server: configuration worker, plugin
// host, router, listener) on a loopback port, with a home of its own: its
// token file and persisted credentials are its own, so that tests run side
// by side and never touch the user's ~/.iii.
type testEngine struct {
	url string
	srv *server.Server
	// home is the engine's HOME; token is the engine token it made in
	// home/.iii/engine-token ("" when config.yaml sets engine_token).
	home  string
	token string
}

// engineSetup is what a test engine runs with beyond the defaults.
type engineSetup struct {
	// extra is appended to config.yaml.
	extra string
	// port is the listener's (0: any free one; an engine that restarts
	// on the same port is given it).
	port int
	// home is the engine's HOME ("": a new one).
	home string
	// pluginPath is the engine's III_PLUGIN_PATH.
	pluginPath string
}

func startEngine(t *testing.T, extra string) *testEngine {
	t.Helper()
	eng, _ := startEngineWith(t, engineSetup{extra: extra})
	return eng
}

// startEngineWith starts an engine; stop stops it before the test's end
// (the cleanup does otherwise).
func startEngineWith(t *testing.T, setup engineSetup) (eng *testEngine, stop func()) {
	t.Helper()
	dir := t.TempDir()
	if setup.home == "" {
		setup.home = t.TempDir()
	}
	env := map[string]string{"HOME": setup.home}
	if setup.pluginPath != "" {
		env[pluginhost.EnvPluginPath] = setup.pluginPath
	}
	cfg := filepath.Join(dir, "config.yaml")
	content := fmt.Sprintf("workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\n  - name: configuration\n    config: { adapter: { name: fs, config: { directory: %s } } }\n%s",
		setup.port, filepath.Join(dir, "store"), setup.extra)
	assert.NilError(t, os.WriteFile(cfg, []byte(content), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.Start(ctx, server.Options{ConfigPath: cfg, Logger: hclog.NewNullLogger(), Version: "0.26.0",
		LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	if err != nil {
		cancel()
		t.Fatalf("start the engine: %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	var stopped bool
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			waitfor.Recv(t, served, waitFor, "the engine to stop")
		}
	}
	t.Cleanup(stop)
	eng = &testEngine{url: "ws://" + srv.Addrs()["iii-worker-manager"], srv: srv, home: setup.home}
	// No file when config.yaml's engine_token is in force.
	tok, err := enginetoken.Read(filepath.Join(setup.home, enginetoken.Dir, enginetoken.FileName))
	switch {
	case err == nil:
		eng.token = tok
	case !errors.Is(err, fs.ErrNotExist):
		t.Fatalf("the test engine's token: %v", err)
	}
	return eng, stop
}

// port is the engine's listener port.
func (e *testEngine) port(t *testing.T) int {
	t.Helper()
	_, p, err := net.SplitHostPort(strings.TrimPrefix(e.url, "ws://"))
	assert.NilError(t, err)
	n, err := strconv.Atoi(p)
	assert.NilError(t, err)
	return n
}

// caller is a plain worker that calls compose::* the way `iii call` does:
// with the same user's engine token.
func (e *testEngine) caller(t *testing.T) *client.Client {
	t.Helper()
	return callerWithToken(t, e.url, e.token)
}

// attach is opts for a daemon attached to e: its URL and, as
// $III_ENGINE_TOKEN (the engine's home is not the process's), its token,
// unless opts.LookupEnv gives one; everything else opts.LookupEnv (nil:
// the process's environment) answers.
func (e *testEngine) attach(opts Options) Options {
	opts.EngineURL = e.url
	base := opts.LookupEnv
	if base == nil {
		base = os.LookupEnv
	}
	given := opts.LookupEnv != nil
	opts.LookupEnv = func(k string) (string, bool) {
		if k == client.EnvEngineToken {
			if v, ok := base(k); given && ok && v != "" {
				return v, ok
			}
			return e.token, e.token != ""
		}
		return base(k)
	}
	return opts
}

// testDaemon is a Compose daemon run in-process with Run, as `iii compose`
// runs it.
type testDaemon struct {
	info   Info
	cancel context.CancelFunc
	done   chan error
	out    *syncbuf.Buffer
}

func startDaemon(t *testing.T, opts Options) *testDaemon {
	t.Helper()
	td := &testDaemon{done: make(chan error, 1), out: &syncbuf.Buffer{}}
	served := make(chan Info, 1)
	opts.OnServe = func(i Info) { served <- i }
	// Hermetic packages: an empty registry unless the test gives one,
	// and a cache of its own.
	if opts.Packages.Registry == "" {
		opts.Packages.Registry = emptyRegistry(t)
	}
	if opts.Packages.Cache == "" {
		opts.Packages.Cache = t.TempDir()
	}
	if opts.Out == nil {
		opts.Out = td.out
	}
	if opts.Logger == nil {
		opts.Logger = hclog.New(&hclog.LoggerOptions{Output: td.out, Level: hclog.Info})
	}
	ctx, cancel := context.WithCancel(context.Background())
	td.cancel = cancel
	go func() { td.done <- Run(ctx, opts) }()
	select {
	case td.info = <-served:
	case err := <-td.done:
		cancel()
		t.Fatalf("the daemon did not start: %v\n%s", err, td.out.String())
	case <-time.After(waitFor):
		cancel()
		t.Fatalf("the daemon did not start in time\n%s", td.out.String())
	}
	// A daemon the test did not stop ends here; its shutdown must be clean
	// too (one the test stopped returns nil again).
	t.Cleanup(func() { assert.Check(t, td.stop(t), "the daemon's shutdown at the test's end") })
	return td
}

// stop ends the daemon as SIGINT does and returns Run's error.
func (td *testDaemon) stop(t *testing.T) error {
	t.Helper()
	td.cancel()
	select {
	case err, ok := <-td.done:
		if ok {
			close(td.done)
			return err
		}
		return nil
	case <-time.After(2 * waitFor):
		t.Fatal("the daemon did not stop")
		return nil
	}
}

// callerWithToken is caller presenting tok ("" = none: a worker's view,
// where privileged functions answer UNAUTHORIZED).
func callerWithToken(t *testing.T, engineURL, tok string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := client.Dial(ctx, engineURL, client.Options{Name: "test-caller-" + fmt.Sprint(time.Now().UnixNano()), IgnoreEnv: true,
		Token: tok, Reconnect: client.ReconnectPolicy{Disable: true}, CallTimeout: 3 * waitFor})
	assert.NilError(t, err)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		_ = c.Close(cctx)
	})
	return c
}

// call calls fn in ns and decodes the result into out (when non-nil).
func call(t *testing.T, c *client.Client, ns, fn string, payload any, out any) error {
	t.Helper()
	raw, err := c.Call(context.Background(), fn, payload, client.WithNamespace(ns))
	if err != nil {
		return err
	}
	if out != nil {
		assert.NilError(t, json.Unmarshal(raw, out), string(raw))
	}
	return nil
}

// codeOf is the code of a remote error.
func codeOf(err error) string {
	var eb *protocol.ErrorBody
	if errors.As(err, &eb) {
		return eb.Code
	}
	return compose.CodeOf(err)
}

func messageOf(err error) string {
	var eb *protocol.ErrorBody
	if errors.As(err, &eb) {
		return eb.Message
	}
	var ce *compose.Error
	if errors.As(err, &ce) {
		return ce.Message
	}
	return err.Error()
}

// writeFile writes a file under dir, creating parents.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	assert.NilError(t, os.WriteFile(p, []byte(content), 0o644))
	return p
}

// newProject makes a project directory with worker dirs for keys and the
// given compose file.
func newProject(t *testing.T, compose string, workerDirs ...string) string {
	t.Helper()
	dir := t.TempDir()
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	for _, w := range workerDirs {
		assert.NilError(t, os.MkdirAll(filepath.Join(dir, w), 0o755))
	}
	writeFile(t, dir, "worker-compose.yaml", compose)
	return dir
}

func waitUntil(t *testing.T, what string, check func() bool) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if check() {
			return poll.Success()
		}
		return poll.Continue("%s", what)
	}, poll.WithTimeout(waitFor), poll.WithDelay(50*time.Millisecond))
}

type statusReply struct {
	Namespace  string `json:"namespace"`
	File       string `json:"file"`
	StateDir   string `json:"state_dir"`
	DaemonPID  int    `json:"daemon_pid"`
	Containers []struct {
		Container string     `json:"container"`
		State     string     `json:"state"`
		PID       *int       `json:"pid"`
		Owned     bool       `json:"owned"`
		LogPath   string     `json:"log_path"`
		LastError *errorJSON `json:"last_error"`
	} `json:"containers"`
}

func (s statusReply) of(key string) (state string, pid int, lastErr *errorJSON) {
	for _, c := range s.Containers {
		if c.Container == key {
			if c.PID != nil {
				pid = *c.PID
			}
			return c.State, pid, c.LastError
		}
	}
	return "", 0, nil
}
