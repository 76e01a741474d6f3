package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
)

// adoptConfig turns adoption on: a killed or stopped adapter's VMs wait
// this long for the next adapter on the same state_dir.
func adoptConfig(graceMS int, extra map[string]any) map[string]any {
	cfg := map[string]any{"adopt_grace_ms": graceMS}
	for k, v := range extra {
		cfg[k] = v
	}
	return cfg
}

// listed is the adapter's list, by sandbox id.
func listed(t *testing.T, p *proc) map[string]contract.ListEntry {
	t.Helper()
	var l contract.ListResponse
	p.call(t, contract.OpList, nil, &l)
	out := map[string]contract.ListEntry{}
	for _, e := range l.Sandboxes {
		if !e.Stopped {
			out[e.SandboxID] = e
		}
	}
	return out
}

// TestSandboxesOutliveTheAdapter: four live sandboxes (a long process
// started by exec, written files, network, one claimed from the warm pool)
// survive kill -9 of their adapter and a graceful stop, each adopted by
// the next adapter on the same state_dir under its id with its process and
// files, and counted toward max_concurrent_sandboxes; a paused sandbox is
// adopted paused and resumes with its process's memory.
func TestSandboxesOutliveTheAdapter(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	state := dirs.Short(t, "ad")
	cfg := adoptConfig(60_000, map[string]any{"warm_pool": map[string]any{"python": 1}, "max_concurrent_sandboxes": 4, "snapshot_templates": false})
	a := start(t, e, state, cfg)
	waitPoolReady(t, a, "python", 1)
	pooled := a.create(t, nil)
	assert.Assert(t, claimed(t, a, pooled), "the first create did not claim the pooled VM")
	longRun, files := a.create(t, nil), a.create(t, nil)
	network := a.create(t, map[string]any{"network": true, "name": "with-net", "idle_timeout_secs": 900})
	all := []string{longRun, files, network, pooled}

	a.call(t, contract.OpFsWrite, map[string]any{"sandbox_id": longRun, "path": "/tmp/keeper.py", "content": keeperPy}, nil)
	a.sh(t, longRun, "nohup python3 /tmp/keeper.py >/dev/null 2>&1 &")
	secret, n0, pid := askKeeper(t, a, longRun)
	a.call(t, contract.OpFsWrite, map[string]any{"sandbox_id": files, "path": "/root/notes.txt", "content": "kept across adapters"}, nil)
	a.sh(t, pooled, "echo pooled > /root/mark")
	// (A VM claimed from the warm pool, which refills at once, has its
	// state directory named after its pool id: vmPID finds it.)
	vms := map[string]int{}
	for _, id := range all {
		vms[id] = vmPID(t, a, id)
	}

	check := func(t *testing.T, p *proc) {
		t.Helper()
		l := listed(t, p)
		for _, id := range all {
			_, ok := l[id]
			assert.Check(t, ok, "sandbox %s was not adopted; list %v", id, l)
		}
		assert.Check(t, is.Equal(l[network].Name, "with-net"))
		s, n, p1 := askKeeper(t, p, longRun)
		assert.Check(t, is.Equal(s, secret), "the long process lost its memory")
		assert.Check(t, is.Equal(p1, pid))
		assert.Check(t, n > n0)
		assert.Check(t, is.Equal(p.sh(t, files, "cat /root/notes.txt"), "kept across adapters"))
		assert.Check(t, is.Equal(p.sh(t, pooled, "cat /root/mark"), "pooled\n"))
		assert.Check(t, is.Equal(p.sh(t, network, "echo up"), "up\n"))
		for id, pid := range vms {
			assert.Check(t, is.Equal(vmPID(t, p, id), pid), "sandbox %s runs another VM", id)
		}
		// Adopted sandboxes count toward the limit at once.
		p.fail(t, contract.OpCreate, map[string]any{"image": "python", "cpus": 1, "memory_mb": 384}, contract.S400)
	}

	// kill -9: no goodbye; the runners wait.
	assert.NilError(t, syscall.Kill(a.pid, syscall.SIGKILL))
	t0 := time.Now()
	b := start(t, e, state, cfg)
	t.Logf("adapter restarted after kill -9: %d sandboxes adopted in %v", len(listed(t, b)), time.Since(t0))
	check(t, b)

	// A graceful stop (an upgrade, an engine restart) detaches them.
	b.client.Kill()
	assert.Check(t, strings.Contains(b.logs.String(), "left every sandbox running for the next adapter process"), b.logs.String())
	c := start(t, e, state, cfg)
	check(t, c)

	// A paused sandbox is adopted paused, and resumes where it was.
	var st contract.SandboxStatus
	c.call(t, contract.OpPause, map[string]any{"sandbox_id": longRun}, &st)
	assert.Equal(t, st.Status, contract.SandboxPaused)
	assert.NilError(t, syscall.Kill(c.pid, syscall.SIGKILL))
	d := start(t, e, state, cfg)
	l := listed(t, d)
	assert.Check(t, l[longRun].Paused, "the paused sandbox was not adopted paused: %+v", l[longRun])
	d.call(t, contract.OpResume, map[string]any{"sandbox_id": longRun}, &st)
	s, _, p1 := askKeeper(t, d, longRun)
	assert.Check(t, is.Equal(s, secret))
	assert.Check(t, is.Equal(p1, pid))

	for _, id := range all {
		d.stop(t, id)
	}
	// Stopped sandboxes leave nothing; the warm pool's VM goes with its
	// adapter even when sandboxes are kept (it is no one's yet).
	d.client.Kill()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if left, names := procsUnder(state), sandboxDirs(t, state); len(left)+len(names) > 0 {
			return poll.Continue("processes %v, directories %v", left, names)
		}
		return poll.Success()
	}, poll.WithTimeout(15*time.Second), poll.WithDelay(50*time.Millisecond))
}

// TestAdoptionGraceExpires: with the adapter gone longer than
// adopt_grace_ms, no runner or QEMU is left, and the next adapter cleans
// the directories.
func TestAdoptionGraceExpires(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	state := dirs.Short(t, "ag")
	cfg := adoptConfig(2_000, map[string]any{"snapshot_templates": false})
	a := start(t, e, state, cfg)
	createN(t, a, 2)
	assert.Assert(t, len(procsUnder(state)) >= 4, "want 2 runners and 2 QEMUs, got %v", procsUnder(state))
	assert.NilError(t, syscall.Kill(a.pid, syscall.SIGKILL))
	killed := time.Now()
	// Within the grace the VMs are still there.
	time.Sleep(500 * time.Millisecond)
	assert.Check(t, len(procsUnder(state)) >= 4, "the VMs went before the grace ran out")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if left := procsUnder(state); len(left) > 0 {
			return poll.Continue("still running %v after %v", left, time.Since(killed))
		}
		return poll.Success()
	}, poll.WithTimeout(15*time.Second), poll.WithDelay(50*time.Millisecond))
	t.Logf("every runner and QEMU gone %v after the kill (grace 2 s)", time.Since(killed))
	b := start(t, e, state, cfg)
	assert.Check(t, is.Len(listed(t, b), 0))
	assert.Check(t, is.Len(sandboxDirs(t, state), 0))
}
