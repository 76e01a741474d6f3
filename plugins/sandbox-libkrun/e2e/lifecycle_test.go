package e2e

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// TestCreateExecStop boots a sandbox, runs Python in it, and stops it; the
// stop leaves nothing behind.
func TestCreateExecStop(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	p := start(t, e, dirs.Short(t, "sb"), nil)
	id := p.create(t, nil)
	out := p.exec(t, id, "python3", "-c", "print(6*7)")
	assert.Equal(t, out.Stdout, "42\n", "stderr: %s", out.Stderr)
	assert.Assert(t, out.Success)
	// The image's environment reaches execs, and the request's is merged
	// over it.
	var env contract.ExecResponse
	p.call(t, contract.OpExec, map[string]any{"sandbox_id": id, "argv": []string{"/bin/sh", "-c", "echo $LANG $E2E"}, "env": []string{"E2E=yes"}}, &env)
	assert.Equal(t, env.Stdout, "C.UTF-8 yes\n")
	p.stop(t, id)
	assert.Check(t, is.Len(sandboxDirs(t, p.stateDir), 0))
	assert.Check(t, is.Len(sandboxProcs(p.stateDir), 0))
	p.fail(t, contract.OpExec, map[string]any{"sandbox_id": id, "cmd": "true"}, contract.S004)
}

// TestWritesStayInTheirSandbox writes into the image's directories in one
// sandbox: a second sandbox of the same image does not see the files, and
// after a stop they are gone for good (a new sandbox does not see them
// either). The image's block file on the host is never written.
func TestWritesStayInTheirSandbox(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	p := start(t, e, dirs.Short(t, "sb"), nil)
	ids := createN(t, p, 2)
	a, b := ids[0], ids[1]
	rootfs := imageFile(t, e)
	before := fileSum(t, rootfs)

	p.call(t, contract.OpFsWrite, map[string]any{"sandbox_id": a, "path": "/etc/e2e-marker", "content": "from a"}, nil)
	p.sh(t, a, "echo from-a > /usr/lib/e2e-marker2 && rm /usr/bin/python3")
	assert.Equal(t, p.sh(t, a, "cat /etc/e2e-marker /usr/lib/e2e-marker2"), "from afrom-a\n")

	p.fail(t, contract.OpFsStat, map[string]any{"sandbox_id": b, "path": "/etc/e2e-marker"}, contract.S211)
	assert.Equal(t, p.sh(t, b, "test -e /usr/lib/e2e-marker2 || echo absent"), "absent\n")
	assert.Equal(t, p.exec(t, b, "python3", "-c", "print(1)").Stdout, "1\n")

	p.stop(t, a)
	c := p.create(t, nil)
	p.fail(t, contract.OpFsStat, map[string]any{"sandbox_id": c, "path": "/etc/e2e-marker"}, contract.S211)
	assert.Equal(t, p.sh(t, c, "test -e /usr/lib/e2e-marker2 || echo absent; test -x /usr/bin/python3 && echo python"), "absent\npython\n")
	p.stop(t, b)
	p.stop(t, c)
	assert.Equal(t, fileSum(t, rootfs), before, "the image's block file changed")
}

// TestExecTimeoutKillsEverything runs an exec that outlives its timeout and
// leaves children behind: the call fails with S200 and no process of it is
// left in the guest.
func TestExecTimeoutKillsEverything(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	p := start(t, e, dirs.Short(t, "sb"), nil)
	id := p.create(t, nil)
	defer p.stop(t, id)
	se := p.fail(t, contract.OpExec, map[string]any{
		"sandbox_id": id, "argv": []string{"/bin/sh", "-c", "sleep 3001 & (sleep 3002 &) ; sleep 3003"}, "timeout_ms": 1000,
	}, contract.S200)
	assert.Check(t, is.Contains(se.Message, "timeout"))
	// The kill is sent before S200 returns; a killed process still shows
	// for the moment it takes to exit.
	list := `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done`
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		out := p.sh(t, id, list)
		if strings.Contains(out, "sleep 300") {
			return poll.Continue("still running in the guest:\n%s", out)
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(200*time.Millisecond))
}

// TestExecCap runs five execs at once in a sandbox whose cap is four:
// exactly one is refused with S003 and the other four run.
func TestExecCap(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	p := start(t, e, dirs.Short(t, "sb"), map[string]any{"max_concurrent_exec_per_sandbox": 4})
	id := p.create(t, nil)
	defer p.stop(t, id)
	// Every exec waits for a gate file before its `sleep 2`, so none can
	// finish before all five have been sent, however slow the host.
	script := "while [ ! -e /tmp/gate ]; do sleep 0.05; done; sleep 2"
	errs := make(chan error, 5)
	for range 5 {
		go func() {
			_, err := p.Call(ctxT(t), contract.OpExec, map[string]any{"sandbox_id": id, "argv": []string{"/bin/sh", "-c", script}})
			errs <- err
		}()
	}
	var refused *contract.Error
	select {
	case err := <-errs:
		assert.Assert(t, errors.As(err, &refused), "the first exec to return must be the refused one, got %v", err)
		assert.Equal(t, refused.Code, contract.S003)
	case <-time.After(callTimeout):
		t.Fatal("no exec was refused")
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		var list contract.ListResponse
		p.call(t, contract.OpList, nil, &list)
		if n := list.Sandboxes[0].ExecInFlight; n != 4 {
			return poll.Continue("%d execs in flight", n)
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute))
	p.call(t, contract.OpFsWrite, map[string]any{"sandbox_id": id, "path": "/tmp/gate", "content": ""}, nil)
	for i := range 4 {
		assert.NilError(t, waitfor.Recv(t, errs, 2*time.Minute, fmt.Sprintf("gated exec %d of 4 to finish once the gate opened", i+1)))
	}
}

// TestAdapterKilledLeavesNoVM kills the adapter with SIGKILL while three
// VMs run: their runners see the lifeline close and take their QEMUs with
// them, within two seconds.
func TestAdapterKilledLeavesNoVM(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	p := start(t, e, dirs.Short(t, "sb"), nil)
	createN(t, p, 3)
	running := procsUnder(p.stateDir)
	assert.Assert(t, len(running) >= 6, "want 3 runners and 3 QEMUs, got %v", running)
	assert.NilError(t, syscall.Kill(p.pid, syscall.SIGKILL))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if left := procsUnder(p.stateDir); len(left) > 0 {
			return poll.Continue("still running: %v", left)
		}
		return poll.Success()
	}, poll.WithTimeout(2*time.Second), poll.WithDelay(20*time.Millisecond))
}

// TestCreateStopCycles creates and stops 20 sandboxes in turn: nothing is
// left behind (process, socket, state directory, mount), and the adapter
// holds no more file descriptors than after the first cycle.
func TestCreateStopCycles(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	p := start(t, e, dirs.Short(t, "sb"), nil)
	mountsBefore := mounts(t)
	var fds int
	for i := range 20 {
		id := p.create(t, nil)
		assert.Equal(t, p.sh(t, id, "echo $((40+2))"), "42\n")
		p.stop(t, id)
		if i == 0 {
			fds = openFDs(t, p.pid)
		}
		assert.Check(t, is.Len(sandboxDirs(t, p.stateDir), 0), "cycle %d", i)
		assert.Check(t, is.Len(sandboxProcs(p.stateDir), 0), "cycle %d", i)
	}
	assert.Equal(t, mounts(t), mountsBefore)
	assert.Assert(t, openFDs(t, p.pid) <= fds, "the adapter holds more descriptors after 20 cycles than after one")
	var list contract.ListResponse
	p.call(t, contract.OpList, nil, &list)
	for _, s := range list.Sandboxes {
		assert.Check(t, s.Stopped)
	}
}

// createN boots n sandboxes at once and returns their ids.
func createN(t *testing.T, p *proc, n int) []string {
	t.Helper()
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i] = p.create(t, nil)
		}()
	}
	// Booting n VMs at once on a loaded host takes a while.
	waitfor.Group(t, &wg, 5*time.Minute, fmt.Sprintf("%d sandboxes to boot", n))
	return ids
}

// imageFile is the python image's installed block file.
func imageFile(t *testing.T, e *env) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(e.cacheDir, "images", "sha256", "*", "rootfs.erofs"))
	assert.NilError(t, err)
	assert.Assert(t, len(m) > 0, "no installed image under %s", e.cacheDir)
	return m[0]
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	assert.NilError(t, err)
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	assert.NilError(t, err)
	return string(h.Sum(nil))
}

func openFDs(t *testing.T, pid int) int {
	t.Helper()
	des, err := os.ReadDir(filepath.Join("/proc", itoa(pid), "fd"))
	assert.NilError(t, err)
	return len(des)
}
