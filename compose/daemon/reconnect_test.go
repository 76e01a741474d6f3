package daemon

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/protocol"
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

// When the engine goes away and comes back, every running worker has its
// startup_timeout to register again: one that reconnects stays ready, one
// that does not is taken down (STARTUP_TIMEOUT), and its dependents with
// it. The lost connection alone stops nothing.
func TestEngineReconnect(t *testing.T) {
	t.Parallel()
	eng, stopEngine := startEngineWith(t, engineSetup{})
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
	startDaemon(t, eng.attach(Options{Cwd: dir}))
	c := eng.caller(t)
	var up opResult
	assert.NilError(t, call(t, c, "rc", "compose::up", nil, &up))
	assert.Equal(t, up.Status, "ok", "%+v", up)
	assert.NilError(t, c.Close(context.Background()))

	stopEngine()
	// The same port and home: the same engine token.
	again, stopAgain := startEngineWith(t, engineSetup{port: eng.port(t), home: eng.home})
	defer stopAgain()
	c = again.caller(t)
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

// An engine restart takes the adapters Compose started through its plugin
// host with it; when the connection comes back Compose starts its adapter
// container again, from the same package and with the same configuration,
// and the dependents that reconnect stay ready. Nothing is recorded
// failed. (The sandboxes and worker VMs the adapter ran are adopted by the
// new adapter process: tests/e2e's TestComposeSurvivesEngineRestartAndUpgrade
// shows that with real VMs.)
func TestAdapterRevivedAfterEngineRestart(t *testing.T) {
	t.Parallel()
	reg := publishedRegistry(t)
	// No sandbox: binding, so the restarted engine starts no adapter by
	// itself: only Compose can bring it back.
	eng, stopEngine := startEngineWith(t, engineSetup{})
	exe, err := os.Executable()
	assert.NilError(t, err)
	sd := dirs.Short(t, "rvs")
	file := fmt.Sprintf(`namespace: rv
startup_timeout: 60s
containers:
  sandbox-libkrun:
    worker: package://sandbox-libkrun
    version: '^0.3'
    config_override:
      state_dir: %[3]s
      max_concurrent_sandboxes: 7
  api:
    worker: path://./a
    start_after: [sandbox-libkrun]
    scripts: { run: '%[1]s %[2]s' }
`, exe, goWorkerCommand, sd)
	dir := newProject(t, file, "a")
	d := startDaemon(t, eng.attach(Options{Cwd: dir, Packages: PackageOptions{Registry: reg}}))
	c := eng.caller(t)
	var up opResult
	assert.NilError(t, call(t, c, "rv", "compose::up", nil, &up))
	assert.Equal(t, up.Status, "ok", "%+v %+v", up, up.Containers[0].Error)
	path := adapterPath(t, c, "rv", "sandbox-libkrun")
	assert.NilError(t, c.Close(context.Background()))

	stopEngine()
	again, _ := startEngineWith(t, engineSetup{port: eng.port(t), home: eng.home})
	c = again.caller(t)
	var list struct {
		Adapters []adapterStatus `json:"adapters"`
	}
	waitUntil(t, "the adapter running again after the engine restart", func() bool {
		if err := call(t, c, "default", "engine::adapters::list", nil, &list); err != nil {
			return false
		}
		for _, a := range list.Adapters {
			if a.Adapter == "sandbox-libkrun" && a.Namespace == "rv" && a.State == "running" {
				return true
			}
		}
		return false
	})
	assert.Check(t, is.Equal(adapterPath(t, c, "rv", "sandbox-libkrun"), path), "the same package runs")
	// The configuration it ran with: config_override and the package's
	// defaults, merged again.
	raw, err := c.Call(context.Background(), "configuration::get", map[string]any{"id": EntryID("rv", "sandbox-libkrun")})
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(raw), `"max_concurrent_sandboxes":7`))
	assert.Check(t, is.Contains(string(raw), sd))
	var st statusReply
	waitUntil(t, "every container ready again", func() bool {
		if err := call(t, c, "rv", "compose::status", nil, &st); err != nil {
			return false
		}
		a, _, _ := st.of("sandbox-libkrun")
		b, _, _ := st.of("api")
		return a == "ready" && b == "ready"
	})
	for _, key := range []string{"sandbox-libkrun", "api"} {
		_, _, lastErr := st.of(key)
		assert.Check(t, lastErr == nil, "%s: %+v", key, lastErr)
	}
	assert.Check(t, is.Contains(d.out.String(), "sandbox-libkrun: the engine restarted; starting the adapter again"))
	// Down while the engine is there: the cleanup stops the engine first.
	assert.NilError(t, call(t, c, "rv", "compose::down", nil, &up))
}

// The worker credentials a killed Compose left in worker-credentials.json
// stay valid only while a Compose of the project could still hand them on:
// a VM worker's until the project stops cleanly with nobody having claimed
// it, a queue provider's once its container stops (or starts a new
// process). Revoked, their connections close and new ones are refused; the
// file is gone.
func TestLeftoverWorkerCredentialsRevoked(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, "")
	exe, err := os.Executable()
	assert.NilError(t, err)
	dir := newProject(t, fmt.Sprintf("namespace: lc\ncontainers:\n  api:\n    worker: path://./a\n    scripts: { run: '%s %s' }\n", exe, goWorkerCommand), "a")
	startDaemon(t, eng.attach(Options{Cwd: dir}))
	c := eng.caller(t)
	var op opResult
	assert.NilError(t, call(t, c, "lc", "compose::up", nil, &op))
	assert.Equal(t, op.Status, "ok", "%+v", op)
	var st statusReply
	assert.NilError(t, call(t, c, "lc", "compose::status", nil, &st))
	assert.NilError(t, call(t, c, "lc", "compose::down", nil, &op))

	// What a Compose killed with SIGKILL leaves: credentials it issued,
	// recorded beside its state.
	issue := func(label string) string {
		var issued struct {
			Token string `json:"token"`
		}
		assert.NilError(t, call(t, c, "default", protocol.FnCredentialsIssue, protocol.CredentialSpec{Label: label, Namespace: "lc"}, &issued))
		assert.Assert(t, issued.Token != "")
		return issued.Token
	}
	vmTok, providerTok := issue("compose/lc/gone"), issue("compose/lc/api/queue-provider")
	store := st.StateDir
	assert.NilError(t, os.WriteFile(filepath.Join(store, state.WorkerCredentialsFile),
		[]byte(`{"version":1,"credentials":{"vm-gone":"`+vmTok+`","queue-provider/api":"`+providerTok+`"}}`), 0o600))

	assert.NilError(t, call(t, c, "lc", "compose::up", nil, &op))
	assert.Equal(t, op.Status, "ok", "%+v", op)
	held := callerWithToken(t, eng.url, vmTok) // still valid while the project runs
	assert.NilError(t, call(t, c, "lc", "compose::down", nil, &op))

	for _, tok := range []string{vmTok, providerTok} {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		_, err = client.Dial(ctx, eng.url, client.Options{Name: "after-revoke", IgnoreEnv: true, Token: tok, Reconnect: client.ReconnectPolicy{Disable: true}})
		cancel()
		assert.ErrorContains(t, err, "AUTH_ERROR")
	}
	waitUntil(t, "the connection made with the revoked credential closed", func() bool { return !held.Connected() })
	_, err = os.Stat(filepath.Join(store, state.WorkerCredentialsFile))
	assert.Check(t, os.IsNotExist(err), "worker-credentials.json is gone")
}
