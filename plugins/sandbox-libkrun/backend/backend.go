// Package backend declares what a hypervisor back end of sandbox-libkrun
// does: run one VM inside a VM runner process (the adapter binary re-exec'd
// with the hidden __vm-run subcommand, one per sandbox).
//
// Both back ends fit the same shape. QEMU runs the VM in a child process
// that the runner supervises; libkrun turns the runner itself into the VM
// (krun_start_enter never returns and exits the process when the guest
// stops). Either way the runner's life is the VM's life, which is what lets
// the adapter treat "the runner exited" as "the VM is gone", and kill one
// process group to be sure.
package backend

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/consolelog"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/usernet"
)

// Back-end names, as the adapter's `hypervisor` configuration key spells
// them.
const (
	QEMU    = "qemu"
	Libkrun = "libkrun"
)

// Accelerators.
const (
	AccelKVM = "kvm"
	AccelHVF = "hvf"
	AccelTCG = "tcg"
)

// File names inside a VM's state directory that every back end uses, so the
// adapter finds the agent and the logs without knowing which back end ran.
const (
	// SocketName is the unix socket that carries the guest agent's
	// "iii.exec" port: QEMU serves it itself, the libkrun back end relays
	// a console port to it.
	SocketName = "exec.sock"
	// ConsoleName is the guest's serial console log.
	ConsoleName = "console.log"
	// StderrName is the VMM's own stderr (QEMU's; libkrun logs to the
	// runner's stderr instead).
	StderrName = "qemu.stderr"
)

// Serials of the disks of a VM with a data disk: the agent finds each by
// its serial, since the order in which two disks appear is not fixed.
const (
	RootDiskSerial = "iii-root"
	DataDiskSerial = "iii-upper"
)

// MaxSocketPath bounds the agent socket path. sun_path holds 108 bytes on
// Linux and 104 on macOS, NUL included; a margin keeps every platform happy.
const MaxSocketPath = 100

// Spec is one VM, with everything resolved: the runner passes it to the
// back end as is.
type Spec struct {
	// ID names the VM in logs (the sandbox id).
	ID string `json:"id"`
	// CPUs and MemoryMiB size the VM.
	CPUs      int `json:"cpus"`
	MemoryMiB int `json:"memory_mib"`
	// Kernel and Initrd boot the VM; the initramfs's /init is the guest
	// agent.
	Kernel string `json:"kernel"`
	Initrd string `json:"initrd"`
	// KernelConfig is the kernel's build configuration, when known; the
	// libkrun back end checks it can find libkrun's devices.
	KernelConfig string `json:"kernel_config,omitempty"`
	// RootDisk is the image's block image, attached read-only as the first
	// disk (/dev/vda); the agent lays a tmpfs upper layer over it, so
	// writes never reach the file. Empty boots the initramfs alone (the
	// accelerator probe does).
	RootDisk   string `json:"root_disk,omitempty"`
	RootFSType string `json:"root_fs_type,omitempty"`
	// DataDisk is a writable raw disk (ext4) attached after the root disk
	// with the serial DataDiskSerial; the agent uses it as a persistent
	// upper layer instead of a tmpfs (worker VMs). Needs RootDisk.
	DataDisk string `json:"data_disk,omitempty"`
	// Network gives the guest a NIC with outbound access through the
	// runner's user-mode network (package usernet) and its policy;
	// without it the VM has no network device at all.
	Network bool `json:"network,omitempty"`
	// NetAllowCIDRs are the private ranges the guest may reach besides
	// public addresses (the adapter's network_allow_cidrs).
	NetAllowCIDRs []string `json:"net_allow_cidrs,omitempty"`
	// NetForwards are the gateway's TCP ports that lead to the host: a
	// VM worker's way to the engine. Sandboxes have none.
	NetForwards []NetForward `json:"net_forwards,omitempty"`
	// Hostname is the guest's host name (iii.hostname on the kernel
	// command line); empty leaves the kernel's default.
	Hostname string `json:"hostname,omitempty"`
	// StateDir holds the agent socket and the logs.
	StateDir string `json:"state_dir"`
	// Accel is kvm, hvf or tcg; the libkrun back end accepts only the
	// host's hardware accelerator.
	Accel string `json:"accel"`
	// QEMUBinary is the emulator (QEMU back end).
	QEMUBinary string `json:"qemu_binary,omitempty"`
	// LibkrunPath is the library to load (libkrun back end); empty means
	// the default search.
	LibkrunPath string `json:"libkrun_path,omitempty"`
	// Debug keeps the kernel's and the agent's console output verbose.
	Debug bool `json:"debug,omitempty"`
	// ConsoleLogMaxBytes caps the guest console's log on disk
	// (ConsoleName and its rotated file, package consolelog); 0 means
	// consolelog.DefaultMaxBytes.
	ConsoleLogMaxBytes int64 `json:"console_log_max_bytes,omitempty"`
	// NetDNSServers are the nameservers ("ip" or "ip:port") the
	// network's DNS service asks; empty means the host's
	// /etc/resolv.conf's.
	NetDNSServers []string `json:"net_dns_servers,omitempty"`
	// Template records or restores a snapshot template (QEMU back end
	// only; package qemu's template.go explains them).
	Template *Template `json:"template,omitempty"`
}

