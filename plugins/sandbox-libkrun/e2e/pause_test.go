package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/keeper"
)

// keeperPy is the long-running Python process the pause and adoption
// tests start by exec (internal/testkit/keeper).
const keeperPy = keeper.Script

// askKeeper asks the keeper for its secret, counter and pid.
func askKeeper(t *testing.T, p *proc, id string) (secret string, n int, pid string) {
	t.Helper()
	out := p.sh(t, id, keeper.Ask)
	f := strings.Fields(out)
	assert.Assert(t, is.Len(f, 3), "the keeper did not answer: %q", out)
	n, err := strconv.Atoi(f[1])
	assert.NilError(t, err)
	return f[0], n, f[2]
}

// vmPID is the sandbox's QEMU as its runner recorded it, checked to be a
// live process of the sandbox's state directory.
func vmPID(t *testing.T, p *proc, id string) int {
	t.Helper()
	dir := sandboxDirOf(t, p.stateDir, id)
	b, err := os.ReadFile(filepath.Join(dir, "vm.pid"))
	assert.NilError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	assert.NilError(t, err)
	assert.Check(t, isProcOf(pid, dir), "vm.pid %d is not a live process of %s", pid, dir)
	return pid
}

// sandboxDirOf is the state directory of sandbox id: <state>/<id>, or,
// for a VM claimed from the warm pool, the directory named after its pool
// id whose sandbox.json names the sandbox.
func sandboxDirOf(t *testing.T, stateDir, id string) string {
	t.Helper()
	dir := filepath.Join(stateDir, id)
	if _, err := os.Stat(dir); err == nil {
		return dir
	}
	des, err := os.ReadDir(stateDir)
	assert.NilError(t, err)
	for _, de := range des {
		b, err := os.ReadFile(filepath.Join(stateDir, de.Name(), "sandbox.json"))
		if err == nil && strings.Contains(string(b), `"sandbox_id": "`+id+`"`) {
			return filepath.Join(stateDir, de.Name())
		}
	}
	t.Fatalf("no state directory of sandbox %s under %s", id, stateDir)
	return ""
}

// isProcOf reports whether pid is a live process whose arguments mention
// dir.
func isProcOf(pid int, dir string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && strings.Contains(string(b), dir)
}

// pauseCycle pauses sandbox id and checks what a paused sandbox is: no
// QEMU and no runner, its state on disk beside its overlay, listed as
// paused, exec and fs refused with S005; then resumes it.
func pauseCycle(t *testing.T, p *proc, id string) {
	t.Helper()
	dir := filepath.Join(p.stateDir, id)
	pid := vmPID(t, p, id)
	var st contract.SandboxStatus
	p.call(t, contract.OpPause, map[string]any{"sandbox_id": id}, &st)
	assert.Equal(t, st.Status, contract.SandboxPaused)

	assert.Check(t, !isProcOf(pid, dir), "QEMU (pid %d) still runs while the sandbox is paused", pid)
	assert.Check(t, is.Len(procsUnder(dir), 0), "processes of a paused sandbox")
	fi, err := os.Stat(filepath.Join(dir, "pause.state"))
	assert.NilError(t, err)
	assert.Check(t, fi.Size() > 1<<20, "the saved state is %d bytes", fi.Size())
	_, err = os.Stat(filepath.Join(dir, "pause.json"))
	assert.Check(t, err)
	var l contract.ListResponse
	p.call(t, contract.OpList, nil, &l)
	var found bool
	for _, e := range l.Sandboxes {
		if e.SandboxID == id {
			found = true
			assert.Check(t, e.Paused && !e.Stopped, "list entry %+v", e)
		}
	}
	assert.Check(t, found, "the paused sandbox is not listed")
	se := p.fail(t, contract.OpExec, map[string]any{"sandbox_id": id, "cmd": "true"}, contract.S005)
	assert.Check(t, is.Contains(se.Message, "sandbox::resume"))
	p.fail(t, contract.OpFsStat, map[string]any{"sandbox_id": id, "path": "/"}, contract.S005)

	p.call(t, contract.OpResume, map[string]any{"sandbox_id": id}, &st)
	assert.Equal(t, st.Status, contract.SandboxRunning)
	assert.Check(t, vmPID(t, p, id) != pid, "the resumed VM is a new QEMU")
	_, err = os.Stat(filepath.Join(dir, "pause.state"))
	assert.Check(t, os.IsNotExist(err), "the saved state outlived the resume")
}

// TestPauseResume: a paused sandbox has no QEMU process and its state is
// a file beside its overlay; resume brings back a Python process started
// by exec with its variables (same secret, same pid, its counter moved on),
// the files, and fresh /dev/urandom output and clock. Both a cold-booted
// sandbox and one restored from a snapshot template pause and resume, and
// each twice.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	state := dirs.Short(t, "pz")
	p := start(t, e, state, nil)
	info := p.info(t)
	caps, _ := info["capabilities"].([]any)
	assert.Check(t, is.Contains(caps, contract.CapabilityPause), "adapter::info %v", info)

	cold := p.create(t, nil)
	waitTemplate(t, p, "python-")
	clone := p.create(t, nil)
	assert.Check(t, is.Contains(readyLine(t, p, clone), `"restored":true`))

	for _, id := range []string{cold, clone} {
		t.Run(map[string]string{cold: "cold", clone: "clone"}[id], func(t *testing.T) {
			p.call(t, contract.OpFsWrite, map[string]any{"sandbox_id": id, "path": "/tmp/keeper.py", "content": keeperPy}, nil)
			p.call(t, contract.OpFsWrite, map[string]any{"sandbox_id": id, "path": "/root/kept.txt", "content": "written before the pause"}, nil)
			p.sh(t, id, "nohup python3 /tmp/keeper.py >/dev/null 2>&1 &")
			secret, n0, pid := askKeeper(t, p, id)
			// Under TCG on a loaded host a guest's clock drifts: only
			// the clock a resume sets is checked (freshness, first
			// thing after the resume).
			rand0 := strings.TrimSpace(p.sh(t, id, "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'"))

			pauseCycle(t, p, id)
			rand1 := freshness(t, p, id)
			assert.Check(t, rand1 != rand0, "/dev/urandom repeats after resume")
			s1, n1, pid1 := askKeeper(t, p, id)
			assert.Check(t, is.Equal(s1, secret), "the Python process lost its variables")
			assert.Check(t, is.Equal(pid1, pid))
			assert.Check(t, n1 > n0, "the counter went from %d to %d", n0, n1)
			assert.Equal(t, p.sh(t, id, "cat /root/kept.txt"), "written before the pause")

			pauseCycle(t, p, id)
			assert.Check(t, freshness(t, p, id) != rand1)
			s2, n2, _ := askKeeper(t, p, id)
			assert.Check(t, is.Equal(s2, secret))
			assert.Check(t, n2 > n1)
		})
	}

	// A paused sandbox stops: nothing of it is left.
	var st contract.SandboxStatus
	p.call(t, contract.OpPause, map[string]any{"sandbox_id": cold}, &st)
	p.stop(t, cold)
	p.stop(t, clone)
	assert.Check(t, is.Len(sandboxDirs(t, p.stateDir), 0))
	assert.Check(t, is.Len(sandboxProcs(p.stateDir), 0))
}
