//go:build !linux

package proc

import "syscall"

// dieWithParent has no kernel equivalent here; the lifeline pipe does the
// job.
func dieWithParent(*syscall.SysProcAttr) {}
