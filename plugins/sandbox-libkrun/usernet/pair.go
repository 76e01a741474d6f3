package usernet

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Pair returns the two ends of a VM's NIC stream, a connected pair of
// unix stream sockets: host for Serve, vm for the VMM. Both are
// close-on-exec; a VMM child gets its end through exec.Cmd.ExtraFiles.
func Pair() (host, vm *os.File, err error) {
	// macOS has no SOCK_CLOEXEC: ForkLock keeps a concurrent fork from
	// inheriting the pair before the flag is set, as os/exec does.
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair for the VM's NIC: %w", err)
	}
	unix.CloseOnExec(fds[0])
	unix.CloseOnExec(fds[1])
	return os.NewFile(uintptr(fds[0]), "nic-host"), os.NewFile(uintptr(fds[1]), "nic-vm"), nil
}
