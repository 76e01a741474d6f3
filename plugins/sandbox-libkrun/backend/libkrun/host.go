//go:build linux || darwin

package libkrun

import (
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// raiseNoFile lifts the soft RLIMIT_NOFILE to the hard limit: every guest
// file a virtio device keeps open pins a host fd in this process. macOS
// refuses a soft limit above OPEN_MAX (10240) with EINVAL, so that is the
// fallback there.
func raiseNoFile() error {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		return err
	}
	if r.Cur >= r.Max {
		return nil
	}
	want := r
	want.Cur = r.Max
	err := unix.Setrlimit(unix.RLIMIT_NOFILE, &want)
	if err != nil && runtime.GOOS == "darwin" && r.Cur < 10240 {
		want.Cur = min(r.Max, 10240)
		err = unix.Setrlimit(unix.RLIMIT_NOFILE, &want)
	}
	return err
}

// checkKVM makes sure /dev/kvm can be opened read-write on Linux: libkrun
// panics (aborting the process without a useful message) when it cannot.
// On macOS the hypervisor is Hypervisor.framework, whose failure libkrun
// reports as an error from krun_start_enter.
func checkKVM(dev string) error {
	if runtime.GOOS != "linux" {
		return nil
	}
	if dev == "" {
		dev = "/dev/kvm"
	}
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err == nil {
		_ = unix.Close(fd)
		return nil
	}
	msg := fmt.Sprintf("cannot open %s read-write: %v", dev, err)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENXIO), errors.Is(err, unix.ENODEV):
		msg += "; enable virtualization in the firmware (or nested virtualization in the host VM) and load the module (modprobe kvm_intel or kvm_amd)"
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		msg += "; add this user to the kvm group (sudo usermod -aG kvm $USER, then log in again) or run the adapter as a user that can open it"
	}
	return &Error{Code: CodeNoKVM, Message: msg + "; or use hypervisor: qemu"}
}
