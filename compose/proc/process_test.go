package proc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func testEnv(extra ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH")}, extra...)
}

func groupAlive(pgid int) bool {
	return !errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// The environment a process gets is exactly the one given: nothing leaks
// from Compose's own environment. Serial: the process environment it sets
// is what the test is about.
func TestStartEnvironmentIsBuilt(t *testing.T) {
	t.Setenv("PROC_TEST_SECRET", "leak")
	dir := t.TempDir()
	l, err := OpenLog(dir, "w", LogOptions{})
	assert.NilError(t, err)
	defer l.Close()
	p, err := Start(Spec{Command: "env; pwd", Dir: dir, Env: testEnv("GIVEN=yes"), Log: l})
	assert.NilError(t, err)
	assert.NilError(t, p.Wait(ctxT(t)))
	waitfor.Closed(t, p.OutputDone(), waitfor.Default, "the output copy to end")
	assert.Equal(t, p.ExitStatus(), "exit status 0")
	res, err := ReadLog(dir, "w", ReadOptions{Tail: 100})
	assert.NilError(t, err)
	var lines []string
	for _, e := range res.Entries {
		lines = append(lines, e.Message)
	}
	all := strings.Join(lines, "\n")
	assert.Check(t, is.Contains(all, "GIVEN=yes"))
	assert.Check(t, !strings.Contains(all, "PROC_TEST_SECRET"), all)
	real, _ := filepath.EvalSymlinks(dir)
	assert.Check(t, is.Contains(all, real))
}

// Stop ends every member of the group, not only the leader: a background
// child of the shell goes too.
func TestStopEndsTheWholeGroup(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		command string
		status  string
	}{
		{"polite", "sleep 300 & echo ready; sleep 300", "signal: terminated"},
		{"ignores SIGTERM", "trap '' TERM; sleep 300 & echo ready; sleep 300; wait", "signal: killed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l, err := OpenLog(dir, "w", LogOptions{})
			assert.NilError(t, err)
			defer l.Close()
			p, err := Start(Spec{Command: tc.command, Env: testEnv(), Log: l})
			assert.NilError(t, err)
			// Signal only once the shell has set its traps.
			poll.WaitOn(t, func(poll.LogT) poll.Result {
				if len(TailLines(dir, "w", 1)) == 1 {
					return poll.Success()
				}
				return poll.Continue("waiting for the shell")
			}, poll.WithTimeout(30*time.Second))
			assert.Assert(t, p.Birth != "")
			assert.Check(t, groupAlive(p.Pid))
			assert.Check(t, !p.Exited())
			assert.NilError(t, p.Stop(ctxT(t), 300*time.Millisecond))
			assert.Check(t, !groupAlive(p.Pid))
			assert.Check(t, p.Exited())
			assert.Check(t, is.Equal(p.ExitStatus(), tc.status))
		})
	}
}

// A start in a missing directory fails before anything runs.
func TestStartMissingDir(t *testing.T) {
	t.Parallel()
	_, err := Start(Spec{Command: "true", Dir: filepath.Join(t.TempDir(), "nope"), Env: testEnv()})
	assert.ErrorContains(t, err, "working directory")
}

// A grandchild that keeps the output pipe open does not hold up Wait or
// Stop of the group.
func TestWaitDoesNotWaitForPipeHolders(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := OpenLog(dir, "w", LogOptions{})
	assert.NilError(t, err)
	defer l.Close()
	p, err := Start(Spec{Command: "sleep 300 & echo started", Env: testEnv(), Log: l})
	assert.NilError(t, err)
	assert.NilError(t, p.Wait(ctxT(t)))
	assert.Check(t, groupAlive(p.Pid), "the background sleep is still in the group")
	assert.NilError(t, p.Stop(ctxT(t), time.Second))
	waitfor.Closed(t, p.OutputDone(), waitfor.Default, "the output copy to end once the group is stopped")
	lines := TailLines(dir, "w", 10)
	assert.DeepEqual(t, lines, []string{"started"})
}

