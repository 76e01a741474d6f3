package guest

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// BootInfo reports what Boot did.
type BootInfo struct {
	Params   agentproto.BootParams
	PortPath string // e.g. /dev/vport0p1
	Root     string // "overlay" or "initramfs"
	Modules  []ModuleLoad
	Kernel   string
}

// ModuleLoad is the outcome of loading one module.
type ModuleLoad struct {
	Path     string
	Duration time.Duration
	Err      error
}

// Boot prepares the VM as PID 1: the API filesystems, kernel modules, the
// agent's port and the sandbox root. It leaves the process chrooted into the
// sandbox root, so exec and fs operations see what the sandbox sees.
func Boot(log hclog.Logger) (*BootInfo, error) {
	if err := mountEarly(); err != nil {
		return nil, err
	}
	info := &BootInfo{Root: "initramfs", Kernel: kernelRelease()}
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return nil, fmt.Errorf("read /proc/cmdline: %w", err)
	}
	if info.Params, err = agentproto.ParseBootParams(string(cmdline)); err != nil {
		return nil, fmt.Errorf("kernel command line: %w", err)
	}
	if info.Params.Debug {
		log.SetLevel(hclog.Debug)
	}

	info.Modules, err = LoadModules(agentproto.ModuleManifestPath)
	if err != nil {
		return nil, err
	}
	for _, m := range info.Modules {
		if m.Err != nil {
			// Keep going: a module that is not needed for this VM's
			// devices should not stop the boot, and a missing device
			// gives its own clear error below.
			log.Warn("module load failed", "module", m.Path, "error", m.Err)
		} else {
			log.Debug("module loaded", "module", m.Path, "ms", m.Duration.Milliseconds())
		}
	}

	if info.PortPath, err = FindPort(info.Params.Port, 15*time.Second); err != nil {
		return nil, err
	}

	if info.Params.Root != "" {
		if err := switchRoot(info.Params, log); err != nil {
			return nil, err
		}
		info.Root = "overlay"
	}
	if err := mountLate(); err != nil {
		return nil, err
	}
	if info.Params.Hostname != "" {
		if err := unix.Sethostname([]byte(info.Params.Hostname)); err != nil {
			log.Warn("set hostname", "error", err)
		}
	}
	return info, nil
}

type mountSpec struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
	mode                   os.FileMode
}

func mountAll(specs []mountSpec) error {
	for _, m := range specs {
		if err := os.MkdirAll(m.target, m.mode); err != nil {
			return fmt.Errorf("mkdir %s: %w", m.target, err)
		}
		if err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
		}
	}
	return nil
}

// mountEarly mounts what module loading and device discovery need.
func mountEarly() error {
	const nosuid = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	return mountAll([]mountSpec{
		{"proc", "/proc", "proc", nosuid, "", 0o555},
		{"sysfs", "/sys", "sysfs", nosuid, "", 0o555},
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755", 0o755},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "gid=5,mode=0620,ptmxmode=0666", 0o755},
	})
}

// mountLate mounts the scratch filesystems of the final root.
func mountLate() error {
	return mountAll([]mountSpec{
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755", 0o755},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
	})
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// LoadModules loads the modules listed in the manifest, in order. A missing
// manifest means the kernel has everything built in.
func LoadModules(manifest string) ([]ModuleLoad, error) {
	b, err := os.ReadFile(manifest)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read module manifest: %w", err)
	}
	paths, err := agentproto.ParseModuleManifest(string(b))
	if err != nil {
		return nil, err
	}
	out := make([]ModuleLoad, 0, len(paths))
	for _, p := range paths {
		start := time.Now()
		err := loadModule(p)
		out = append(out, ModuleLoad{Path: p, Duration: time.Since(start), Err: err})
	}
	return out, nil
}

