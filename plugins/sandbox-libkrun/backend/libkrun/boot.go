//go:build linux || darwin

package libkrun

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// Values of libkrun.h used by Boot.
const (
	logStyleNever  = 2 // KRUN_LOG_STYLE_NEVER: no colour codes in log files
	logOptionNoEnv = 1 // KRUN_LOG_OPTION_NO_ENV: RUST_LOG cannot override us
	diskFormatRaw  = 0 // KRUN_DISK_FORMAT_RAW
	rootBlockID    = "vda"
	dataBlockID    = "iii-upper"
	stderrFD       = 2
	// netFeatures are the NIC's virtio-net offloads, libkrun's
	// COMPAT_NET_FEATURES (checksum, TSO4 and UFO both ways): the runner's
	// network takes partial checksums and frames up to 64 KiB.
	netFeatures = 1<<0 | 1<<1 | 1<<7 | 1<<10 | 1<<11 | 1<<14
)

// logLevel maps a verbosity name to libkrun's KRUN_LOG_LEVEL_* value.
func logLevel(name string) (uint32, bool) {
	for i, n := range []string{"off", "error", "warn", "info", "debug", "trace"} {
		if n == name {
			return uint32(i), true
		}
	}
	return 0, false
}

// Spec describes the VM Boot starts.
type Spec struct {
	VCPUs     int // 1 to 255 (libkrun takes a uint8); 0 means 1
	MemoryMiB int // 0 means 512
	// Kernel is the guest kernel; KernelFormat how libkrun loads it
	// (DetectKernelFile tells).
	Kernel       string
	KernelFormat KernelFormat
	// Initramfs holds the guest agent as /init; "" boots without one
	// (NULL is passed, not "").
	Initramfs string
	// KernelConfig is the kernel's .config (/boot/config-<release>);
	// when set, Boot first checks the kernel can find libkrun's devices
	// (KernelConfig.CheckForLibkrun).
	KernelConfig string
	// Cmdline is the whole kernel command line (BuildCmdline makes it).
	Cmdline string
	// RootDisk is the image, attached read-only as the first block device
	// (/dev/vda, block id "vda"); "" attaches no disk.
	RootDisk string
	// DataDisk is a writable raw disk attached after it (block id
	// dataBlockID, which the guest sees as the disk's serial); the agent
	// uses it as a persistent upper layer. "" attaches none.
	DataDisk string
	// Env is the guest's initial environment, KEY=VALUE. nil and empty
	// both pass an empty array, never NULL (NULL makes libkrun copy this
	// process's environment into the guest).
	Env []string
	// Network adds one virtio-net NIC whose frames travel over a unix
	// stream socket (krun_add_net_unixstream, each frame preceded by its
	// 32-bit big-endian length); OnNetwork gets the other end. Without it
	// the VM has no NIC and no vsock, hence no TSI and no route out.
	Network bool
	// OnNetwork receives the host end of the NIC's socket after every
	// configuration call succeeded, just before OnChannel. It owns the
	// file from then on: a runner serves it with its user-mode network
	// (package usernet), whose policy keeps the guest off the host. An
	// error aborts the boot. Required with Network.
	OnNetwork func(host *os.File) error
	// MAC of the guest NIC; nil picks a random locally administered one.
	MAC net.HardwareAddr
	// ConsoleLog receives the guest kernel console (a serial port:
	// ttyS0 on x86_64, ttyAMA0 on arm64); "" adds no console device.
	ConsoleLog string
	// ConsoleOut, instead of ConsoleLog, receives the console: the write
	// end of a pipe whose reader keeps a bounded log (a runner's
	// consolelog.Pump), so a guest writing its console in a loop cannot
	// fill the host's disk. Boot hands libkrun a copy; the caller keeps
	// its own.
	ConsoleOut *os.File
	// Verbosity of libkrun's log on stderr: off, error, warn (default),
	// info, debug or trace.
	Verbosity string
	// OnChannel receives the host end of the iii.exec port (a connected
	// unix stream socket) after every configuration call succeeded and
	// just before the VM is entered. It owns the file from then on: a
	// runner relays it to the unix socket the adapter dials. An error
	// aborts the boot. Required.
	OnChannel func(host *os.File) error
	// Log receives Boot's own messages; nil discards them.
	Log hclog.Logger

	// kvmDevice replaces /dev/kvm in tests.
	kvmDevice string
	// arch replaces runtime.GOARCH in tests.
	arch string
}

