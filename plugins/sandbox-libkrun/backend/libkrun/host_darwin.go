package libkrun

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// socketpair returns a connected pair of unix stream sockets, close-on-exec
// so that no child process inherits one. macOS
// has no SOCK_CLOEXEC: ForkLock keeps a concurrent fork from inheriting
// them before the flag is set, as os/exec does.
func socketpair() (int, int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		return -1, -1, err
	}
	unix.CloseOnExec(fds[0])
	unix.CloseOnExec(fds[1])
	return fds[0], fds[1], nil
}