// Template is a snapshot template's files as one VM uses them, or a
// paused sandbox's saved state.
type Template struct {
	// MemoryFile is the guest RAM's file. Empty (with StateFile) resumes
	// a paused VM whose RAM is in the state file, as its boot had it.
	MemoryFile string `json:"memory_file"`
	// StateFile is the saved device state to restore from. Empty records
	// a template: the VM boots with its RAM written through to MemoryFile
	// and serves QMP for the save.
	StateFile string `json:"state_file,omitempty"`
}

// Restores reports whether the VM resumes from a template instead of
// booting.
func (s *Spec) Restores() bool { return s.Template != nil && s.Template.StateFile != "" }

// NetForward connects the guest's TCP connections to the gateway's
// GuestPort to HostAddr, a loopback "ip:port" of the host, and to nothing
// else (usernet.Forward). An HTTP forward relays one HTTP request head with
// its Host set to HostAddr, and with BearerToken the guest's Authorization
// replaced by the token, which never enters the guest.
type NetForward struct {
	GuestPort   uint16 `json:"guest_port"`
	HostAddr    string `json:"host_addr"`
	HTTP        bool   `json:"http,omitempty"`
	BearerToken string `json:"bearer_token,omitempty"`
}

// SocketPath is the agent socket of the VM.
func (s *Spec) SocketPath() string { return filepath.Join(s.StateDir, SocketName) }

