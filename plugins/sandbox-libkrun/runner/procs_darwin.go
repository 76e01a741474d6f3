package runner

import (
	"golang.org/x/sys/unix"
)

// procArgs returns a process's command line, or nil if it is gone or
// cannot be read.
func procArgs(pid int) []string {
	b, err := unix.SysctlRaw("kern.procargs2", pid)
	if err != nil {
		return nil
	}
	return ParseProcArgs2(b)
}

// allPIDs lists every process on the host.
func allPIDs() []int {
	procs, err := unix.SysctlKinfoProcSlice("kern.proc.all")
	if err != nil {
		return nil
	}
	out := make([]int, 0, len(procs))
	for _, p := range procs {
		if p.Proc.P_pid > 0 {
			out = append(out, int(p.Proc.P_pid))
		}
	}
	return out
}

// sZomb is a zombie's p_stat (sys/proc.h).
const sZomb = 5

// alive reports whether pid is a live process (not a zombie).
func alive(pid int) bool {
	p, err := unix.SysctlKinfoProc("kern.proc.pid", pid)
	if err != nil || p.Proc.P_pid != int32(pid) {
		return false
	}
	return p.Proc.P_stat != sZomb
}
