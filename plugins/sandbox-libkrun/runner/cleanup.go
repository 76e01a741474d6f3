package runner

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// youngDirAge is how old a state directory without a lock file must be
// before the clean-up treats it as a leftover: CreateDir takes the lock
// right after mkdir, so only a directory another adapter is creating at
// this very moment can be younger and lock-less.
const youngDirAge = time.Minute

// killWait bounds how long the clean-up waits for killed processes to go.
const killWait = 5 * time.Second

// Leftover is what CleanLeftovers did with one stale state directory.
type Leftover struct {
	Dir string
	// Killed lists the processes (runner, VM) it killed.
	Killed []int
	// Err is set when the directory could not be cleaned completely.
	Err error
}

// CleanLeftovers finds the state directories under stateDir that no live
// adapter holds (their owner crashed, or was killed), kills the runner and
// VM processes that still belong to them, and removes them. A process is
// killed only when its command line shows it is this directory's runner or
// QEMU. Directories another adapter holds are left alone, so adapters may
// share a state_dir.
func CleanLeftovers(ctx context.Context, stateDir string, log hclog.Logger) []Leftover {
	return sweep(ctx, stateDir, ValidDirName, log, sweepLog{
		scanFailed: "cannot scan state_dir for leftovers",
		scanKey:    "state_dir",
		failed:     "could not clean a leftover VM state directory",
		cleaned:    "cleaned a leftover VM state directory",
	}, cleanDir)
}

// sweepLog is what a sweep logs: a parent directory it cannot read
// (under scanKey), and each leftover it failed to clean or cleaned.
type sweepLog struct {
	scanFailed, scanKey string
	failed, cleaned     string
}

// sweep calls clean on each subdirectory of parent whose name valid
// accepts, until ctx ends, and logs and returns every one clean reports
// as a leftover. A parent that does not exist has nothing to clean.
func sweep(ctx context.Context, parent string, valid func(string) bool, log hclog.Logger, msg sweepLog,
	clean func(ctx context.Context, dir string) (Leftover, bool),
) []Leftover {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	des, err := os.ReadDir(parent)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			log.Warn(msg.scanFailed, msg.scanKey, parent, "error", err)
		}
		return nil
	}
	var out []Leftover
	for _, de := range des {
		if ctx.Err() != nil {
			break
		}
		if !de.IsDir() || !valid(de.Name()) {
			continue
		}
		dir := filepath.Join(parent, de.Name())
		lo, stale := clean(ctx, dir)
		if !stale {
			continue
		}
		if lo.Err != nil {
			log.Warn(msg.failed, "dir", dir, "killed", lo.Killed, "error", lo.Err)
		} else {
			log.Info(msg.cleaned, "dir", dir, "killed", lo.Killed)
		}
		out = append(out, lo)
	}
	return out
}

// stopOwned kills the processes that belong to dir and waits until they
// are gone.
func stopOwned(ctx context.Context, dir string) Leftover {
	lo := Leftover{Dir: dir, Killed: ownedProcesses(dir)}
	for _, pid := range lo.Killed {
		kill(pid)
	}
	lo.Err = waitGone(ctx, lo.Killed)
	return lo
}

// cleanDir cleans dir if nobody holds it; stale reports whether it was a
// leftover.
func cleanDir(ctx context.Context, dir string) (Leftover, bool) {
	lo := Leftover{Dir: dir}
	lockPath := filepath.Join(dir, LockName)
	if _, err := os.Lstat(lockPath); err != nil {
		fi, serr := os.Stat(dir)
		if serr != nil || time.Since(fi.ModTime()) < youngDirAge {
			return lo, false
		}
	}
	lock, err := lockFile(lockPath, true)
	if err != nil {
		// ErrLocked: a live adapter owns it. Anything else (the
		// directory vanished under us): not ours to clean now.
		return lo, false
	}
	defer lock.Close()

	lo = stopOwned(ctx, dir)
	if lo.Err != nil {
		return lo, true
	}
	if err := os.RemoveAll(dir); err != nil {
		lo.Err = fmt.Errorf("remove %s: %w", dir, err)
	}
	return lo, true
}

// ownedProcesses returns the live processes that belong to the state
// directory dir: those its pid files name, and any other runner or QEMU
// whose command line points into it (a VM started just before its runner
// recorded the pid).
func ownedProcesses(dir string) []int {
	var cands []int
	for _, name := range []string{RunnerPIDName, VMPIDName} {
		if pid, err := ReadPID(filepath.Join(dir, name)); err == nil {
			cands = append(cands, pid)
		}
	}
	cands = append(cands, allPIDs()...)
	self := os.Getpid()
	var out []int
	for _, pid := range cands {
		if pid == self || slices.Contains(out, pid) || !alive(pid) {
			continue
		}
		if BelongsTo(procArgs(pid), dir) {
			out = append(out, pid)
		}
	}
	return out
}

// BelongsTo reports whether a process with command line args is the runner
// of state directory dir, or a QEMU started for it. Nothing else is ever
// killed by the clean-up.
func BelongsTo(args []string, dir string) bool {
	if len(args) == 0 || dir == "" {
		return false
	}
	if len(args) >= 3 && args[1] == Subcommand && args[2] == dir {
		return true
	}
	if !strings.HasPrefix(filepath.Base(args[0]), "qemu-system-") {
		return false
	}
	for _, a := range args[1:] {
		if strings.Contains(a, dir+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

// kill SIGKILLs pid and, when it leads one, its process group (a runner
// leads its own session).
func kill(pid int) {
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// waitGone waits until none of pids is alive.
func waitGone(ctx context.Context, pids []int) error {
	deadline := time.Now().Add(killWait)
	for {
		var left []int
		for _, p := range pids {
			if alive(p) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v did not exit after SIGKILL", left)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
