package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/guest"
)

// The freeze ioctls, _IOWR('X', 119, int) and _IOWR('X', 120, int): the
// same numbers on amd64 and arm64; x/sys/unix does not name them.
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

// freezeMount is where the upper layer's filesystem is mounted a second
// time while it is frozen: /run is a tmpfs, so the mount point leaves no
// trace on the disk being copied.
const freezeMount = "/run/iii-upper-freeze"

// builtinExec serves the agent's built-in programs (agentproto.Exec*Upper)
// and hands every other exec to next.
type builtinExec struct {
	next  guest.Runner
	upper *upperFreezer
}

func (b *builtinExec) Run(ctx context.Context, req *agentproto.ExecRequest, eio guest.ExecIO) (*agentproto.ExitStatus, error) {
	if len(req.Argv) == 0 {
		return b.next.Run(ctx, req, eio)
	}
	t0 := time.Now()
	var err error
	switch req.Argv[0] {
	case agentproto.ExecFreezeUpper:
		autoThaw := time.Duration(agentproto.DefaultAutoThawMS) * time.Millisecond
		if len(req.Argv) > 1 {
			ms, perr := strconv.ParseUint(req.Argv[1], 10, 32)
			if perr != nil || ms == 0 {
				return nil, agentproto.Errorf(agentproto.CodeInvalidRequest, "%s: auto-thaw %q is not a positive number of milliseconds", req.Argv[0], req.Argv[1])
			}
			autoThaw = time.Duration(ms) * time.Millisecond
		}
		err = b.upper.freeze(autoThaw)
	case agentproto.ExecThawUpper:
		err = b.upper.thaw()
	default:
		return b.next.Run(ctx, req, eio)
	}
	if err != nil {
		return nil, err
	}
	return &agentproto.ExitStatus{DurationUS: time.Since(t0).Microseconds()}, nil
}

// upperFreezer freezes and thaws the filesystem of the VM's persistent
// upper layer. The agent's root is the overlay, which cannot be frozen,
// and the upper layer's own mount lies outside that root since the switch
// into it; mounting the same device again yields the same superblock,
// whose freeze is the upper layer's.
type upperFreezer struct {
	// spec names the upper layer's device (BootParams.Upper); "" when
	// the upper layer is a tmpfs.
	spec string
	log  hclog.Logger

	mu     sync.Mutex
	frozen *frozenUpper
}

type frozenUpper struct {
	fd    int
	timer *time.Timer
}

func (u *upperFreezer) freeze(autoThaw time.Duration) error {
	if u.spec == "" {
		return agentproto.Errorf(agentproto.CodeUnsupported, "this VM's upper layer is a tmpfs, not a disk: nothing to freeze")
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.frozen != nil {
		return agentproto.Errorf(agentproto.CodeInvalidRequest, "the upper layer is already frozen")
	}
	dev, err := guest.ResolveDevice(u.spec, 2*time.Second)
	if err != nil {
		return agentproto.Errorf(agentproto.CodeInternal, "freeze the upper layer: %v", err)
	}
	if err := os.MkdirAll(freezeMount, 0o700); err != nil {
		return agentproto.Errorf(agentproto.CodeInternal, "freeze the upper layer: %v", err)
	}
	if err := unix.Mount(dev, freezeMount, "ext4", unix.MS_NOATIME, ""); err != nil {
		return agentproto.Errorf(agentproto.CodeInternal, "freeze the upper layer: mount %s again on %s: %v", dev, freezeMount, err)
	}
	fd, err := unix.Open(freezeMount, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = unix.Unmount(freezeMount, unix.MNT_DETACH)
		return agentproto.Errorf(agentproto.CodeInternal, "freeze the upper layer: open %s: %v", freezeMount, err)
	}
	if err := ioctl(fd, ioctlFIFREEZE); err != nil {
		_ = unix.Close(fd)
		_ = unix.Unmount(freezeMount, unix.MNT_DETACH)
		return agentproto.Errorf(agentproto.CodeInternal, "freeze the upper layer (%s): %v", dev, err)
	}
	f := &frozenUpper{fd: fd}
	f.timer = time.AfterFunc(autoThaw, func() {
		u.mu.Lock()
		defer u.mu.Unlock()
		if u.frozen != f {
			return
		}
		u.log.Warn("the host did not thaw the upper layer in time; thawing it", "after", autoThaw)
		if err := u.thawLocked(); err != nil {
			u.log.Error("auto-thaw of the upper layer failed", "error", err)
		}
	})
	u.frozen = f
	u.log.Info("upper layer frozen", "device", dev, "auto_thaw", autoThaw)
	return nil
}

func (u *upperFreezer) thaw() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.frozen == nil {
		return nil
	}
	u.frozen.timer.Stop()
	return u.thawLocked()
}

func (u *upperFreezer) thawLocked() error {
	f := u.frozen
	if err := ioctl(f.fd, ioctlFITHAW); err != nil && !errors.Is(err, unix.EINVAL) {
		// EINVAL: not frozen (any more); anything else leaves it frozen,
		// and the auto-thaw, or the host's next thaw, tries again.
		return agentproto.Errorf(agentproto.CodeInternal, "thaw the upper layer: %v", err)
	}
	u.frozen = nil
	_ = unix.Close(f.fd)
	if err := unix.Unmount(freezeMount, unix.MNT_DETACH); err != nil {
		u.log.Warn("unmount the upper layer's second mount", "path", freezeMount, "error", err)
	}
	u.log.Info("upper layer thawed")
	return nil
}

func ioctl(fd int, req uintptr) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, 0); errno != 0 {
		return fmt.Errorf("ioctl %#x: %w", req, errno)
	}
	return nil
}
