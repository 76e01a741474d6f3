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
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// TestSandboxesSurviveRestarts is issue 23's acceptance on a bare engine
// (`iii -c config.yaml`, sandbox-libkrun bound with its default
// adopt_grace_ms): four live sandboxes — a long process started by exec,
// written files, network, one claimed from the warm pool — survive kill -9
// of the adapter (the engine relaunches it), a config.yaml edit raising
// max_concurrent_sandboxes (the engine restarts the adapter), and an engine
// stop and start. After each, every sandbox answers exec with its files and
// its process, and they count toward the limit.
func TestSandboxesSurviveRestarts(t *testing.T) {
	t.Parallel()
	s := needVMs(t)
	dir := t.TempDir()
	home := dirs.Short(t, "e2ec")
	sbState := dirs.Short(t, "e2ecs")
	assert.NilError(t, os.MkdirAll(filepath.Join(home, ".iii", "cache"), 0o755))
	assert.NilError(t, os.Symlink(s.layout, filepath.Join(home, ".iii", "cache", "oci")))
	port := freePort(t)
	cfgPath := filepath.Join(dir, "config.yaml")
	write := func(maxSandboxes int) {
		content := fmt.Sprintf(`workers:
  - name: iii-worker-manager
    config: { host: 127.0.0.1, port: %d }
sandbox:
  adapter: sandbox-libkrun
  config:
    image_allowlist: [python]
    state_dir: %s
    boot_timeout_ms: 180000
    snapshot_templates: false
    warm_pool: { python: 1 }
    max_concurrent_sandboxes: %d
`, port, sbState, maxSandboxes)
		assert.NilError(t, os.WriteFile(cfgPath+".tmp", []byte(content), 0o644))
		assert.NilError(t, os.Rename(cfgPath+".tmp", cfgPath))
	}
	write(4)
	env := []string{"HOME=" + home, "III_COMPOSE_STATE_DIR=" + t.TempDir()}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "III_") {
			env = append(env, kv)
		}
	}
	var engOut syncbuf.Buffer
	var eng *exec.Cmd
	engExited := make(chan error, 1)
	startEngine := func() {
		eng = exec.Command(s.iii, "-c", cfgPath)
		eng.Dir, eng.Env, eng.Stdout, eng.Stderr = dir, env, &engOut, &engOut
		assert.NilError(t, eng.Start())
		go func(c *exec.Cmd) { engExited <- c.Wait() }(eng)
	}
	startEngine()
	t.Cleanup(func() {
		select {
		case err := <-engExited:
			engExited <- err
		default:
			_ = eng.Process.Kill()
			waitfor.Recv(t, engExited, waitfor.Default, "the killed engine to be reaped")
		}
		if t.Failed() {
			t.Logf("engine output (tail):\n%s", engOut.Tail(120))
		}
		// The VMs outlive the engine by design (adopt_grace_ms): end them.
		for _, p := range procsMarked(home, sbState) {
			if pid, err := strconv.Atoi(strings.Fields(p)[0]); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})

	user := cli{iii: s.iii, dir: dir, port: port, env: env}
	adapterPID := func() int {
		res := user.call("engine::adapters::list")
		if res.ExitCode != 0 {
			return 0
		}
		var l struct {
			Adapters []struct {
				Adapter string `json:"adapter"`
				State   string `json:"state"`
				PID     int    `json:"pid"`
			} `json:"adapters"`
		}
		if json.Unmarshal([]byte(res.Stdout()), &l) != nil {
			return 0
		}
		for _, a := range l.Adapters {
			if a.Adapter == "sandbox-libkrun" && a.State == "running" {
				return a.PID
			}
		}
		return 0
	}
	// waitAdapter waits for a running adapter other than old and returns
	// its pid.
	waitAdapter := func(old int) int {
		t.Helper()
		var pid int
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if pid = adapterPID(); pid > 0 && pid != old {
				return poll.Success()
			}
			return poll.Continue("sandbox-libkrun not running yet (old pid %d)", old)
		}, poll.WithTimeout(3*time.Minute), poll.WithDelay(200*time.Millisecond))
		return pid
	}

	pid := waitAdapter(0)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		res := user.call("sandbox-libkrun::adapter::info")
		var info struct {
			WarmPool map[string]struct {
				Ready int `json:"ready"`
			} `json:"warm_pool"`
		}
		if res.ExitCode == 0 && json.Unmarshal([]byte(res.Stdout()), &info) == nil && info.WarmPool["python"].Ready == 1 {
			return poll.Success()
		}
		return poll.Continue("the warm pool is not ready: %s", res.Stdout())
	}, poll.WithTimeout(4*time.Minute), poll.WithDelay(500*time.Millisecond))
	pooled := user.create(t, nil)
	longRun, files := user.create(t, nil), user.create(t, nil)
	network := user.create(t, map[string]any{"network": true})
	all := []string{pooled, longRun, files, network}

	user.startKeeper(t, longRun)
	secret, n0, kpid := user.askKeeper(t, longRun)
	user.callJSON(t, "sandbox::fs::write", map[string]any{"sandbox_id": files, "path": "/root/notes.txt", "content": "kept across restarts"}, nil)
	user.sh(t, pooled, "echo pooled > /root/mark")

	check := func(step string, limit int) {
		t.Helper()
		t0 := time.Now()
		s1, n1, p1 := user.askKeeper(t, longRun)
		assert.Check(t, is.Equal(s1, secret), "%s: the long process lost its memory", step)
		assert.Check(t, is.Equal(p1, kpid), "%s", step)
		assert.Check(t, n1 > n0, "%s: the counter went from %d to %d", step, n0, n1)
		assert.Check(t, is.Equal(user.sh(t, files, "cat /root/notes.txt"), "kept across restarts"), step)
		assert.Check(t, is.Equal(user.sh(t, pooled, "cat /root/mark"), "pooled\n"), step)
		assert.Check(t, is.Equal(user.sh(t, network, "echo up"), "up\n"), step)
		var l struct {
			Sandboxes []struct {
				SandboxID string `json:"sandbox_id"`
			} `json:"sandboxes"`
		}
		user.callJSON(t, "sandbox::list", map[string]any{}, &l)
		var ids []string
		for _, e := range l.Sandboxes {
			ids = append(ids, e.SandboxID)
		}
		for _, id := range all {
			assert.Check(t, is.Contains(ids, id), "%s: sandbox %s is not listed", step, id)
		}
		// They count toward the limit: with room for limit-4 more.
		extra := make([]string, 0, limit-len(all))
		for range limit - len(all) {
			extra = append(extra, user.create(t, map[string]any{"cpus": 1, "memory_mb": 384}))
		}
		res := user.call("sandbox::create", "--json", `{"image":"python","cpus":1,"memory_mb":384}`)
		assert.Check(t, res.ExitCode != 0 && strings.Contains(res.Combined(), "S400"), "%s: a create past max_concurrent_sandboxes %d: %s", step, limit, res.Combined())
		for _, id := range extra {
			user.callJSON(t, "sandbox::stop", map[string]any{"sandbox_id": id, "wait": true}, nil)
		}
		t.Logf("%s: every sandbox answered within %v", step, time.Since(t0))
	}

	// 1. kill -9 of the adapter: the engine relaunches it.
	assert.NilError(t, syscall.Kill(pid, syscall.SIGKILL))
	pid = waitAdapter(pid)
	check("after kill -9 of the adapter", 4)

	// 2. config.yaml raises max_concurrent_sandboxes: the engine applies
	// it to the running adapter (a reloadable key; a key that is not
	// restarts the adapter, through the same adoption as step 1).
	write(5)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		res := user.call("sandbox::create", "--json", `{"image":"python","cpus":1,"memory_mb":384}`)
		if res.ExitCode != 0 {
			return poll.Continue("the new limit is not applied yet: %s", res.Combined())
		}
		var out struct {
			SandboxID string `json:"sandbox_id"`
		}
		assert.NilError(t, json.Unmarshal([]byte(res.Stdout()), &out))
		user.callJSON(t, "sandbox::stop", map[string]any{"sandbox_id": out.SandboxID, "wait": true}, nil)
		return poll.Success()
	}, poll.WithTimeout(4*time.Minute), poll.WithDelay(time.Second))
	now := waitAdapter(0)
	t.Logf("after the config.yaml edit the adapter is pid %d (was %d: %s)", now, pid,
		map[bool]string{true: "reconfigured in place", false: "restarted"}[now == pid])
	check("after the config.yaml edit", 5)

	// 3. The engine stops and starts again.
	assert.NilError(t, eng.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-engExited:
		assert.NilError(t, err, "iii after SIGTERM")
	case <-time.After(time.Minute):
		t.Fatal("iii did not stop within a minute of SIGTERM")
	}
	assert.Check(t, len(procsMarked(sbState)) >= 8, "the VMs should wait for the next engine: %v", procsMarked(sbState))
	startEngine()
	waitAdapter(0)
	check("after an engine stop and start", 5)

	for _, id := range all {
		user.callJSON(t, "sandbox::stop", map[string]any{"sandbox_id": id, "wait": true}, nil)
	}
}
