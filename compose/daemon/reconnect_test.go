package daemon

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/host/server"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// goWorkerCommand makes the test binary a Go worker: it registers as
// $III_WORKER_NAME in $III_NAMESPACE and runs until SIGTERM. With
// GO_WORKER_RECONNECT=0 it never reconnects after losing the engine (but
// keeps running).
const goWorkerCommand = "compose-test-worker"

func goWorker() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	opts := client.Options{Reconnect: client.ReconnectPolicy{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond}}
	if os.Getenv("GO_WORKER_RECONNECT") == "0" {
		opts.Reconnect = client.ReconnectPolicy{Disable: true}
	}
	c, err := client.Dial(ctx, os.Getenv("III_URL"), opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("go worker registered")
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = c.Close(cctx)
	return 0
}

// startEngineAt starts a real engine on a fixed loopback port.
func startEngineAt(t *testing.T, port int) (url string, stop func()) {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	assert.NilError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(
		"workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\n  - name: configuration\n    config: { adapter: { name: fs, config: { directory: %s } } }\n",
		port, filepath.Join(dir, "store"))), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.Start(ctx, server.Options{ConfigPath: cfg, Logger: hclog.NewNullLogger(), Version: "0.26.0"})
	assert.NilError(t, err)
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
	return fmt.Sprintf("ws://127.0.0.1:%d", port), stop
}

// When the engine goes away and comes back, every running worker has its
// startup_timeout to register again: one that reconnects stays ready, one
// that does not is taken down (STARTUP_TIMEOUT), and its dependents with
// it. The lost connection alone stops nothing.
func TestEngineReconnect(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	assert.NilError(t, l.Close())
	url, stopEngine := startEngineAt(t, port)
	exe, err := os.Executable()
	assert.NilError(t, err)
	file := fmt.Sprintf(`namespace: rc
startup_timeout: 3s
containers:
  comes-back:
    worker: path://./a
    scripts: { run: '%[1]s %[2]s' }
  stays-away:
    worker: path://./b
    scripts: { run: '%[1]s %[2]s' }
    environment: { GO_WORKER_RECONNECT: "0" }
  after:
    worker: path://./c
    start_after: [stays-away]
    scripts: { run: '%[1]s %[2]s' }
`, exe, goWorkerCommand)
	dir := newProject(t, file, "a", "b", "c")
	startDaemon(t, Options{EngineURL: url, Cwd: dir})
	c := caller(t, url)
	var up opResult
	assert.NilError(t, call(t, c, "rc", "compose::up", nil, &up))
	assert.Equal(t, up.Status, "ok", "%+v", up)
	assert.NilError(t, c.Close(context.Background()))

	stopEngine()
	_, stopAgain := startEngineAt(t, port)
	defer stopAgain()
	c = caller(t, url)
	var st statusReply
	waitUntil(t, "stays-away taken down after the reconnect", func() bool {
		if err := call(t, c, "rc", "compose::status", nil, &st); err != nil {
			return false
		}
		s, _, _ := st.of("stays-away")
		return s == "failed"
	})
	s, _, lastErr := st.of("stays-away")
	assert.Equal(t, s, "failed")
	assert.Equal(t, lastErr.Code, compose.CodeStartupTimeout)
	assert.Check(t, is.Contains(lastErr.Message, "did not register again"))
	s, _, lastErr = st.of("after")
	assert.Check(t, is.Equal(s, "failed"))
	assert.Check(t, lastErr != nil && lastErr.Code == CodeDependencyFailed)
	s, _, _ = st.of("comes-back")
	assert.Check(t, is.Equal(s, "ready"))
}
