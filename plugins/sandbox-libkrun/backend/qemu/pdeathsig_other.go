//go:build !linux

package qemu

import "syscall"

// setDieWithParent has no equivalent outside Linux; the runner's lifeline
// and Kill cover it there.
func setDieWithParent(*syscall.SysProcAttr) {}
