package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/icmd"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// composeWait bounds Compose's start: the package install, the engine, the
// adapter, and its back-end choice (a KVM probe that times out, then a TCG
// boot) on a loaded host. A safety net, not a timing.
const composeWait = 5 * time.Minute

// TestComposeManagedAdapter runs a managed project with the real `iii
// compose --up`: Compose starts the engine of the file's engine: section,
// resolves package://sandbox-libkrun from a directory registry holding the
// binaries under test, installs it into its package cache and has the
// engine's plugin host run it with the config_override. `iii call
// sandbox::run` then runs Python in a real VM. SIGTERM to Compose stops it
// all: no iii, adapter, runner or QEMU process is left.
func TestComposeManagedAdapter(t *testing.T) {
	t.Parallel()
	s := needVMs(t)

	project := t.TempDir()
	home := dirs.Short(t, "e2eh")
	composeState := t.TempDir()
	sbState := dirs.Short(t, "e2es")
	// The adapter's cache is $HOME/.iii/cache: its local OCI layout is the
	// Debian-built presets, read only.
	assert.NilError(t, os.MkdirAll(filepath.Join(home, ".iii", "cache"), 0o755))
	assert.NilError(t, os.Symlink(s.layout, filepath.Join(home, ".iii", "cache", "oci")))
	port := freePort(t)
	file := fmt.Sprintf(`engine:
  url: ws://127.0.0.1:%d
  workers: {}
containers:
  sandbox-libkrun:
    worker: package://sandbox-libkrun
    version: '^0.3'
    config_override:
      image_allowlist: [python]
      state_dir: %s
      boot_timeout_ms: 180000
      adopt_grace_ms: 0
`, port, sbState)
	assert.NilError(t, os.WriteFile(filepath.Join(project, "worker-compose.yaml"), []byte(file), 0o644))

	env := []string{"HOME=" + home, "III_COMPOSE_STATE_DIR=" + composeState, "III_REGISTRY=" + s.packages}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "III_") {
			env = append(env, kv)
		}
	}
	var out, errOut syncbuf.Buffer
	compose := exec.Command(s.iii, "compose", "--up")
	compose.Dir, compose.Env, compose.Stdout, compose.Stderr = project, env, &out, &errOut
	assert.NilError(t, compose.Start())
	exited := make(chan error, 1)
	go func() { exited <- compose.Wait() }()
	markers := []string{project, home, composeState, sbState}
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = compose.Process.Kill()
			waitfor.Recv(t, exited, waitfor.Default, "the killed iii compose to be reaped")
		}
		if t.Failed() {
			t.Logf("iii compose stdout:\n%s\nstderr:\n%s", out.Tail(60), errOut.Tail(60))
			if log, err := os.ReadFile(findEngineLog(composeState)); err == nil {
				t.Logf("engine.log (tail):\n%s", tailLines(string(log), 80))
			}
		}
		// Nothing may outlive the test even when it failed half-way.
		for _, p := range procsMarked(markers...) {
			if pid, err := strconv.Atoi(strings.Fields(p)[0]); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})

	url := fmt.Sprintf("ws://127.0.0.1:%d", port)
	waitAdapterReady(t, url, exited)

	// The adapter runs from Compose's package cache, as the lock says.
	lock, err := os.ReadFile(filepath.Join(project, "worker-compose.lock"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(lock), "sandbox-libkrun"))
	call := func(args ...string) *icmd.Result {
		return icmd.RunCmd(icmd.Command(s.iii, append([]string{"call", "--port", strconv.Itoa(port), "--timeout-ms", "300000"}, args...)...),
			icmd.WithEnv(env...), icmd.Dir(project), icmd.WithTimeout(6*time.Minute))
	}
	res := call("engine::adapters::list")
	res.Assert(t, icmd.Success)
	var adapters struct {
		Adapters []struct {
			Adapter string `json:"adapter"`
			State   string `json:"state"`
			Path    string `json:"path"`
		} `json:"adapters"`
	}
	assert.NilError(t, json.Unmarshal([]byte(res.Stdout()), &adapters))
	assert.Assert(t, is.Len(adapters.Adapters, 1), res.Stdout())
	a := adapters.Adapters[0]
	assert.Check(t, is.Equal(a.Adapter, "sandbox-libkrun"))
	assert.Check(t, is.Equal(a.State, "running"))
	assert.Check(t, strings.HasPrefix(a.Path, filepath.Join(composeState, "packages")+"/"), "the adapter runs from %s", a.Path)

	res = call("sandbox::run", "image=python", "lang=python", "code=print(2+2)")
	res.Assert(t, icmd.Success)
	var run execReply
	assert.NilError(t, json.Unmarshal([]byte(res.Stdout()), &run), res.Stdout())
	checkRan(t, run, "4\n")
	// config_override reached the adapter: node is not allowed.
	res = call("sandbox::run", "image=node", "lang=node", "code=console.log(1)")
	assert.Check(t, res.ExitCode != 0)
	assert.Check(t, is.Contains(res.Stderr(), "Error: S100 image not in the catalog"))
	assert.Check(t, is.Contains(res.Stderr(), "python"), "S100 lists the allowed names")

	// A sandbox left running: SIGTERM to Compose must end its VM too. The
	// scan sees every kind of process now, so its later silence means
	// something.
	res = call("sandbox::create", "image=python")
	res.Assert(t, icmd.Success)
	assert.Check(t, is.Contains(res.Stdout(), `"sandbox_id"`))
	assertRunning(t, procsMarked(markers...), "compose --up", "__compose-reaper", "engine-config.yaml",
		"packages/sandbox-libkrun", "__vm-run", "qemu-system")

	assert.NilError(t, compose.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		exited <- err
		assert.NilError(t, err, "iii compose after SIGTERM")
	case <-time.After(2 * time.Minute):
		t.Fatal("iii compose did not stop within 2 minutes of SIGTERM")
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if left := procsMarked(markers...); len(left) > 0 {
			return poll.Continue("still running:\n%s", strings.Join(left, "\n"))
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(100*time.Millisecond))
	assert.Check(t, is.Contains(out.Tail(100), "engine started"))
}

