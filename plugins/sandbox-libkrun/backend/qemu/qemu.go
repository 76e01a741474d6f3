// Package qemu is the QEMU back end of sandbox-libkrun: it builds the QEMU
// command line for a sandbox VM (microvm on x86_64, virt on arm64), starts
// and stops the QEMU process, and probes which accelerators really boot on
// this host. spec/vm-recipe.md holds the measurements behind the choices.
package qemu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// Accelerators.
const (
	AccelKVM = "kvm"
	AccelHVF = "hvf"
	AccelTCG = "tcg"
)

// Error codes of this back end; the adapter reports them as S300 with the
// message.
const (
	CodeNotFound    = "QEMU_NOT_FOUND"    // no QEMU binary for this architecture
	CodeBadConfig   = "QEMU_BAD_CONFIG"   // the VM configuration is invalid
	CodeStartFailed = "QEMU_START_FAILED" // QEMU did not start or exited during start
	CodeExited      = "QEMU_EXITED"       // QEMU exited with an error
	CodeNoAccel     = "QEMU_NO_ACCEL"     // no accelerator boots a VM here
	CodeKernel      = "QEMU_KERNEL_NOT_FOUND"
)

// Error is a back-end failure. It carries the end of QEMU's stderr and of
// the guest console, which is where the reason usually is.
type Error struct {
	Code        string
	Message     string
	StderrTail  string
	ConsoleTail string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Code + ": " + e.Message)
	if e.StderrTail != "" {
		b.WriteString("\nqemu stderr:\n" + e.StderrTail)
	}
	if e.ConsoleTail != "" {
		b.WriteString("\nguest console:\n" + e.ConsoleTail)
	}
	return b.String()
}

// Config describes one VM.
type Config struct {
	// QEMU is the emulator binary; empty means qemu-system-x86_64 or
	// qemu-system-aarch64 from PATH, by Arch.
	QEMU string
	// Arch is the guest (and host) architecture, GOARCH style; empty
	// means runtime.GOARCH.
	Arch string
	// Accel is kvm, hvf or tcg.
	Accel     string
	MemoryMiB int // default 512
	CPUs      int // default 1
	Kernel    string
	Initrd    string
	// RootDisk is the sandbox image, attached read-only as /dev/vda; the
	// agent lays a tmpfs upper layer over it. Empty boots the initramfs
	// as the root.
	RootDisk   string
	RootFSType string // erofs (default), ext4 or squashfs
	UpperSize  string // tmpfs size of the writable layer, e.g. "1g" or "50%"
	// UpperDisk is a writable ext4 disk the agent uses as the upper layer
	// instead of a tmpfs (worker VMs keep their installed dependencies
	// on it). Both disks then carry serials and the agent finds them by
	// serial. Needs RootDisk.
	UpperDisk string
	// Network adds a virtio-net NIC whose frames QEMU exchanges over
	// NetSocket (`-netdev socket`: each frame preceded by its 32-bit
	// big-endian length); the runner serves the other end with its
	// user-mode network (package usernet). QEMU's own user network
	// (slirp) is never used: it maps the gateway to the host's loopback.
	// Without Network the VM has no network device at all.
	Network bool
	// NetSocket is QEMU's end of the NIC's stream, a connected unix
	// stream socket; Launch requires it with Network and hands it to
	// QEMU as fd 3.
	NetSocket *os.File
	// StateDir holds the agent socket, QEMU's stderr and the console log.
	StateDir string
	// TSCKHz is passed as tsc_early_khz on x86_64; 0 reads the host's
	// from /proc/cpuinfo (required under TCG: without it a loaded host
	// can make the guest's TSC calibration fail and the boot hang).
	TSCKHz int
	// TBSizeMiB caps TCG's translation buffer (QEMU's default reserves
	// 1 GiB of address space per VM); default 64.
	TBSizeMiB int
	// Debug drops "quiet" and turns on the agent's debug logs.
	Debug bool
	// NoSandbox leaves out QEMU's seccomp sandbox (for QEMU builds
	// without seccomp).
	NoSandbox bool
	// ExtraAppend is added to the kernel command line.
	ExtraAppend []string
	// DieWithParent kills QEMU when the process that launched it dies
	// (Linux), so a crashed runner cannot leave a VM behind.
	DieWithParent bool

	// MemoryFile backs guest RAM with a file (snapshot templates). With
	// MemoryShared the guest's writes reach the file: a template being
	// recorded. Without, the file is mapped copy-on-write: clones share
	// its pages in the host's page cache until they write to them.
	MemoryFile   string
	MemoryShared bool
	// Control serves QMP on StateDir/qmp.sock, through which a template is
	// recorded (SaveTemplate) and restored.
	Control bool
	// Incoming restores the VM from a template instead of booting: the
	// saved device state is read from this file and guest RAM comes from
	// MemoryFile (not shared). Without MemoryFile (or with one the saved
	// VM did not share) the stream carries the RAM too: a paused
	// sandbox's state (SaveTemplate of a VM that shares no memory).
	// Needs Control.
	Incoming *os.File
	// ConsoleMaxBytes caps the guest console's log on disk (console.log
	// and its rotated console.log.1, package consolelog); 0 means
	// consolelog.DefaultMaxBytes. QEMU never writes the file itself: its
	// serial port writes into a pipe that Launch reads.
	ConsoleMaxBytes int64

	// consoleOut is QEMU's end of the console's pipe (Launch).
	consoleOut *os.File

	// extraArgs are appended to the command line (the benchmark that
	// compares QEMU's own user network with usernet).
	extraArgs []string
}

