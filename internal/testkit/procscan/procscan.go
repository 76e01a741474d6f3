// Package procscan lists the processes alive on this (Linux) host by what
// their command line names. Tests use it to prove that nothing they
// started outlives them: every adapter, runner and QEMU a test starts
// names one of the test's temporary directories in its arguments.
package procscan

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// zombie reads the state field of a /proc/<pid>/stat line; it follows the
// command name, which is in parentheses and may itself hold ") ".
func zombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i > 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

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
