// Package procscan lists the processes alive on this (Linux) host by what
// their command line names. Tests use it to prove that nothing they
// started outlives them: every adapter, runner and QEMU a test starts
// names one of the test's temporary directories in its arguments.
package procscan

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/poll"
)

// Proc is one live process.
type Proc struct {
	PID int
	// Args is its command line, argv[0] first.
	Args []string
}

// Live lists the processes alive now: zombies (already dead, waiting to be
// reaped) and the calling process aside. Processes that exit while it
// reads are left out. Without /proc it lists none.
func Live() []Proc {
	des, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []Proc
	for _, de := range des {
		pid, err := strconv.Atoi(de.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		dir := filepath.Join("/proc", de.Name())
		cmdline, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue // gone, a zombie, or a kernel thread
		}
		if stat, err := os.ReadFile(filepath.Join(dir, "stat")); err == nil && zombie(stat) {
			continue
		}
		out = append(out, Proc{PID: pid, Args: strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")})
	}
	return out
}

// Stopped reports whether every thread of pid is stopped by a signal, and
// if not, which thread is not (for a poll's message). A process that is
// gone is an error. kill(2) only queues SIGSTOP: the group stop begins when
// one of the process's threads is next scheduled, and until then its other
// threads may still run; a test that freezes a process must wait for this
// before it relies on the process doing nothing.
func Stopped(pid int) (bool, string, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return false, "", err
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
		if err != nil {
			continue // that thread ended
		}
		if s := state(stat); s != 'T' {
			return false, fmt.Sprintf("thread %s of pid %d is in state %q", task.Name(), pid, s), nil
		}
	}
	return true, "", nil
}

// WaitStopped waits until every thread of pid is stopped (Stopped), and
// fails t if the process is gone or still runs after ten seconds.
func WaitStopped(t testing.TB, pid int) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		ok, why, err := Stopped(pid)
		switch {
		case err != nil:
			return poll.Error(err)
		case !ok:
			return poll.Continue("%s", why)
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(time.Millisecond))
}

// state reads the state field of a /proc/<pid>/stat line (0 when the
// line is malformed); it follows the command name, which is in
// parentheses and may itself hold ") ".
func state(stat []byte) byte {
	i := bytes.LastIndexByte(stat, ')')
	if i <= 0 || i+2 >= len(stat) {
		return 0
	}
	return stat[i+2]
}

// zombie reads the state field of a /proc/<pid>/stat line; it follows the
// command name, which is in parentheses and may itself hold ") ".
func zombie(stat []byte) bool { return state(stat) == 'Z' }

// Naming returns the PIDs of the live processes (as Live) one of whose
// arguments, argv[0] included, contains s. Pass a directory with a
// trailing slash to find the processes running a binary in it or naming a
// file under it.
func Naming(s string) []int {
	var pids []int
	for _, p := range Live() {
		for _, a := range p.Args {
			if strings.Contains(a, s) {
				pids = append(pids, p.PID)
				break
			}
		}
	}
	return pids
}