// Disk serials when there is an upper disk (backend.RootDiskSerial and
// DataDiskSerial; this package does not import backend).
const (
	rootSerial  = "iii-root"
	upperSerial = "iii-upper"
)

// netFD is NetSocket's descriptor number in QEMU: the first of
// exec.Cmd.ExtraFiles.
const netFD = 3

// consoleFDSet is the fd set (-add-fd) that carries the console's pipe.
const consoleFDSet = 1

// extraFiles are the descriptors QEMU inherits, from fd 3 on: the NIC's
// socket, then a restore's state stream, then the console's pipe.
func (c *Config) extraFiles() []*os.File {
	var files []*os.File
	if c.Network {
		files = append(files, c.NetSocket)
	}
	if c.Incoming != nil {
		files = append(files, c.Incoming)
	}
	return append(files, c.consoleOut)
}

// consoleFD is the console pipe's descriptor number in QEMU: the last of
// extraFiles.
func (c *Config) consoleFD() int {
	fd := netFD
	if c.Network {
		fd++
	}
	if c.Incoming != nil {
		fd++
	}
	return fd
}

// incomingFD is Incoming's descriptor number in QEMU.
func (c *Config) incomingFD() int {
	if c.Network {
		return netFD + 1
	}
	return netFD
}

// File names in StateDir.
const (
	SocketName  = "exec.sock"
	StderrName  = "qemu.stderr"
	ConsoleName = "console.log"
)

// SocketPath is where the agent's port is served.
func (c *Config) SocketPath() string { return filepath.Join(c.StateDir, SocketName) }

func (c *Config) arch() string {
	if c.Arch != "" {
		return c.Arch
	}
	return runtime.GOARCH
}

// Binary returns the QEMU binary for the config's architecture.
func (c *Config) Binary() (string, error) {
	if c.QEMU != "" {
		return c.QEMU, nil
	}
	name, err := BinaryName(c.arch())
	if err != nil {
		return "", err
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", &Error{Code: CodeNotFound, Message: fmt.Sprintf("%s not found in PATH: install QEMU (scripts/setup-vm.sh does)", name)}
	}
	return p, nil
}

// BinaryName is the QEMU system emulator for a GOARCH.
func BinaryName(arch string) (string, error) {
	switch arch {
	case "amd64":
		return "qemu-system-x86_64", nil
	case "arm64":
		return "qemu-system-aarch64", nil
	}
	return "", &Error{Code: CodeBadConfig, Message: fmt.Sprintf("architecture %q is not supported: use amd64 or arm64", arch)}
}

func sizeOK(s string) bool {
	_, err := agentproto.ParseBootParams(agentproto.ParamUpperSize + "=" + s)
	return err == nil
}

