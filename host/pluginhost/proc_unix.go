//go:build unix

package pluginhost

import (
	"os/exec"
	"syscall"
)

// ownProcessGroup starts the adapter as the leader of a new process group,
// so stopping it can kill everything it started in that group too
// (go-plugin's Kill ends the adapter process only), and a terminal's
// Ctrl-C aimed at the engine does not reach it.
func ownProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// killProcessGroup sends SIGKILL to the process group led by pid. A group
// that is already empty is not an error.
func killProcessGroup(pid int) {
	if pid <= 0 {
		return
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}
