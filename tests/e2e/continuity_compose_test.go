package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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
	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/adapter"
)

// TestComposeSurvivesEngineRestartAndUpgrade is issue 23's acceptance under
// an attached Compose: an engine the operator runs (`iii -c config.yaml`,
// its router bound to sandbox-libkrun in the project's namespace) and
// `iii compose --up --engine` of a project with the sandbox-libkrun package
// (from a registry) and a VM worker. Four sandboxes — a long process
// started by exec, written files, network, one claimed from the warm pool —
// and the VM worker survive:
//
//  1. an engine stop and start: the engine starts its installed adapter,
//     Compose takes it over with its package and configuration, the new
//     adapter process adopts every VM, and the worker's connection comes
//     back with its persisted credential; the worker is the same process;
//  2. compose::update worker=sandbox-libkrun to a newer published version:
//     only the adapter restarts, from the new package's binary, and adopts
//     everything again;
//  3. kill -9 of Compose and of the engine: after adopt_grace_ms no
//     adapter, runner or QEMU process is left.
func TestComposeSurvivesEngineRestartAndUpgrade(t *testing.T) {
	t.Parallel()
	s := needVMs(t)
	project := t.TempDir()
	home := dirs.Short(t, "ccrh")
	composeState := t.TempDir()
	sbState := dirs.Short(t, "ccrs")
	assert.NilError(t, os.MkdirAll(filepath.Join(home, ".iii", "cache"), 0o755))
	assert.NilError(t, os.Symlink(s.layout, filepath.Join(home, ".iii", "cache", "oci")))

	// A registry of this test's own: sandbox-libkrun at adapter.Version
	// now, a newer patch release later.
	reg := filepath.Join(t.TempDir(), "registry")
	agent := filepath.Join(filepath.Dir(s.adapterBin), adapter.AgentName(runtime.GOARCH))
	publish := func(version, bin string) {
		t.Helper()
		_, err := registry.Publish(reg, registry.Publication{
			Name: "sandbox-libkrun", Kind: registry.KindBinary, Version: version, Target: registry.HostPlatform().Target(),
			Files:         []registry.PublishFile{{Path: bin, ArchiveName: "sandbox-libkrun"}, {Path: agent}},
			DefaultConfig: json.RawMessage(`{"default_cpus":1,"default_memory_mb":512,"max_concurrent_sandboxes":8}`),
			Tags:          []string{registry.TagLatest}, Now: time.Now(),
		})
		assert.NilError(t, err)
	}
	publish(adapter.Version, s.adapterBin)

	floodWorker(t, project)

	port := freePort(t)
	url := fmt.Sprintf("ws://127.0.0.1:%d", port)
	const ns = "shop"
	sandboxConfig := fmt.Sprintf("{ image_allowlist: [python], state_dir: %s, boot_timeout_ms: 300000, worker_disk_mb: 256, snapshot_templates: false, warm_pool: { python: 1 } }", sbState)
	cfgPath := filepath.Join(t.TempDir(), "config.yaml")
	assert.NilError(t, os.WriteFile(cfgPath, []byte(fmt.Sprintf(`workers:
  - name: iii-worker-manager
    config: { host: 127.0.0.1, port: %d }
sandbox:
  adapter: sandbox-libkrun
  namespace: %s
  config: %s
`, port, ns, sandboxConfig)), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(project, "worker-compose.yaml"), []byte(fmt.Sprintf(`namespace: %s
startup_timeout: 600s
containers:
  sandbox-libkrun:
    worker: package://sandbox-libkrun
    version: '^0.3'
    config_override: %s
  floodworker:
    worker: path://./floodworker
`, ns, sandboxConfig)), 0o644))

	// One user: the engine finds Compose's package cache as the operator's
	// engine would (same HOME, same Compose state directory); the engine
	// token is the one the engine makes in ~/.iii on its first start.
	env := []string{"HOME=" + home, "III_COMPOSE_STATE_DIR=" + composeState, "III_REGISTRY=" + reg}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "III_") {
			env = append(env, kv)
		}
	}
	markers := []string{project, home, composeState, sbState}
	var engOut, out, errOut syncbuf.Buffer
	var eng *exec.Cmd
	engExited := make(chan error, 1)
	startEngine := func() {
		t.Helper()
		eng = exec.Command(s.iii, "-c", cfgPath)
		eng.Dir, eng.Env, eng.Stdout, eng.Stderr = project, env, &engOut, &engOut
		assert.NilError(t, eng.Start())
		go func(c *exec.Cmd) { engExited <- c.Wait() }(eng)
	}
	startEngine()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if c, err := client.Dial(ctxT(t), url, client.Options{Name: "e2e-wait", IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}}); err == nil {
			_ = c.Close(context.Background())
			return poll.Success()
		}
		return poll.Continue("the engine does not listen yet")
	}, poll.WithTimeout(time.Minute), poll.WithDelay(100*time.Millisecond))

	compose := exec.Command(s.iii, "compose", "--up", "--engine", url)
	compose.Dir, compose.Env, compose.Stdout, compose.Stderr = project, env, &out, &errOut
	assert.NilError(t, compose.Start())
	exited := make(chan error, 1)
	go func() { exited <- compose.Wait() }()
	t.Cleanup(func() {
		for _, c := range []struct {
			cmd  *exec.Cmd
			done chan error
		}{{compose, exited}, {eng, engExited}} {
			select {
			case err := <-c.done:
				c.done <- err
			default:
				_ = c.cmd.Process.Kill()
				waitfor.Recv(t, c.done, waitfor.Default, "a killed process to be reaped")
			}
		}
		if t.Failed() {
			t.Logf("iii compose stdout:\n%s\nstderr:\n%s", out.Tail(80), errOut.Tail(60))
			t.Logf("engine output (tail):\n%s", engOut.Tail(120))
		}
		for _, p := range procsMarked(markers...) {
			if pid, err := strconv.Atoi(strings.Fields(p)[0]); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	waitContainerReady(t, url, ns, "floodworker", exited)

	user := cli{iii: s.iii, dir: project, port: port, env: env}
	type who struct {
		PID       int    `json:"pid"`
		StartedAt string `json:"started_at"`
	}
	// whoami asks the VM worker through the engine, dialling anew (the
	// engine may have restarted since the last call).
	whoami := func() (who, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, url, client.Options{Name: "e2e-caller", IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}})
		if err != nil {
			return who{}, err
		}
		defer c.Close(context.Background())
		raw, err := c.Call(ctx, "floodworker::whoami", map[string]any{}, client.WithNamespace(ns))
		if err != nil {
			return who{}, err
		}
		var w who
		return w, json.Unmarshal(raw, &w)
	}
	adapterPath := func() string {
		res := user.call("engine::adapters::list")
		if res.ExitCode != 0 {
			return ""
		}
		var l struct {
			Adapters []adapterStatusJSON `json:"adapters"`
		}
		if json.Unmarshal([]byte(res.Stdout()), &l) != nil {
			return ""
		}
		for _, a := range l.Adapters {
			if a.Adapter == "sandbox-libkrun" && a.Namespace == ns && a.State == "running" {
				return a.Path
			}
		}
		return ""
	}

	poll.WaitOn(t, func(poll.LogT) poll.Result {
		res := user.call("--namespace", ns, "sandbox-libkrun::adapter::info")
		var info struct {
			WarmPool map[string]struct {
				Ready int `json:"ready"`
			} `json:"warm_pool"`
		}
		if res.ExitCode == 0 && json.Unmarshal([]byte(res.Stdout()), &info) == nil && info.WarmPool["python"].Ready == 1 {
			return poll.Success()
		}
		return poll.Continue("the warm pool is not ready: %s", res.Combined())
	}, poll.WithTimeout(2*composeWait), poll.WithDelay(500*time.Millisecond))
	pooled := user.create(t, nil)
	longRun, files := user.create(t, nil), user.create(t, nil)
	network := user.create(t, map[string]any{"network": true})
	user.sh(t, pooled, "echo pooled > /root/mark")
	user.startKeeper(t, longRun)
	secret, n0, kpid := user.askKeeper(t, longRun)
	user.callJSON(t, "sandbox::fs::write", map[string]any{"sandbox_id": files, "path": "/root/notes.txt", "content": "kept"}, nil)
	worker, err := whoami()
	assert.NilError(t, err)
	assert.Assert(t, worker.PID > 0, "%+v", worker)
	packages := filepath.Join(composeState, "packages") + "/"
	assert.Check(t, strings.HasPrefix(adapterPath(), packages), "Compose took the engine's adapter over: %s", adapterPath())

	// check waits until the VM worker answers through the engine again,
	// then asks everything.
	check := func(step string) {
		t.Helper()
		t0 := time.Now()
		// The restarted engine starts the adapter its config.yaml binds, and
		// Compose then takes it over with its own (a hand-over: calls in
		// flight finish, new ones wait). Ask once Compose's adapter runs, so
		// the checks below are answered by it.
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if p := adapterPath(); strings.HasPrefix(p, packages) {
				return poll.Success()
			}
			return poll.Continue("%s: Compose has not taken the adapter over yet", step)
		}, poll.WithTimeout(2*composeWait), poll.WithDelay(250*time.Millisecond))
		var now who
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			var err error
			if now, err = whoami(); err != nil {
				return poll.Continue("%s: the VM worker does not answer yet: %v", step, err)
			}
			return poll.Success()
		}, poll.WithTimeout(2*composeWait), poll.WithDelay(time.Second))
		assert.Check(t, is.DeepEqual(now, worker), "%s: the VM worker is not the same process", step)
		s1, n1, p1 := user.askKeeper(t, longRun)
		assert.Check(t, is.Equal(s1, secret), "%s: the long process lost its memory", step)
		assert.Check(t, is.Equal(p1, kpid), step)
		assert.Check(t, n1 > n0, "%s: the counter went from %d to %d", step, n0, n1)
		assert.Check(t, is.Equal(user.sh(t, files, "cat /root/notes.txt"), "kept"), step)
		assert.Check(t, is.Equal(user.sh(t, pooled, "cat /root/mark"), "pooled\n"), step)
		assert.Check(t, is.Equal(user.sh(t, network, "echo up"), "up\n"), step)
		waitContainerReady(t, url, ns, "floodworker", exited)
		waitContainerReady(t, url, ns, "sandbox-libkrun", exited)
		t.Logf("%s: the worker and the four sandboxes answered %v after the check began", step, time.Since(t0))
	}

	// 1. The engine stops and starts again.
	assert.NilError(t, eng.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-engExited:
		assert.NilError(t, err, "iii after SIGTERM")
	case <-time.After(time.Minute):
		t.Fatal("iii did not stop within a minute of SIGTERM")
	}
	assert.Check(t, len(procsMarked(sbState)) >= 5, "the VMs should wait for the next engine: %v", procsMarked(sbState))
	startEngine()
	check("after an engine stop and start")
	assert.Check(t, strings.HasPrefix(adapterPath(), packages), "Compose took the restarted engine's adapter over: %s", adapterPath())
	assert.Check(t, is.Contains(out.String(), "sandbox-libkrun: the engine restarted; starting the adapter again"))

	// 2. A newer sandbox-libkrun is published (the same code, another
	// binary), and the project updates to it.
	next := nextPatch(t, adapter.Version)
	upgraded := filepath.Join(t.TempDir(), "sandbox-libkrun")
	bin, err := os.ReadFile(s.adapterBin)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(upgraded, append(bin, []byte("\nupgraded build "+next+"\n")...), 0o755))
	publish(next, upgraded)
	var upd struct {
		Updated []struct {
			Container, From, To string
			Changed             bool
		} `json:"updated"`
		Restarted bool `json:"restarted"`
		Down      any  `json:"down"`
	}
	res := user.call("--namespace", ns, "compose::update", "worker=sandbox-libkrun")
	res.Assert(t, icmd.Success)
	assert.NilError(t, json.Unmarshal([]byte(res.Stdout()), &upd), res.Stdout())
	assert.Check(t, upd.Restarted)
	assert.Check(t, upd.Down == nil, "only the adapter restarts, not the project: %+v", upd)
	assert.Check(t, is.Contains(adapterPath(), "sandbox-libkrun-"+next+"-"), "the adapter runs the new package")
	check("after compose::update to " + next)

	// 3. Compose and the engine are killed: nothing adopts the VMs, and
	// after adopt_grace_ms (60 s by default) none is left.
	assert.NilError(t, compose.Process.Kill())
	waitfor.Recv(t, exited, waitfor.Default, "the killed iii compose to be reaped")
	exited <- nil
	assert.NilError(t, eng.Process.Kill())
	waitfor.Recv(t, engExited, waitfor.Default, "the killed engine to be reaped")
	engExited <- nil
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if left := procsMarked(markers...); len(left) > 0 {
			return poll.Continue("still running:\n%s", strings.Join(left, "\n"))
		}
		return poll.Success()
	}, poll.WithTimeout(3*time.Minute), poll.WithDelay(time.Second))
}

// adapterStatusJSON is one entry of engine::adapters::list.
type adapterStatusJSON struct {
	Adapter   string `json:"adapter"`
	Namespace string `json:"namespace"`
	State     string `json:"state"`
	PID       int    `json:"pid"`
	Path      string `json:"path"`
}

// nextPatch is version with its patch number one higher.
func nextPatch(t *testing.T, version string) string {
	t.Helper()
	parts := strings.Split(version, ".")
	assert.Assert(t, is.Len(parts, 3), version)
	p, err := strconv.Atoi(parts[2])
	assert.NilError(t, err)
	return fmt.Sprintf("%s.%s.%d", parts[0], parts[1], p+1)
}