func loadModule(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	flags := 0
	if agentproto.ModuleCompressed(p) {
		flags |= unix.MODULE_INIT_COMPRESSED_FILE
	}
	for {
		err = unix.FinitModule(int(f.Fd()), "", flags)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if errors.Is(err, unix.EEXIST) {
		return nil // built in, or already loaded
	}
	return err
}

// FindPort waits for the virtio-console port called name and returns its
// device path. Ports appear once virtio_console has probed the device.
func FindPort(name string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		matches, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		var seen []string
		for _, m := range matches {
			b, err := os.ReadFile(m)
			if err != nil {
				continue
			}
			n := strings.TrimSpace(string(b))
			dev := filepath.Base(filepath.Dir(m))
			seen = append(seen, dev+"="+n)
			if n == name {
				p := "/dev/" + dev
				if _, err := os.Stat(p); err == nil {
					return p, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("virtio port %q not found after %s (ports: %v); is virtio_console loaded and the port attached?", name, timeout, seen)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// switchRoot mounts the image (read-only) under a tmpfs upper layer with
// overlayfs, moves the API filesystems into it, frees the initramfs and
// makes the overlay the root of this process. The agent keeps running from
// the memory the deleted /init still occupies.
func switchRoot(p agentproto.BootParams, log hclog.Logger) error {
	const (
		lower   = "/iii/lower"
		rw      = "/iii/rw"
		newroot = "/iii/newroot"
	)
	root, err := ResolveDevice(p.Root, 10*time.Second)
	if err != nil {
		return err
	}
	// The writable layer: a tmpfs thrown away with the VM (sandboxes), or
	// a worker's persistent ext4 disk, so what its install step put there
	// is still there at the next boot. The disk is a sparse file made by
	// mkfs.ext4 with lazy inode-table init: its unwritten blocks read as
	// zeros already, so the kernel need not zero them (noinit_itable)
	// and spend TCG time on it.
	upper := mountSpec{"tmpfs", rw, "tmpfs", 0, "mode=0755", 0o755}
	if p.UpperSize != "" {
		upper.data += ",size=" + p.UpperSize
	}
	if p.Upper != "" {
		dev, err := ResolveDevice(p.Upper, 10*time.Second)
		if err != nil {
			return err
		}
		upper = mountSpec{dev, rw, "ext4", unix.MS_NOATIME, "noinit_itable", 0o755}
		log.Debug("persistent upper layer", "device", dev)
	}
	if err := mountAll([]mountSpec{
		{root, lower, p.RootFSType, unix.MS_RDONLY, "", 0o755},
		upper,
	}); err != nil {
		return err
	}
	for _, d := range []string{rw + "/upper", rw + "/work"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := mountAll([]mountSpec{{"overlay", newroot, "overlay", 0,
		"lowerdir=" + lower + ",upperdir=" + rw + "/upper,workdir=" + rw + "/work", 0o755}}); err != nil {
		return err
	}
	for _, m := range []string{"/dev", "/proc", "/sys"} {
		target := newroot + m
		if err := os.MkdirAll(target, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", target, err)
		}
		if err := unix.Mount(m, target, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s into the new root: %w", m, err)
		}
	}
	freeInitramfs(log)
	if err := unix.Chdir(newroot); err != nil {
		return fmt.Errorf("chdir new root: %w", err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the new root onto /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}

// ResolveDevice waits for the block device spec names (a /dev path, or
// serial:<id> for the virtio disk with that serial) and returns its path.
func ResolveDevice(spec string, timeout time.Duration) (string, error) {
	return resolveDevice(spec, "/sys/block", "/dev", timeout)
}

func resolveDevice(spec, sysBlock, dev string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	serial, bySerial := strings.CutPrefix(spec, agentproto.SerialPrefix)
	for {
		if bySerial {
			if p := findBySerial(serial, sysBlock, dev); p != "" {
				return p, nil
			}
		} else if _, err := os.Stat(spec); err == nil {
			return spec, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("block device %s did not appear within %s; is virtio_blk loaded and the disk attached?", spec, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// findBySerial returns /dev/<name> of the block device whose serial is
// serial, once its device node exists.
func findBySerial(serial, sysBlock, dev string) string {
	des, err := os.ReadDir(sysBlock)
	if err != nil {
		return ""
	}
	for _, de := range des {
		b, err := os.ReadFile(filepath.Join(sysBlock, de.Name(), "serial"))
		if err != nil || strings.TrimSpace(string(b)) != serial {
			continue
		}
		p := filepath.Join(dev, de.Name())
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// freeInitramfs deletes the initramfs's files (the agent binary, modules)
// so their memory returns to the guest, as switch_root does. It never
// crosses into another filesystem, so the mounted image, the upper layer
// and the new root are untouched.
func freeInitramfs(log hclog.Logger) {
	var st unix.Stat_t
	if err := unix.Lstat("/", &st); err != nil {
		return
	}
	var freed int64
	removeSameDev("/", st.Dev, &freed)
	log.Debug("initramfs freed", "bytes", freed)
}

func removeSameDev(dir string, dev uint64, freed *int64) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil || st.Dev != dev {
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			removeSameDev(p, dev, freed)
			_ = unix.Rmdir(p) // fails for mount points: they stay
			continue
		}
		if unix.Unlink(p) == nil {
			*freed += st.Size
		}
	}
}

// PowerOff flushes and powers the VM off. On microvm this is an ACPI S5
// request, and QEMU exits with status 0.
func PowerOff() error {
	unix.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

// Uptime returns the kernel's uptime.
func Uptime() time.Duration {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	s, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	return time.Duration(s * float64(time.Second))
}

// VPort is an open virtio-console port. It uses blocking syscalls directly:
// the port reports a disconnected host as EOF on read and POLLHUP on poll,
// which the runtime's poller would turn into a busy loop.
type VPort struct {
	fd int
}

var _ Port = (*VPort)(nil)

// OpenPort opens the port device.
func OpenPort(path string) (*VPort, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return &VPort{fd: fd}, nil
}

// Read returns io.EOF while no host is connected.
func (p *VPort) Read(b []byte) (int, error) {
	for {
		n, err := unix.Read(p.fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

// Write writes all of b; the driver takes at most 32 KiB per call and
// blocks while no host is connected.
func (p *VPort) Write(b []byte) (int, error) {
	total := 0
	for total < len(b) {
		n, err := unix.Write(p.fd, b[total:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

// Close closes the port.
func (p *VPort) Close() error { return unix.Close(p.fd) }
