package runner

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
)

// Worker VMs keep their state between boots: each has a directory
// <state_dir>/workers/<vm_id>/ holding the runner's files while it runs and
// its persistent disk always. Unlike a sandbox's directory it outlives the
// VM, so it is locked only while a VM uses it, and the clean-up after a
// crash kills what a dead adapter left running in it but deletes nothing
// that matters.

// WorkersDirName is the directory under state_dir that holds worker VMs.
const WorkersDirName = "workers"

// ErrDirLocked: another live adapter uses the directory.
var ErrDirLocked = ErrLocked

// runtimeFiles are the files of a VM run that mean nothing once it ended.
func runtimeFiles() []string {
	return []string{RunnerPIDName, VMPIDName, backend.SocketName, AdoptSocketName, AdoptKeyName}
}

// OpenWorkerDir opens <workersDir>/<vmID>, creating it (0700) when missing,
// and takes its lock. A directory another live adapter holds is
// ErrDirLocked.
func OpenWorkerDir(workersDir, vmID string) (*Dir, error) {
	if !contract.ValidVMID(vmID) {
		return nil, fmt.Errorf("worker directory name %q is not a vm_id", vmID)
	}
	if err := os.MkdirAll(workersDir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", workersDir, err)
	}
	p := filepath.Join(workersDir, vmID)
	if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("create worker state directory: %w", err)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", p)
	}
	lock, err := lockFile(filepath.Join(p, LockName), true)
	if err != nil {
		return nil, err
	}
	for _, name := range runtimeFiles() {
		_ = os.Remove(filepath.Join(p, name))
	}
	return &Dir{Path: p, lock: lock}, nil
}

// AdoptWorkerDir try-locks the existing worker directory <workersDir>/<vmID>
// of a VM an earlier adapter process left running, keeping its runtime
// files (the runner's pid, sockets and adoption key) for Adopt. A directory
// another live adapter holds is ErrDirLocked.
func AdoptWorkerDir(workersDir, vmID string) (*Dir, error) {
	if !contract.ValidVMID(vmID) {
		return nil, fmt.Errorf("worker directory name %q is not a vm_id", vmID)
	}
	p := filepath.Join(workersDir, vmID)
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", p)
	}
	lock, err := lockFile(filepath.Join(p, LockName), true)
	if err != nil {
		return nil, err
	}
	return &Dir{Path: p, lock: lock}, nil
}

// Release drops the lock and keeps the directory.
func (d *Dir) Release() {
	if d.lock != nil {
		_ = d.lock.Close()
		d.lock = nil
	}
}

// CleanWorkerLeftovers looks at every worker directory under workersDir
// that no live adapter holds, kills the runner and VM processes still
// running for it (a crashed adapter's), and removes their runtime files.
// The directories themselves, with each worker's disk, logs and record,
// stay: the worker's next start uses them.
func CleanWorkerLeftovers(ctx context.Context, workersDir string, log hclog.Logger) []Leftover {
	return sweep(ctx, workersDir, contract.ValidVMID, log, sweepLog{
		scanFailed: "cannot scan the worker state directories",
		scanKey:    "dir",
		failed:     "could not stop what a dead adapter left running for a worker VM",
		cleaned:    "stopped the processes a dead adapter left running for a worker VM; its state stays",
	}, cleanWorkerDir)
}

// cleanWorkerDir stops what a dead adapter left running for the worker
// directory dir and removes its runtime files; it reports a leftover only
// when something was running.
func cleanWorkerDir(ctx context.Context, dir string) (Leftover, bool) {
	lock, err := lockFile(filepath.Join(dir, LockName), true)
	if err != nil {
		return Leftover{}, false // a live adapter runs it, or it vanished
	}
	defer lock.Close()
	lo := stopOwned(ctx, dir)
	if lo.Err == nil {
		for _, name := range runtimeFiles() {
			_ = os.Remove(filepath.Join(dir, name))
		}
	}
	return lo, len(lo.Killed) > 0 || lo.Err != nil
}