func (s *Spec) guestArch() string {
	if s.arch != "" {
		return s.arch
	}
	return runtime.GOARCH
}

func (s *Spec) validate() error {
	bad := func(format string, args ...any) error {
		return &Error{Code: CodeBadSpec, Message: fmt.Sprintf(format, args...)}
	}
	if s.VCPUs < 0 || s.VCPUs > 255 {
		return bad("vcpus %d: use 1 to 255", s.VCPUs)
	}
	if s.MemoryMiB < 0 || s.MemoryMiB > 1<<24 {
		return bad("memory %d MiB is out of range", s.MemoryMiB)
	}
	if s.MemoryMiB != 0 && s.MemoryMiB < 64 {
		return bad("memory %d MiB: a guest kernel needs at least 64", s.MemoryMiB)
	}
	if s.Kernel == "" {
		return bad("kernel is required")
	}
	arch := s.guestArch()
	if !formatOK(s.KernelFormat, arch) {
		var names []string
		for _, f := range KernelFormatsFor(arch) {
			names = append(names, f.String())
		}
		return bad("kernel format %s cannot be loaded by libkrun on %s: use %s", s.KernelFormat, arch, strings.Join(names, " or "))
	}
	for what, v := range map[string]string{"kernel": s.Kernel, "initramfs": s.Initramfs, "cmdline": s.Cmdline,
		"root disk": s.RootDisk, "data disk": s.DataDisk, "console log": s.ConsoleLog, "kernel config": s.KernelConfig} {
		if err := checkCString(what, v); err != nil {
			return bad("%v", err)
		}
	}
	for _, p := range []string{s.Kernel, s.Initramfs, s.RootDisk, s.DataDisk} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err != nil {
			return bad("%v", err)
		}
	}
	if err := checkEnv(s.Env); err != nil {
		return bad("%v", err)
	}
	if n, limit := cmdlineSize(s.Cmdline, s.Env), CmdlineMax(arch)-cmdlineReserve(arch); n > limit {
		return bad("kernel command line and environment take %d bytes; libkrun allows %d on %s (with room for its own additions)", n, limit, arch)
	}
	if _, ok := logLevel(s.verbosity()); !ok {
		return bad("verbosity %q: use off, error, warn, info, debug or trace", s.Verbosity)
	}
	if s.MAC != nil && len(s.MAC) != 6 {
		return bad("MAC %s is not 6 bytes", s.MAC)
	}
	if s.OnChannel == nil {
		return bad("OnChannel is required: without it nobody can reach the guest agent")
	}
	if s.Network && s.OnNetwork == nil {
		return bad("OnNetwork is required with network: without it nothing serves the NIC")
	}
	return nil
}

func (s *Spec) verbosity() string {
	if s.Verbosity == "" {
		return "warn"
	}
	return strings.ToLower(s.Verbosity)
}

