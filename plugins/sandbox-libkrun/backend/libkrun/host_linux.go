package libkrun

import "golang.org/x/sys/unix"

// socketpair returns a connected pair of unix stream sockets, close-on-exec
// so that no child process inherits one.
func socketpair() (int, int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, -1, err
	}
	return fds[0], fds[1], nil
}