// An adopted process (not our child) is stopped through its group and its
// exit is seen by polling.
func TestAdoptAndStop(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sh", "-c", "sleep 300")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	assert.NilError(t, cmd.Start())
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	defer func() {
		_ = cmd.Process.Kill()
		waitfor.Closed(t, waited, waitfor.Default, "the adopted sleep to be reaped")
	}()

	birth, err := Birth(cmd.Process.Pid)
	assert.NilError(t, err)
	assert.Equal(t, Check(cmd.Process.Pid, birth), Same)
	assert.Equal(t, Check(cmd.Process.Pid, birth+"1"), Gone, "another birth is another process")
	assert.Equal(t, Check(cmd.Process.Pid, ""), Unverifiable)

	p := Adopt(cmd.Process.Pid, birth)
	assert.Check(t, p.Adopted())
	assert.Check(t, !p.Exited())
	// The adopter is not the parent, so the parent's Wait reaps; Stop only
	// needs the group to empty.
	assert.NilError(t, p.Stop(ctxT(t), time.Second))
	waitfor.Closed(t, waited, waitfor.Default, "the adopted sleep to be reaped by its parent")
	assert.Check(t, p.Exited())
	assert.Equal(t, Check(cmd.Process.Pid, birth), Gone)
}

func TestBirthOfSelfIsStable(t *testing.T) {
	t.Parallel()
	a, err := Birth(os.Getpid())
	assert.NilError(t, err)
	b, err := Birth(os.Getpid())
	assert.NilError(t, err)
	assert.Equal(t, a, b)
	assert.Equal(t, Check(os.Getpid(), a), Same)
	assert.Equal(t, Check(0, a), Gone)
	assert.Equal(t, Check(-5, a), Gone)
}

func TestParseStat(t *testing.T) {
	t.Parallel()
	tail := " 1 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 %s 1000 100 18446744073709551615"
	tests := []struct {
		name  string
		line  string
		birth string
		zomb  bool
		err   string
	}{
		{"plain", "42 (sleep) S" + strings.Replace(tail, "%s", "123456", 1), "123456", false, ""},
		{"comm with spaces and parens", "42 (a) b (c) R" + strings.Replace(tail, "%s", "99", 1), "99", false, ""},
		{"zombie", "42 (x) Z" + strings.Replace(tail, "%s", "7", 1), "7", true, ""},
		{"no comm", "42 x S 1 2", "", false, "no command name"},
		{"short", "42 (x) S 1 2 3", "", false, "fields"},
		{"not a number", "42 (x) S" + strings.Replace(tail, "%s", "abc", 1), "", false, "not a number"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, err := parseStat([]byte(tc.line))
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, id.Birth, tc.birth)
			assert.Equal(t, id.Zombie, tc.zomb)
		})
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte("42 (sleep) S 1 1 1 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123 1000"))
	f.Add([]byte("1 ()) Z"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		id, err := parseStat(data)
		if err == nil && id.Birth == "" {
			t.Fatal("a parsed stat line must carry a birth")
		}
	})
}

// An executable still open for writing somewhere in this process ("text
// file busy", as a package binary Compose just wrote can be while another
// goroutine forks) starts once the descriptor is gone.
func TestStartWaitsOutTextFileBusy(t *testing.T) {
	t.Parallel()
	src, err := exec.LookPath("true")
	assert.NilError(t, err)
	data, err := os.ReadFile(src)
	assert.NilError(t, err)
	bin := filepath.Join(t.TempDir(), "busy")
	w, err := os.OpenFile(bin, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	assert.NilError(t, err)
	_, err = w.Write(data)
	assert.NilError(t, err)
	_, err = exec.Command(bin).Output()
	assert.Assert(t, errors.Is(err, syscall.ETXTBSY), "while open for writing: %v", err)
	// The descriptor stays open until Start's first attempt has failed
	// with "text file busy"; it is closed before the next.
	var busy []int
	p, err := Start(Spec{Argv: []string{bin}, Dir: t.TempDir(), Env: testEnv(), onBusy: func(attempt int) {
		if len(busy) == 0 {
			_ = w.Close()
		}
		busy = append(busy, attempt)
	}})
	assert.NilError(t, err)
	assert.DeepEqual(t, busy, []int{1})
	assert.NilError(t, p.Wait(ctxT(t)))
}
