package proc

import "syscall"

// dieWithParent makes the kernel send SIGTERM (a clean stop, unlike
// SIGKILL) to the child when the thread that started it exits. Go may end
// that thread before the process, so this is a second line of defence
// behind the lifeline pipe, not the only one.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGTERM }
