package e2e

import (
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
	"gotest.tools/v3/icmd"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// TestBareEngineLoadsBoundAdapter runs the real `iii -c config.yaml` with
// nothing else: the adapter its sandbox: section binds is started by the
// engine with sandbox.config, so sandbox::run works with no other call.
// Editing only the binding (sandbox-hostdir → sandbox-libkrun, with its
// config) while the engine runs swaps the adapter: the next sandbox::run
// runs in a VM and engine::adapters::list shows one adapter. Then
// `iii compose --up --engine ws://…` attaches and takes the adapter over
// with the project's package and config_override. Stopping Compose and the
// engine leaves no process behind.
func TestBareEngineLoadsBoundAdapter(t *testing.T) {
	t.Parallel()
	s := needVMs(t)

	hostdir := filepath.Join(filepath.Dir(s.iii), "sandbox-hostdir")
	plugins := t.TempDir()
	if _, err := os.Stat(hostdir); err != nil {
		hostdir = filepath.Join(plugins, "sandbox-hostdir")
		b, err := exec.Command("go", "build", "-o", hostdir, "github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir/cmd/sandbox-hostdir").CombinedOutput()
		assert.NilError(t, err, "%s", b)
	}
	dir := t.TempDir()
	home := dirs.Short(t, "e2eb")
	composeState := t.TempDir()
	hdState := t.TempDir()
	sbState := dirs.Short(t, "e2ebs")
	// sandbox-libkrun's cache is $HOME/.iii/cache: its local OCI layout is
	// the Debian-built presets, read only.
	assert.NilError(t, os.MkdirAll(filepath.Join(home, ".iii", "cache"), 0o755))
	assert.NilError(t, os.Symlink(s.layout, filepath.Join(home, ".iii", "cache", "oci")))
	port := freePort(t)
	url := fmt.Sprintf("ws://127.0.0.1:%d", port)
	cfgPath := filepath.Join(dir, "config.yaml")
	write := func(sandbox string) {
		content := fmt.Sprintf("workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\n%s", port, sandbox)
		assert.NilError(t, os.WriteFile(cfgPath+".tmp", []byte(content), 0o644))
		assert.NilError(t, os.Rename(cfgPath+".tmp", cfgPath))
	}
	write(fmt.Sprintf("sandbox:\n  adapter: sandbox-hostdir\n  config:\n    image_allowlist: [python]\n    state_dir: %s\n", hdState))

	// sandbox-hostdir is found on $III_PLUGIN_PATH (or beside iii),
	// sandbox-libkrun beside iii with its guest agent.
	env := []string{"HOME=" + home, "III_COMPOSE_STATE_DIR=" + composeState, "III_REGISTRY=" + s.packages,
		"III_PLUGIN_PATH=" + filepath.Dir(hostdir)}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "III_") {
			env = append(env, kv)
		}
	}
	var engOut syncbuf.Buffer
	eng := exec.Command(s.iii, "-c", cfgPath)
	eng.Dir, eng.Env, eng.Stdout, eng.Stderr = dir, env, &engOut, &engOut
	assert.NilError(t, eng.Start())
	engExited := make(chan error, 1)
	go func() { engExited <- eng.Wait() }()
	markers := []string{dir, home, composeState, sbState, hdState}
	var compose *exec.Cmd
	composeExited := make(chan error, 1)
	var composeOut syncbuf.Buffer
	t.Cleanup(func() {
		for _, c := range []struct {
			cmd  *exec.Cmd
			done chan error
		}{{compose, composeExited}, {eng, engExited}} {
			if c.cmd == nil {
				continue
			}
			select {
			case err := <-c.done:
				c.done <- err
			default:
				_ = c.cmd.Process.Kill()
				waitfor.Recv(t, c.done, waitfor.Default, "the killed "+filepath.Base(c.cmd.Path)+" to be reaped")
			}
		}
		if t.Failed() {
			t.Logf("engine output (tail):\n%s\ncompose output (tail):\n%s", engOut.Tail(80), composeOut.Tail(60))
		}
		for _, p := range procsMarked(markers...) {
			if pid, err := strconv.Atoi(strings.Fields(p)[0]); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})

	call := func(args ...string) *icmd.Result {
		return icmd.RunCmd(icmd.Command(s.iii, append([]string{"call", "--port", strconv.Itoa(port), "--timeout-ms", "300000"}, args...)...),
			icmd.WithEnv(env...), icmd.Dir(dir), icmd.WithTimeout(6*time.Minute))
	}
	type status struct {
		Adapter   string `json:"adapter"`
		State     string `json:"state"`
		Path      string `json:"path"`
		StartedBy string `json:"started_by"`
		LastError string `json:"last_error"`
	}
	list := func() ([]status, error) {
		res := call("engine::adapters::list")
		if res.ExitCode != 0 {
			return nil, fmt.Errorf("engine::adapters::list: %s", res.Combined())
		}
		var l struct {
			Adapters []status `json:"adapters"`
		}
		err := json.Unmarshal([]byte(res.Stdout()), &l)
		return l.Adapters, err
	}
	waitFor := func(adapter, startedBy string) status {
		t.Helper()
		var got status
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			l, err := list()
			if err != nil {
				return poll.Continue("%v", err)
			}
			if len(l) == 1 && l[0].Adapter == adapter && l[0].State == "running" && l[0].StartedBy == startedBy {
				got = l[0]
				return poll.Success()
			}
			return poll.Continue("adapters: %+v", l)
		}, poll.WithTimeout(composeWait), poll.WithDelay(250*time.Millisecond))
		return got
	}
	run := func() {
		t.Helper()
		res := call("sandbox::run", "image=python", "lang=python", "code=print(2+2)")
		res.Assert(t, icmd.Success)
		var out execReply
		assert.NilError(t, json.Unmarshal([]byte(res.Stdout()), &out), res.Stdout())
		checkRan(t, out, "4\n")
	}

	// No other call: the engine runs sandbox-hostdir with its config.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if res := call("sandbox::catalog::list"); res.ExitCode != 0 {
			return poll.Continue("%s", res.Combined())
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(100*time.Millisecond))
	run()
	waitFor("sandbox-hostdir", "config.yaml")

	// Only the binding changes: sandbox-libkrun, with its config.
	write(fmt.Sprintf("sandbox:\n  adapter: sandbox-libkrun\n  config:\n    image_allowlist: [python]\n    state_dir: %s\n    boot_timeout_ms: 180000\n    adopt_grace_ms: 0\n", sbState))
	waitFor("sandbox-libkrun", "config.yaml")
	run()
	// In a VM: a kept sandbox is a runner and a QEMU under the state dir.
	res := call("sandbox::create", "image=python")
	res.Assert(t, icmd.Success)
	assertRunning(t, procsMarked(sbState), "__vm-run", "qemu-system")
	res = call("sandbox::stop", "--json", fmt.Sprintf(`{"sandbox_id":%q,"wait":true}`, sandboxID(t, res.Stdout())))
	res.Assert(t, icmd.Success)

	// Compose attaches and takes the adapter over: no ADAPTER_ALREADY_STARTED.
	project := t.TempDir()
	markers = append(markers, project)
	file := fmt.Sprintf(`containers:
  sandbox-libkrun:
    worker: package://sandbox-libkrun
    version: '^0.3'
    config_override:
      image_allowlist: [python]
      state_dir: %s
      boot_timeout_ms: 180000
      adopt_grace_ms: 0
`, sbState)
	assert.NilError(t, os.WriteFile(filepath.Join(project, "worker-compose.yaml"), []byte(file), 0o644))
	compose = exec.Command(s.iii, "compose", "--up", "--namespace", "default", "--engine", url)
	compose.Dir, compose.Env, compose.Stdout, compose.Stderr = project, env, &composeOut, &composeOut
	assert.NilError(t, compose.Start())
	go func() { composeExited <- compose.Wait() }()
	waitAdapterReady(t, url, composeExited)
	a := waitFor("sandbox-libkrun", "call")
	assert.Check(t, strings.HasPrefix(a.Path, filepath.Join(composeState, "packages")+"/"), "the adapter runs from %s", a.Path)
	run()

	assert.NilError(t, compose.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-composeExited:
		composeExited <- err
		assert.NilError(t, err, "iii compose after SIGTERM")
	case <-time.After(2 * time.Minute):
		t.Fatal("iii compose did not stop within 2 minutes of SIGTERM")
	}
	assert.NilError(t, eng.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-engExited:
		engExited <- err
		assert.NilError(t, err, "iii after SIGTERM")
	case <-time.After(time.Minute):
		t.Fatal("iii did not stop within a minute of SIGTERM")
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if left := procsMarked(markers...); len(left) > 0 {
			return poll.Continue("still running:\n%s", strings.Join(left, "\n"))
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(100*time.Millisecond))
}

// sandboxID reads sandbox::create's reply.
func sandboxID(t *testing.T, out string) string {
	t.Helper()
	var r struct {
		SandboxID string `json:"sandbox_id"`
	}
	assert.NilError(t, json.Unmarshal([]byte(out), &r), out)
	assert.Assert(t, r.SandboxID != "", out)
	return r.SandboxID
}