func (c *Config) validate() error {
	bad := func(format string, args ...any) error {
		return &Error{Code: CodeBadConfig, Message: fmt.Sprintf(format, args...)}
	}
	switch c.Accel {
	case AccelKVM, AccelTCG:
	case AccelHVF:
		if c.arch() != "arm64" {
			return bad("accel hvf is supported only for arm64 guests")
		}
	default:
		return bad("accel %q: use kvm, hvf or tcg", c.Accel)
	}
	if c.Kernel == "" || c.Initrd == "" {
		return bad("kernel and initrd are required")
	}
	if c.StateDir == "" {
		return bad("state dir is required")
	}
	// The unix socket path must fit sun_path (108 bytes with the NUL).
	if n := len(c.SocketPath()); n > 107 {
		return bad("state dir %s is too long for a unix socket path (%d bytes, limit 107)", c.StateDir, n)
	}
	if c.MemoryMiB < 0 || c.CPUs < 0 || c.TBSizeMiB < 0 || c.TSCKHz < 0 {
		return bad("memory, cpus, tb size and tsc must not be negative")
	}
	switch c.RootFSType {
	case "", "erofs", "ext4", "squashfs":
	default:
		return bad("root filesystem type %q: use erofs, ext4 or squashfs", c.RootFSType)
	}
	if c.UpperSize != "" && !sizeOK(c.UpperSize) {
		return bad("upper size %q: use a tmpfs size such as 512m or 50%%", c.UpperSize)
	}
	for _, a := range c.ExtraAppend {
		if strings.ContainsAny(a, " \t\n\"") {
			return bad("kernel argument %q holds spaces or quotes", a)
		}
	}
	// QEMU's option syntax treats commas as separators; a path holding
	// one would be split.
	if c.UpperDisk != "" && c.RootDisk == "" {
		return bad("an upper disk needs a root disk")
	}
	if c.MemoryShared && c.MemoryFile == "" {
		return bad("shared memory needs a memory file")
	}
	if c.Incoming != nil && (c.MemoryShared || !c.Control) {
		return bad("a restore needs private memory and the control socket")
	}
	if n := len(filepath.Join(c.StateDir, QMPName)); c.Control && n > 107 {
		return bad("state dir %s is too long for the control socket path (%d bytes, limit 107)", c.StateDir, n)
	}
	for _, p := range []string{c.Kernel, c.Initrd, c.RootDisk, c.UpperDisk, c.StateDir, c.MemoryFile} {
		if strings.Contains(p, ",") {
			return bad("path %q holds a comma, which QEMU options cannot carry", p)
		}
	}
	return nil
}