// Boot configures libkrun from spec and enters the VM. It runs inside a
// per-VM runner process and does not return on success: when the guest
// stops, libkrun ends the whole process with _exit (no deferred calls run),
// so the runner's parent does any cleanup. It returns an error when the
// host is not ready, when a configuration call fails (the error names the
// call and errno) or when krun_start_enter itself fails.
//
// ctx bounds the preparation. After the VM is entered, canceling ctx asks
// the guest to shut down where libkrun offers a shutdown eventfd (macOS on
// Apple silicon); elsewhere the VM runs until the guest powers off or the
// process is killed, and Boot keeps waiting.
func (l *Lib) Boot(ctx context.Context, spec Spec) error {
	if err := spec.validate(); err != nil {
		return err
	}
	if err := l.checkBoot(spec.RootDisk != "", spec.Network, spec.ConsoleLog != "" || spec.ConsoleOut != nil); err != nil {
		return err
	}
	if spec.KernelConfig != "" {
		if err := CheckKernelConfigFile(spec.KernelConfig, spec.guestArch(), spec.RootDisk != "", spec.Network); err != nil {
			var e *Error
			if errors.As(err, &e) {
				return err
			}
			return &Error{Code: CodeBadSpec, Message: fmt.Sprintf("kernel config: %v", err)}
		}
	}
	log := spec.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := raiseNoFile(); err != nil {
		// Not fatal: only VMs with many open guest files need it.
		log.Warn("could not raise RLIMIT_NOFILE", "error", err)
	}
	if err := checkKVM(spec.kvmDevice); err != nil {
		return err
	}

	b := &booter{l: l, spec: &spec, log: log, a: &arena{}, ctxID: -1}
	err := b.configure(ctx)
	if err != nil {
		b.abort()
		return err
	}
	return b.enter(ctx)
}

// booter holds what one Boot call allocated, so a failure can release it.
type booter struct {
	l     *Lib
	spec  *Spec
	log   hclog.Logger
	a     *arena
	ctxID int32
	fds   []int    // fds handed to libkrun, closed if the boot fails before the VM starts
	host  *os.File // the agent port's host end, until OnChannel has it
	nic   *os.File // the NIC's host end, until OnNetwork has it
	efd   int32
}

func (b *booter) closeLater(fd int) { b.fds = append(b.fds, fd) }

// call runs one configuration call and turns a negative errno into an
// error naming it.
func (b *booter) call(name string, ret int32) error {
	if ret < 0 {
		return callError(CodeConfig, name, ret, configHint(name, syscall.Errno(-ret)))
	}
	b.log.Debug("libkrun call", "call", name, "ret", ret)
	return nil
}