// composeStatus is the state compose::status gives sandbox-libkrun in the
// default namespace.
func composeStatus(url string) (string, error) {
	return containerState(url, "default", "sandbox-libkrun")
}

// containerState is the state compose::status (in ns) gives container.
func containerState(url, ns, container string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, url, client.Options{Name: "e2e-compose-probe-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}, DialTimeout: 5 * time.Second})
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close(ctx) }()
	raw, err := c.Call(ctx, "compose::status", nil, client.WithNamespace(ns))
	if err != nil {
		return "", err
	}
	var st struct {
		Containers []struct {
			Container string `json:"container"`
			State     string `json:"state"`
		} `json:"containers"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return "", err
	}
	for _, c := range st.Containers {
		if c.Container == container {
			return c.State, nil
		}
	}
	return "", fmt.Errorf("no %s in %s", container, raw)
}

// findEngineLog is the managed engine's log under the Compose state
// directory (<state>/<slug>/<namespace>/engine.log).
func findEngineLog(composeState string) string {
	m, _ := filepath.Glob(filepath.Join(composeState, "*", "*", "engine.log"))
	if len(m) == 0 {
		return ""
	}
	return m[0]
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// waitAdapterReady waits until the sandbox-libkrun container of the Compose
// project served at url is ready, failing at once if `iii compose --up`
// (whose Wait result exited receives) ends first.
func waitAdapterReady(t *testing.T, url string, exited chan error) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case err := <-exited:
			exited <- err
			return poll.Error(fmt.Errorf("iii compose --up exited: %v", err))
		default:
		}
		st, err := composeStatus(url)
		if err != nil {
			return poll.Continue("compose::status: %v", err)
		}
		if st != "ready" {
			return poll.Continue("sandbox-libkrun is %q", st)
		}
		return poll.Success()
	}, poll.WithTimeout(composeWait), poll.WithDelay(250*time.Millisecond))
}
