package runner

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestCleanWorkerLeftovers: a worker directory a dead adapter left has its
// runner and QEMU killed and its runtime files removed, but the directory,
// its disk and its record stay; a live adapter's worker is left alone.
func TestCleanWorkerLeftovers(t *testing.T) {
	workers := filepath.Join(t.TempDir(), WorkersDirName)
	stale, err := OpenWorkerDir(workers, "shop-default-api")
	assert.NilError(t, err)
	stale.Release() // its adapter died: nobody holds it
	runnerPID := startFake(t, os.Args[0], Subcommand, stale.Path)
	qemuPID := startFake(t, fakeQEMU(t), "-drive", "file="+stale.Path+"/disk.ext4,if=none,id=upper,format=raw")
	assert.NilError(t, WritePID(stale.File(RunnerPIDName), runnerPID))
	assert.NilError(t, os.WriteFile(stale.File("disk.ext4"), []byte("persistent"), 0o600))
	assert.NilError(t, os.WriteFile(stale.File("worker.json"), []byte("{}"), 0o600))

	live, err := OpenWorkerDir(workers, "shop-default-web")
	assert.NilError(t, err)
	defer live.Release()
	liveRunner := startFake(t, os.Args[0], Subcommand, live.Path)

	// A second adapter cannot take a worker the first one holds.
	_, err = OpenWorkerDir(workers, "shop-default-web")
	assert.ErrorIs(t, err, ErrDirLocked)

	los := CleanWorkerLeftovers(context.Background(), workers, nil)
	assert.Equal(t, len(los), 1)
	assert.Equal(t, los[0].Dir, stale.Path)
	assert.NilError(t, los[0].Err)
	assert.Check(t, is.Contains(los[0].Killed, runnerPID))
	assert.Check(t, is.Contains(los[0].Killed, qemuPID))
	for _, pid := range []int{runnerPID, qemuPID} {
		assert.Check(t, !alive(pid), "pid %d killed", pid)
	}
	assert.Check(t, syscall.Kill(liveRunner, 0) == nil, "the live adapter's runner is untouched")

	for _, keep := range []string{"disk.ext4", "worker.json", LockName} {
		_, err := os.Stat(stale.File(keep))
		assert.Check(t, err, keep)
	}
	_, err = os.Stat(stale.File(RunnerPIDName))
	assert.Check(t, os.IsNotExist(err), "runtime files go")

	// Nothing left to do the second time.
	assert.Equal(t, len(CleanWorkerLeftovers(context.Background(), workers, nil)), 0)
	_, err = OpenWorkerDir(workers, "Not/AnID")
	assert.ErrorContains(t, err, "not a vm_id")
}