func (b *booter) configure(ctx context.Context) error {
	l, s, a := b.l, b.spec, b.a
	id := l.fn.createCtx()
	if id < 0 {
		return callError(CodeConfig, "krun_create_ctx", id, "")
	}
	b.ctxID = id
	ctxID := uint32(id)

	level, _ := logLevel(s.verbosity())
	if l.fn.initLog != nil {
		if err := b.call("krun_init_log", l.fn.initLog(stderrFD, level, logStyleNever, logOptionNoEnv)); err != nil {
			return err
		}
	} else if err := b.call("krun_set_log_level", l.fn.setLogLevel(level)); err != nil {
		return err
	}

	vcpus, mem := s.VCPUs, s.MemoryMiB
	if vcpus == 0 {
		vcpus = 1
	}
	if mem == 0 {
		mem = 512
	}
	if err := b.call("krun_set_vm_config", l.fn.setVMConfig(ctxID, uint8(vcpus), uint32(mem))); err != nil {
		return err
	}
	if err := b.call("krun_set_kernel", l.fn.setKernel(ctxID, a.str(s.Kernel), uint32(s.KernelFormat),
		a.strOrNil(s.Initramfs), a.str(s.Cmdline))); err != nil {
		return err
	}
	if err := b.call("krun_set_env", l.fn.setEnv(ctxID, a.strv(s.Env))); err != nil {
		return err
	}

	// The agent's channel: no implicit console (it would take over the
	// runner's stdin and stdout), one multiport console device whose
	// only port is iii.exec, backed by one end of a socketpair.
	if err := b.call("krun_disable_implicit_console", l.fn.disableConsole(ctxID)); err != nil {
		return err
	}
	cid := l.fn.addConsoleMulti(ctxID)
	if err := b.call("krun_add_virtio_console_multiport", cid); err != nil {
		return err
	}
	hostFD, guestFD, err := socketpair()
	if err != nil {
		return &Error{Code: CodeHost, Message: fmt.Sprintf("socketpair for the %s port: %v", agentproto.PortName, err)}
	}
	b.host = os.NewFile(uintptr(hostFD), agentproto.PortName)
	b.closeLater(guestFD)
	if err := b.call("krun_add_console_port_inout", l.fn.addConsolePortIO(ctxID, uint32(cid), a.str(agentproto.PortName),
		int32(guestFD), int32(guestFD))); err != nil {
		return err
	}

	if s.ConsoleOut != nil {
		fd, err := unix.FcntlInt(s.ConsoleOut.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return &Error{Code: CodeHost, Message: fmt.Sprintf("console pipe: %v", err)}
		}
		b.closeLater(fd)
		if err := b.call("krun_add_serial_console_default", l.fn.addSerialConsole(ctxID, -1, int32(fd))); err != nil {
			return err
		}
	} else if s.ConsoleLog != "" {
		fd, err := unix.Open(s.ConsoleLog, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return &Error{Code: CodeHost, Message: fmt.Sprintf("console log %s: %v", s.ConsoleLog, err)}
		}
		b.closeLater(fd)
		if err := b.call("krun_add_serial_console_default", l.fn.addSerialConsole(ctxID, -1, int32(fd))); err != nil {
			return err
		}
	}

	if s.RootDisk != "" {
		// Always raw: the image is ours, and probing a format is what
		// libkrun's header warns against.
		if l.fn.addDisk2 != nil {
			err = b.call("krun_add_disk2", l.fn.addDisk2(ctxID, a.str(rootBlockID), a.str(s.RootDisk), diskFormatRaw, true))
		} else {
			err = b.call("krun_add_disk", l.fn.addDisk(ctxID, a.str(rootBlockID), a.str(s.RootDisk), true))
		}
		if err != nil {
			return err
		}
	}
	if s.DataDisk != "" {
		if l.fn.addDisk2 != nil {
			err = b.call("krun_add_disk2", l.fn.addDisk2(ctxID, a.str(dataBlockID), a.str(s.DataDisk), diskFormatRaw, false))
		} else {
			err = b.call("krun_add_disk", l.fn.addDisk(ctxID, a.str(dataBlockID), a.str(s.DataDisk), false))
		}
		if err != nil {
			return err
		}
	}

	// No implicit vsock: it would come with TSI, which lets the guest
	// open sockets in the runner's network context. Without a NIC the
	// guest then has no network at all.
	if err := b.call("krun_disable_implicit_vsock", l.fn.disableVsock(ctxID)); err != nil {
		return err
	}

	if s.Network {
		vmFD, hostFD, err := socketpair()
		if err != nil {
			return &Error{Code: CodeHost, Message: fmt.Sprintf("socketpair for the NIC: %v", err)}
		}
		b.closeLater(vmFD)
		b.nic = os.NewFile(uintptr(hostFD), "nic")
		mac := s.MAC
		if mac == nil {
			mac = randomMAC()
		}
		if err := b.call("krun_add_net_unixstream", l.fn.addNetUnixstream(ctxID, nil, int32(vmFD), a.bytes(mac), netFeatures, 0)); err != nil {
			return err
		}
	}

	b.efd = -1
	if l.fn.getShutdownEventfd != nil {
		// Only macOS/arm64 builds have the eventfd; elsewhere this
		// answers -EINVAL and shutdown is the guest's or a signal's job.
		if fd := l.fn.getShutdownEventfd(ctxID); fd >= 0 {
			b.efd = fd
		}
	}

	if err := ctx.Err(); err != nil {
		return err
	}
	if b.nic != nil {
		nic := b.nic
		b.nic = nil // OnNetwork owns it now, even if it fails
		if err := s.OnNetwork(nic); err != nil {
			return fmt.Errorf("hand over the NIC: %w", err)
		}
	}
	host := b.host
	b.host = nil // OnChannel owns it now, even if it fails
	if err := s.OnChannel(host); err != nil {
		return fmt.Errorf("hand over the %s channel: %w", agentproto.PortName, err)
	}
	return nil
}

