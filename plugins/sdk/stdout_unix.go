//go:build unix

package sdk

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// protectStdout moves the real stdout out of the way at the file
// descriptor level and returns it. Afterwards fd 1 is a copy of stderr, so
// whatever writes to fd 1 directly (C code, a child process that inherits
// it, a *os.File for fd 1 captured before Serve) lands in the log instead
// of corrupting the handshake. The returned copy is close-on-exec so no
// child of the adapter holds the host's stdout pipe open.
func protectStdout() (*os.File, error) {
	fd, err := unix.FcntlInt(1, unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return nil, fmt.Errorf("duplicate stdout: %w", err)
	}
	if err := unix.Dup2(2, 1); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("point stdout at stderr: %w", err)
	}
	return os.NewFile(uintptr(fd), "plugin-handshake-stdout"), nil
}

// inheritFD takes over an inherited file descriptor: it is marked
// close-on-exec so the adapter's own children do not inherit it too.
func inheritFD(fd int, name string) (*os.File, error) {
	if fd < 3 {
		return nil, fmt.Errorf("fd %d is one of stdin, stdout and stderr", fd)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fd %d is not open: %w", fd, err)
	}
	// A lifeline is a pipe (or a socket); anything else is a descriptor
	// the engine did not mean, and watching it would never see EOF.
	if kind := st.Mode & unix.S_IFMT; kind != unix.S_IFIFO && kind != unix.S_IFSOCK {
		return nil, fmt.Errorf("fd %d is not a pipe or socket", fd)
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), name), nil
}
