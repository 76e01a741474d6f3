package runner

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// startFake starts this test binary as a sleeping process whose command
// line is [bin, args...]: bin is this binary or a link to it, so the
// process looks like a runner or a QEMU to BelongsTo.
func startFake(t *testing.T, bin string, args ...string) int {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), envSleep+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	assert.NilError(t, cmd.Start())
	// Reaped as soon as it dies, so a killed fake is not left a zombie.
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		waitfor.Closed(t, done, waitfor.Default, "the killed fake to be reaped")
	})
	return cmd.Process.Pid
}

// fakeQEMU links this test binary under a QEMU's name.
func fakeQEMU(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	assert.NilError(t, os.Symlink(os.Args[0], p))
	return p
}

func mkLeftover(t *testing.T, state, name string) string {
	t.Helper()
	p := filepath.Join(state, name)
	assert.NilError(t, os.Mkdir(p, 0o700))
	assert.NilError(t, os.WriteFile(filepath.Join(p, LockName), nil, 0o600))
	return p
}

// TestCleanLeftovers builds a state_dir holding one directory of every
// kind and checks what the clean-up does with each: a dead adapter's
// directory loses its runner and QEMU and is removed; a live adapter's,
// one being created (no lock file yet), and anything not named like ours
// are left alone; a pid file naming a process that is not ours never gets
// that process killed.
func TestCleanLeftovers(t *testing.T) {
	state := t.TempDir()
	stale := mkLeftover(t, state, "aaaaaaaa-0000-4000-8000-000000000001")
	runnerPID := startFake(t, os.Args[0], Subcommand, stale)
	qemuPID := startFake(t, fakeQEMU(t), "-chardev", "socket,id=agent,path="+stale+"/exec.sock,server=on,wait=off")
	assert.NilError(t, WritePID(filepath.Join(stale, RunnerPIDName), runnerPID))
	// vm.pid is not written: a runner killed before it recorded its QEMU
	// leaves one only the process scan finds.

	other := mkLeftover(t, state, "aaaaaaaa-0000-4000-8000-000000000002")
	innocent := startFake(t, os.Args[0], "just", "sleeping")
	assert.NilError(t, WritePID(filepath.Join(other, VMPIDName), innocent))
	// A QEMU of another directory is not this one's.
	otherQEMU := startFake(t, fakeQEMU(t), "-serial", "file:"+state+"/aaaaaaaa-0000-4000-8000-000000000003/console.log")

	live, err := CreateDir(state, "aaaaaaaa-0000-4000-8000-000000000003")
	assert.NilError(t, err)
	defer func() { assert.Check(t, live.Remove()) }()
	young := filepath.Join(state, "aaaaaaaa-0000-4000-8000-000000000004")
	assert.NilError(t, os.Mkdir(young, 0o700))
	foreign := filepath.Join(state, "my-notes")
	assert.NilError(t, os.Mkdir(foreign, 0o700))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := CleanLeftovers(ctx, state, nil)
	assert.Equal(t, len(got), 2, "%+v", got)
	assert.Equal(t, got[0].Dir, stale)
	assert.NilError(t, got[0].Err)
	assert.Check(t, is.Contains(got[0].Killed, runnerPID))
	assert.Check(t, is.Contains(got[0].Killed, qemuPID))
	assert.Equal(t, got[1].Dir, other)
	assert.NilError(t, got[1].Err)
	assert.Check(t, is.Len(got[1].Killed, 0))

	assert.Check(t, !alive(runnerPID))
	assert.Check(t, !alive(qemuPID))
	assert.Check(t, alive(innocent))
	assert.Check(t, alive(otherQEMU))
	assert.Check(t, !exists(stale))
	assert.Check(t, !exists(other))
	assert.Check(t, exists(live.Path))
	assert.Check(t, exists(young))
	assert.Check(t, exists(foreign))
}

// TestCleanLeftoversMissingStateDir: nothing to do is not an error.
func TestCleanLeftoversMissingStateDir(t *testing.T) {
	assert.Check(t, is.Len(CleanLeftovers(context.Background(), filepath.Join(t.TempDir(), "none"), nil), 0))
}

// TestCreateDir: a directory is made once, locked, and Remove drops both.
func TestCreateDir(t *testing.T) {
	state := t.TempDir()
	d, err := CreateDir(state, uuid1)
	assert.NilError(t, err)
	_, err = CreateDir(state, uuid1)
	assert.ErrorContains(t, err, "exists")
	_, err = lockFile(d.File(LockName), true)
	assert.Assert(t, errors.Is(err, ErrLocked), "the lock must be held: %v", err)
	_, err = CreateDir(state, "../escape")
	assert.ErrorContains(t, err, "not a sandbox id")
	assert.NilError(t, d.Remove())
	assert.Check(t, !exists(d.Path))
	assert.NilError(t, d.Remove())
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, os.ErrNotExist)
}
