package runner

import (
	"bufio"
	"context"
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

	"github.com/iii-sandbox/iii/internal/testkit/procscan"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

const uuid1 = "11111111-2222-4333-8444-555555555555"

func spawnTest(t *testing.T, hostname string) (*Dir, *Process) {
	t.Helper()
	d, err := CreateDir(t.TempDir(), uuid1)
	assert.NilError(t, err)
	t.Cleanup(func() { _ = d.Remove() })
	p, err := Spawn(context.Background(), SpawnOptions{Executable: os.Args[0], Dir: d, Config: testConfig(d.Path, hostname)})
	assert.NilError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.Kill(ctx)
	})
	return d, p
}

func waitFile(t *testing.T, p string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := os.Stat(p); err != nil {
			return poll.Continue("no %s yet", p)
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(5*time.Millisecond))
}

// TestSpawnReleaseStopsRunner starts a real runner process: it records its
// pid and the VM's, runs in a session of its own, and when its lifeline
// closes it stops the VM and exits cleanly.
func TestSpawnReleaseStopsRunner(t *testing.T) {
	d, p := spawnTest(t, "")
	waitFile(t, d.File("vm-started"))
	assert.Equal(t, readPID(t, d.File(RunnerPIDName)), p.PID)
	assert.Equal(t, readPID(t, d.File(VMPIDName)), p.PID)
	sid, err := getsid(p.PID)
	assert.NilError(t, err)
	assert.Equal(t, sid, p.PID, "the runner must lead its own session")
	cfg, err := os.Stat(d.File(ConfigName))
	assert.NilError(t, err)
	assert.Equal(t, cfg.Mode().Perm(), os.FileMode(0o600))

	p.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	assert.NilError(t, p.Wait(ctx))
	assert.NilError(t, p.ExitErr())
	b, err := os.ReadFile(d.File("vm-stopped"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), "lifeline"))
}

// TestRunnerExitsWhenVMEnds: a guest that powers off ends its runner.
func TestRunnerExitsWhenVMEnds(t *testing.T) {
	_, p := spawnTest(t, "poweroff")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	assert.NilError(t, p.Wait(ctx))
	assert.NilError(t, p.ExitErr())
}

// TestStopKillsAStuckRunner: a runner that does not react to its lifeline
// (frozen here) is killed after the grace.
func TestStopKillsAStuckRunner(t *testing.T) {
	d, p := spawnTest(t, "")
	waitFile(t, d.File("vm-started"))
	assert.NilError(t, syscall.Kill(p.PID, syscall.SIGSTOP))
	procscan.WaitStopped(t, p.PID) // else a thread may still obey the lifeline
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	assert.NilError(t, p.Stop(ctx, 100*time.Millisecond))
	assert.ErrorContains(t, p.ExitErr(), "killed")
}

// TestRunnerDiesWithItsAdapter kills an adapter (a process that spawned a
// runner) with SIGKILL: the runner reads EOF on its lifeline and exits.
func TestRunnerDiesWithItsAdapter(t *testing.T) {
	dir := filepath.Join(t.TempDir(), uuid1)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envSpawner+"="+dir)
	out, err := cmd.StdoutPipe()
	assert.NilError(t, err)
	assert.NilError(t, cmd.Start())
	var line string
	waitfor.Func(t, waitfor.Default, "the spawner to print the runner's pid", func() { line, err = bufio.NewReader(out).ReadString('\n') })
	assert.NilError(t, err, "the spawner said nothing")
	runnerPID, err := strconv.Atoi(strings.TrimSpace(line))
	assert.NilError(t, err, "the spawner said %q", line)
	waitFile(t, filepath.Join(dir, "vm-started"))

	assert.NilError(t, cmd.Process.Kill())
	waitfor.Func(t, waitfor.Default, "the killed spawner to be reaped", func() { _ = cmd.Wait() })
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if alive(runnerPID) {
			return poll.Continue("runner %d still alive", runnerPID)
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(10*time.Millisecond))
	b, err := os.ReadFile(filepath.Join(dir, "vm-stopped"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), "lifeline"))
}

// TestMainRefusesHandRuns: without a lifeline or a configuration a runner
// refuses to start.
func TestMainRefusesHandRuns(t *testing.T) {
	for name, args := range map[string][]string{
		"no args":       {},
		"relative dir":  {Subcommand, "relative"},
		"extra args":    {Subcommand, "/tmp", "x"},
		"wrong command": {"run", "/tmp"},
	} {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, Main(args, nil), ExitUsage)
		})
	}
}

func readPID(t *testing.T, p string) int {
	t.Helper()
	n, err := ReadPID(p)
	assert.NilError(t, err)
	return n
}

func getsid(pid int) (int, error) {
	sid, _, errno := syscall.RawSyscall(syscall.SYS_GETSID, uintptr(pid), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(sid), nil
}