// Validate checks what every back end relies on.
func (s *Spec) Validate() error {
	bad := func(format string, args ...any) error { return fmt.Errorf("invalid VM spec: "+format, args...) }
	switch {
	case s.ID == "":
		return bad("no id")
	case s.CPUs < 1 || s.CPUs > 256:
		return bad("cpus %d is outside 1..256", s.CPUs)
	case s.MemoryMiB < 64 || s.MemoryMiB > 1<<20:
		return bad("memory %d MiB is outside 64..1048576", s.MemoryMiB)
	case s.Kernel == "" || s.Initrd == "":
		return bad("kernel and initrd are required")
	case s.StateDir == "" || !filepath.IsAbs(s.StateDir):
		return bad("state dir %q must be an absolute path", s.StateDir)
	case len(s.SocketPath()) >= MaxSocketPath:
		return bad("agent socket path %s is %d bytes; unix sockets allow fewer than %d: use a shorter state_dir", s.SocketPath(), len(s.SocketPath()), MaxSocketPath)
	}
	switch s.Accel {
	case AccelKVM, AccelHVF, AccelTCG:
	default:
		return bad("accelerator %q: want kvm, hvf or tcg", s.Accel)
	}
	if s.DataDisk != "" && s.RootDisk == "" {
		return bad("a data disk needs a root disk")
	}
	for _, p := range []string{s.Kernel, s.Initrd, s.KernelConfig, s.RootDisk, s.DataDisk, s.QEMUBinary, s.LibkrunPath} {
		if p != "" && !filepath.IsAbs(p) {
			return bad("path %q must be absolute", p)
		}
	}
	if t := s.Template; t != nil {
		if (t.MemoryFile == "" && t.StateFile == "") || (t.MemoryFile != "" && !filepath.IsAbs(t.MemoryFile)) || (t.StateFile != "" && !filepath.IsAbs(t.StateFile)) {
			return bad("template files must be absolute paths (a recording needs a memory file)")
		}
		if s.DataDisk != "" {
			return bad("a VM with a data disk has no template")
		}
	}
	if strings.ContainsAny(s.Hostname, " \t\n\"") {
		return bad("hostname %q holds spaces or quotes", s.Hostname)
	}
	if !s.Network && (len(s.NetAllowCIDRs) > 0 || len(s.NetForwards) > 0 || len(s.NetDNSServers) > 0) {
		return bad("network ranges, forwards and nameservers need network")
	}
	if m := s.ConsoleLogMaxBytes; m != 0 && (m < consolelog.MinMaxBytes || m > consolelog.MaxMaxBytes) {
		return bad("console log cap %d bytes is outside %d..%d", m, consolelog.MinMaxBytes, consolelog.MaxMaxBytes)
	}
	if _, err := s.NetConfig(); err != nil {
		return bad("%v", err)
	}
	return nil
}

// NetConfig is the VM's network as usernet takes it (without a logger).
func (s *Spec) NetConfig() (usernet.Config, error) {
	allow, err := usernet.ParseAllowCIDRs(s.NetAllowCIDRs)
	if err != nil {
		return usernet.Config{}, fmt.Errorf("network ranges: %w", err)
	}
	cfg := usernet.Config{AllowCIDRs: allow}
	for _, d := range s.NetDNSServers {
		ap, err := ParseNameserver(d)
		if err != nil {
			return usernet.Config{}, err
		}
		cfg.DNSServers = append(cfg.DNSServers, ap)
	}
	for _, f := range s.NetForwards {
		ap, err := netip.ParseAddrPort(f.HostAddr)
		if err != nil {
			return usernet.Config{}, fmt.Errorf("forward of guest port %d: host address %q: %w", f.GuestPort, f.HostAddr, err)
		}
		cfg.Forwards = append(cfg.Forwards, usernet.Forward{GuestPort: f.GuestPort, HostAddr: ap, HTTP: f.HTTP, BearerToken: f.BearerToken})
	}
	if err := cfg.Validate(); err != nil {
		return usernet.Config{}, err
	}
	return cfg, nil
}

// ParseNameserver reads a nameserver as "ip" (port 53) or "ip:port"
// ("[ipv6]:port").
func ParseNameserver(s string) (netip.AddrPort, error) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return netip.AddrPortFrom(a.Unmap(), 53), nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("nameserver %q: want an IP address, or an IP address and a port such as 192.0.2.53:53", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// Started is what a back end reports once the VM exists (before the guest
// has booted).
type Started struct {
	// VMPID is the process that is the VM: QEMU's pid, or the runner's own
	// for a back end that runs the VM in process.
	VMPID int
}

// Backend runs VMs. Implementations live beside the runner; the adapter
// only names one (Name) in the runner's configuration.
type Backend interface {
	// Name is the back end's name (QEMU, Libkrun).
	Name() string
	// Run boots the VM of spec in this process's care and supervises it
	// until it ends or ctx ends. started is called once, as soon as the VM
	// process exists. When ctx ends, Run kills the VM and returns. Run
	// returns nil when the guest powered itself off, an error otherwise.
	//
	// A back end whose VM runs inside the calling process (libkrun) does
	// not return from a successful boot: the process exits when the guest
	// stops, and the runner exits the process itself when ctx ends. Such a
	// back end calls started before it hands the thread to the VM.
	Run(ctx context.Context, spec Spec, started func(Started)) error
}
