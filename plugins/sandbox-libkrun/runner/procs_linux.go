package runner

import (
	"bytes"
	"os"
	"strconv"
)

// procArgs returns a process's command line, or nil if it is gone (or a
// zombie, whose cmdline reads empty: nothing left to kill).
func procArgs(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil
	}
	return ParseCmdline(b)
}

// allPIDs lists every process on the host.
func allPIDs() []int {
	des, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, de := range des {
		if n, err := strconv.Atoi(de.Name()); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}

// alive reports whether pid is a live process (not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and
	// may itself hold ") ".
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] != 'Z' && b[i+2] != 'X'
}