// abort releases what configure allocated. Before krun_start_enter libkrun
// has only recorded fd numbers, so closing them here is safe.
func (b *booter) abort() {
	if b.ctxID >= 0 {
		_ = b.l.fn.freeCtx(uint32(b.ctxID))
	}
	for _, fd := range b.fds {
		_ = unix.Close(fd)
	}
	if b.host != nil {
		_ = b.host.Close()
	}
	if b.nic != nil {
		_ = b.nic.Close()
	}
}

// enter starts the VM on a locked OS thread and waits. It returns only if
// krun_start_enter does, which means the VM did not start.
func (b *booter) enter(ctx context.Context) error {
	res := make(chan int32, 1)
	ctxID := uint32(b.ctxID)
	go func() {
		// Never unlocked: if libkrun returns, this thread (renamed,
		// with libkrun's signal state) ends with the goroutine.
		runtime.LockOSThread()
		res <- b.l.fn.startEnter(ctxID)
	}()
	done := ctx.Done()
	var ret int32
wait:
	for {
		select {
		case ret = <-res:
			break wait
		case <-done:
			done = nil
			if b.efd >= 0 {
				b.log.Info("context canceled: asking the guest to shut down")
				var one [8]byte
				binary.NativeEndian.PutUint64(one[:], 1)
				_, _ = unix.Write(int(b.efd), one[:])
			} else {
				b.log.Warn("context canceled after the VM started; it runs until the guest stops or the process is killed")
			}
		}
	}
	// The arena must outlive the call; libkrun may hold its pointers.
	runtime.KeepAlive(b.a)
	// libkrun consumed the context and may have taken ownership of the
	// fds (it wraps some in Rust Files that close on drop), so they are
	// not closed here: closing a number it already closed could close an
	// unrelated file. The runner exits after this error anyway.
	return callError(CodeStart, "krun_start_enter", ret, startHint(syscall.Errno(-ret)))
}

// configHint explains the usual cause of a configuration failure.
func configHint(call string, e syscall.Errno) string {
	switch {
	case e == syscall.ENOENT && call != "krun_create_ctx":
		return "libkrun does not know the context (it was freed or consumed)"
	case e == syscall.EINVAL && call == "krun_set_kernel":
		return "libkrun refused the kernel, its format or the initramfs (is the initramfs readable?)"
	case e == syscall.EEXIST:
		return "configured twice"
	}
	return ""
}

// startHint explains the usual causes of a krun_start_enter failure.
func startHint(e syscall.Errno) string {
	switch e {
	case syscall.EINVAL:
		if runtime.GOOS == "darwin" {
			return "on macOS this is almost always a missing com.apple.security.hypervisor entitlement: sign the binary with scripts/macos-sign.sh " +
				"(an ad-hoc re-sign without --entitlements strips it); otherwise libkrun's log on stderr says which device failed"
		}
		return "libkrun could not build the VM; its log on stderr says why (kernel format, memory, a device)"
	case syscall.ENOENT:
		return "no kernel: krun_set_kernel was not applied and libkrunfw is not installed"
	}
	return ""
}

// randomMAC returns a locally administered unicast address.
func randomMAC() net.HardwareAddr {
	m := make(net.HardwareAddr, 6)
	if _, err := rand.Read(m); err != nil {
		// crypto/rand does not fail on supported systems; a fixed
		// address still works, each VM has its own network.
		return net.HardwareAddr{0x5a, 0x94, 0xef, 0xe4, 0x0c, 0xee}
	}
	m[0] = m[0]&^0x01 | 0x02
	return m
}