// Args returns QEMU's arguments (without the binary).
func (c *Config) Args() ([]string, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	mem, cpus, tb := c.MemoryMiB, c.CPUs, c.TBSizeMiB
	if mem == 0 {
		mem = 512
	}
	if cpus == 0 {
		cpus = 1
	}
	if tb == 0 {
		tb = 64
	}
	var machine, console string
	switch c.arch() {
	case "amd64":
		// microvm with its defaults: ACPI is how this kernel finds the
		// virtio-mmio devices; pit=off and acpi=off both hang or fail.
		machine, console = "microvm", "ttyS0"
	case "arm64":
		machine, console = "virt", "ttyAMA0"
	default:
		_, err := BinaryName(c.arch())
		return nil, err
	}
	if c.MemoryFile != "" {
		machine += ",memory-backend=mem"
	}
	args := []string{"-M", machine}
	if c.Accel == AccelTCG {
		args = append(args, "-accel", "tcg,tb-size="+strconv.Itoa(tb))
		if c.arch() == "arm64" {
			args = append(args, "-cpu", "max")
		}
	} else {
		args = append(args, "-accel", c.Accel, "-cpu", "host")
	}
	args = append(args,
		"-m", strconv.Itoa(mem),
		"-smp", strconv.Itoa(cpus),
		"-nodefaults", "-no-user-config", "-display", "none",
		// A kernel panic (or the agent dying) reboots the guest;
		// -no-reboot turns that into QEMU exiting.
		"-no-reboot",
		// The serial console goes into the pipe Launch reads and caps
		// (package consolelog), never into a file QEMU would grow
		// without bound. A file chardev opens it from an fd set;
		// append=on keeps QEMU from truncating it, which a pipe
		// refuses.
		"-add-fd", fmt.Sprintf("fd=%d,set=%d", c.consoleFD(), consoleFDSet),
		"-chardev", fmt.Sprintf("file,id=console,path=/dev/fdset/%d,append=on", consoleFDSet),
		"-serial", "chardev:console",
	)
	if !c.NoSandbox {
		args = append(args, "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny")
	}

	appendArgs := []string{"console=" + console, "panic=-1"}
	if !c.Debug {
		appendArgs = append(appendArgs, "quiet")
	} else {
		appendArgs = append(appendArgs, agentproto.ParamDebug+"=1")
	}
	if c.arch() == "amd64" {
		khz := c.TSCKHz
		if khz == 0 {
			khz, _ = HostTSCKHz()
		}
		if khz > 0 {
			appendArgs = append(appendArgs, "tsc_early_khz="+strconv.Itoa(khz))
		}
	}
	if c.RootDisk != "" {
		fstype := c.RootFSType
		if fstype == "" {
			fstype = "erofs"
		}
		if c.UpperDisk != "" {
			appendArgs = append(appendArgs, agentproto.ParamRoot+"="+agentproto.SerialPrefix+rootSerial,
				agentproto.ParamUpper+"="+agentproto.SerialPrefix+upperSerial, agentproto.ParamRootFSType+"="+fstype)
		} else {
			appendArgs = append(appendArgs, agentproto.ParamRoot+"=/dev/vda", agentproto.ParamRootFSType+"="+fstype)
		}
		if c.UpperSize != "" && c.UpperDisk == "" {
			appendArgs = append(appendArgs, agentproto.ParamUpperSize+"="+c.UpperSize)
		}
	}
	appendArgs = append(appendArgs, c.ExtraAppend...)
	args = append(args,
		"-kernel", c.Kernel,
		"-initrd", c.Initrd,
		"-append", strings.Join(appendArgs, " "),
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path="+c.SocketPath()+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name="+agentproto.PortName,
	)
	if c.RootDisk != "" {
		root := "virtio-blk-device,drive=root"
		if c.UpperDisk != "" {
			root += ",serial=" + rootSerial
		}
		args = append(args,
			"-drive", "file="+c.RootDisk+",if=none,id=root,format=raw,readonly=on",
			"-device", root,
		)
	}
	if c.UpperDisk != "" {
		args = append(args,
			"-drive", "file="+c.UpperDisk+",if=none,id=upper,format=raw,discard=unmap",
			"-device", "virtio-blk-device,drive=upper,serial="+upperSerial,
		)
	}
	if c.Network {
		args = append(args,
			"-netdev", "socket,id=net0,fd="+strconv.Itoa(netFD),
			"-device", "virtio-net-device,netdev=net0",
		)
	}
	if c.MemoryFile != "" {
		share := "off"
		if c.MemoryShared {
			share = "on"
		}
		args = append(args, "-object", fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=%s", mem, c.MemoryFile, share))
	}
	if c.Control {
		args = append(args, "-qmp", "unix:"+filepath.Join(c.StateDir, QMPName)+",server=on,wait=off")
	}
	if c.Incoming != nil {
		// The stream's file descriptor is handed over by QMP once
		// x-ignore-shared is on (Launch), which the command line cannot
		// set in this QEMU.
		args = append(args, "-incoming", "defer")
	}
	return append(args, c.extraArgs...), nil
}

// HostTSCKHz reads the host TSC frequency from /proc/cpuinfo.
func HostTSCKHz() (int, error) {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0, err
	}
	return ParseCPUInfoKHz(string(b))
}

// ParseCPUInfoKHz returns the first "cpu MHz" of /proc/cpuinfo in kHz.
// Under TCG the guest TSC runs at the host TSC rate; on hosts with
// constant_tsc that is the nominal frequency cpuinfo shows.
func ParseCPUInfoKHz(s string) (int, error) {
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || mhz <= 0 || mhz > 100000 {
			return 0, fmt.Errorf("cpuinfo: bad cpu MHz %q", strings.TrimSpace(v))
		}
		return int(mhz*1000 + 0.5), nil
	}
	return 0, errors.New("cpuinfo: no cpu MHz line")
}
