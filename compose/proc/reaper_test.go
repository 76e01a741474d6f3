package proc

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func selfExe(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	assert.NilError(t, err)
	return exe
}

func waitGone(t *testing.T, what string, gone func() bool) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if gone() {
			return poll.Success()
		}
		return poll.Continue("%s still alive", what)
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(20*time.Millisecond))
}

// When the lifeline breaks without "exit", the reaper kills every group
// it was told about (including a member that ignores SIGTERM) and exits.
func TestReaperKillsOnLifelineEOF(t *testing.T) {
	t.Parallel()
	r, err := StartReaper(ctxT(t), selfExe(t), 200*time.Millisecond)
	assert.NilError(t, err)
	p, err := Start(Spec{Command: "trap '' TERM; sleep 300 & sleep 300; wait", Env: testEnv()})
	assert.NilError(t, err)
	// Cleanup only: the test is about the reaper, not about Stop.
	defer func(ctx context.Context) { _ = p.Stop(ctx, 0) }(ctxT(t))
	gone, err := Start(Spec{Command: "true", Env: testEnv()})
	assert.NilError(t, err)
	assert.NilError(t, gone.Wait(ctxT(t)))
	assert.NilError(t, r.Track(p.Pid, p.Birth, PhaseWorker))
	assert.NilError(t, r.Track(gone.Pid, gone.Birth, PhaseWorker))

	// Break the lifeline the way a dead Compose does: close without exit.
	r.mu.Lock()
	assert.NilError(t, r.w.Close())
	r.w = nil
	r.mu.Unlock()
	waitGone(t, "the worker group", func() bool { return !groupAlive(p.Pid) })
	waitfor.Closed(t, r.Done(), waitfor.Default, "the reaper to exit once its lifeline broke")
	assert.NilError(t, p.Wait(ctxT(t)))
}

// A clean "exit" leaves the groups alone; untracked groups are never
// touched.
func TestReaperExitKillsNothing(t *testing.T) {
	t.Parallel()
	r, err := StartReaper(ctxT(t), selfExe(t), time.Second)
	assert.NilError(t, err)
	p, err := Start(Spec{Command: "sleep 300", Env: testEnv()})
	assert.NilError(t, err)
	// Cleanup only: the test is about the reaper, not about Stop.
	defer func(ctx context.Context) { _ = p.Stop(ctx, time.Second) }(ctxT(t))
	assert.NilError(t, r.Track(p.Pid, p.Birth, PhaseWorker))
	assert.NilError(t, r.Close(ctxT(t)))
	assert.Check(t, groupAlive(p.Pid))
	assert.ErrorContains(t, r.Track(1234, "", PhaseWorker), "closed")

	r2, err := StartReaper(ctxT(t), selfExe(t), time.Second)
	assert.NilError(t, err)
	assert.NilError(t, r2.Track(p.Pid, p.Birth, PhaseWorker))
	assert.NilError(t, r2.Untrack(p.Pid))
	r2.mu.Lock()
	_ = r2.w.Close()
	r2.w = nil
	r2.mu.Unlock()
	waitfor.Closed(t, r2.Done(), waitfor.Default, "the reaper to exit once its lifeline broke")
	assert.Check(t, groupAlive(p.Pid), "an untracked group survives the reaper")
}

// A Compose killed with SIGKILL leaves nothing: its reaper sees the
// lifeline break and kills the worker group, then exits itself.
func TestSIGKILLedComposeLeavesNoWorker(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(selfExe(t), "fake-compose")
	stdin, err := cmd.StdinPipe()
	assert.NilError(t, err)
	defer stdin.Close()
	out, err := cmd.StdoutPipe()
	assert.NilError(t, err)
	cmd.Stderr = os.Stderr
	assert.NilError(t, cmd.Start())
	var line string
	waitfor.Func(t, waitfor.Default, "fake-compose to print its reaper and worker pids", func() {
		line, err = bufio.NewReader(out).ReadString('\n')
	})
	assert.NilError(t, err)
	f := strings.Fields(line)
	assert.Equal(t, len(f), 2, line)
	reaper, _ := strconv.Atoi(f[0])
	worker, _ := strconv.Atoi(f[1])
	assert.Check(t, groupAlive(worker))

	assert.NilError(t, cmd.Process.Kill())
	waitfor.Func(t, waitfor.Default, "the killed fake-compose to be reaped", func() { _ = cmd.Wait() })
	waitGone(t, "the worker group", func() bool { return !groupAlive(worker) })
	waitGone(t, "the reaper", func() bool { return !Alive(reaper) })
}

func TestParseReaperLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line string
		ok   bool
		want reaperCmd
	}{
		{"exit", true, reaperCmd{op: "exit"}},
		{"track 100 123 0", true, reaperCmd{op: "track", g: reaperGroup{100, "123", 0}}},
		{"track 100 - 1", true, reaperCmd{op: "track", g: reaperGroup{100, "", 1}}},
		{"untrack 100", true, reaperCmd{op: "untrack", g: reaperGroup{pgid: 100}}},
		{"track 1 123 0", false, reaperCmd{}},
		{"track -5 123 0", false, reaperCmd{}},
		{"track 100 123 7", false, reaperCmd{}},
		{"track x 1 0", false, reaperCmd{}},
		{"", false, reaperCmd{}},
		{"exit now", false, reaperCmd{}},
	}
	for _, tc := range tests {
		got, ok := parseReaperLine(tc.line)
		assert.Equal(t, ok, tc.ok, tc.line)
		if ok {
			assert.Equal(t, got, tc.want, tc.line)
		}
	}
}

func FuzzParseReaperLine(f *testing.F) {
	f.Add("track 100 123 0")
	f.Add("untrack 5")
	f.Add("exit")
	f.Fuzz(func(t *testing.T, line string) {
		c, ok := parseReaperLine(line)
		if ok && c.op != "exit" && c.g.pgid <= 1 {
			t.Fatalf("accepted group %d from %q", c.g.pgid, line)
		}
	})
}
