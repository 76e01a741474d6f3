package qemu

import "syscall"

// setDieWithParent makes the kernel kill QEMU when the process that
// started it dies. Linux ties this to the thread that forked; the Go
// runtime only retires threads that a goroutine locked and left locked,
// which Launch never does.
func setDieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
