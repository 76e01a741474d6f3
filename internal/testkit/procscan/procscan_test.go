package procscan

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// A real child naming a temporary directory is found while it runs and
// not after it is reaped; the scanning process never lists itself.
func TestNamingFindsAChild(t *testing.T) {
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		t.Skip("no /proc here")
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	dir := t.TempDir()
	// A copy of sleep in dir, so argv[0] names it.
	bin := filepath.Join(dir, "sleeper")
	b, err := os.ReadFile(sleep)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(bin, b, 0o755))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "60")
	assert.NilError(t, cmd.Start())

	assert.Check(t, is.DeepEqual(Naming(dir+"/"), []int{cmd.Process.Pid}))
	live := Live()
	assert.Check(t, !slices.ContainsFunc(live, func(p Proc) bool { return p.PID == os.Getpid() }), "lists itself")
	i := slices.IndexFunc(live, func(p Proc) bool { return p.PID == cmd.Process.Pid })
	assert.Assert(t, i >= 0)
	assert.Check(t, is.DeepEqual(live[i].Args, []string{bin, "60"}))

	cancel()
	waitfor.Func(t, waitfor.Default, "the cancelled sleep to be reaped", func() { _ = cmd.Wait() })
	assert.Check(t, is.Len(Naming(dir+"/"), 0))
}

// A child frozen with SIGSTOP reads as stopped once the stop has landed,
// and as not stopped after SIGCONT; a reaped child is an error.
func TestStopped(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("no /proc here")
	}
	cmd := exec.Command("sleep", "60")
	assert.NilError(t, cmd.Start())
	pid := cmd.Process.Pid
	reaped := make(chan struct{})
	go func() { _ = cmd.Wait(); close(reaped) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		waitfor.Closed(t, reaped, waitfor.Default, "the killed sleep to be reaped")
	})

	ok, why, err := Stopped(pid)
	assert.NilError(t, err)
	assert.Check(t, !ok)
	assert.Check(t, is.Contains(why, "of pid "+strconv.Itoa(pid)))

	assert.NilError(t, syscall.Kill(pid, syscall.SIGSTOP))
	WaitStopped(t, pid)

	assert.NilError(t, syscall.Kill(pid, syscall.SIGCONT))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if ok, _, _ := Stopped(pid); ok {
			return poll.Continue("still stopped")
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(time.Millisecond))

	_ = cmd.Process.Kill()
	waitfor.Closed(t, reaped, waitfor.Default, "the killed sleep to be reaped")
	_, _, err = Stopped(pid)
	assert.Check(t, err != nil, "a reaped process should be an error")
}

func TestZombie(t *testing.T) {
	for _, tc := range []struct {
		stat string
		want bool
	}{
		{"123 (sleep) S 1 2 3", false},
		{"123 (sleep) Z 1 2 3", true},
		{"123 (a) Z (b) R 1", false},
		{"123 (odd) name) Z 1", true},
		{"", false},
		{"123 (x)", false},
	} {
		assert.Check(t, is.Equal(zombie([]byte(tc.stat)), tc.want), tc.stat)
	}
}

// zombie reads a field of a file the kernel writes, but a command name may
// hold anything: it never panics.
func FuzzZombie(f *testing.F) {
	for _, s := range []string{"1 (a) Z 0", "1 (a)", ")", ") Z", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, stat []byte) { _ = zombie(stat) })
}
