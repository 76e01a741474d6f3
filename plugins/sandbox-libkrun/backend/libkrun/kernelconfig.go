//go:build linux || darwin

package libkrun

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
)

// KernelConfig is a parsed kernel .config (/boot/config-<release>): option
// name without the CONFIG_ prefix -> "y", "m" or the quoted value; options
// that are "not set" are absent.
type KernelConfig map[string]string

// ParseKernelConfig reads a kernel .config. Lines it does not understand
// are skipped: the file format has only comments and NAME=VALUE lines.
func ParseKernelConfig(r io.Reader) (KernelConfig, error) {
	c := KernelConfig{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(k, "CONFIG_") || len(k) == len("CONFIG_") {
			continue
		}
		if v == "n" {
			continue
		}
		c[strings.TrimPrefix(k, "CONFIG_")] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("kernel config: %w", err)
	}
	return c, nil
}

func (c KernelConfig) has(opt string) bool { v := c[opt]; return v == "y" || v == "m" }

// CheckForLibkrun says whether a kernel with this configuration can run
// the guest agent under libkrun. The one that bites: on x86_64 libkrun
// announces its virtio-mmio devices only on the kernel command line
// (virtio_mmio.device=...), which a kernel reads only with
// VIRTIO_MMIO_CMDLINE_DEVICES=y; Debian's kernels (cloud and generic)
// leave it unset, so the agent would never find its port. QEMU's microvm
// describes the same devices in ACPI, which is why those kernels work
// there. On aarch64 libkrun uses the device tree, which every kernel reads.
func (c KernelConfig) CheckForLibkrun(arch string, rootDisk, network bool) error {
	var missing []string
	need := func(opt, why string) {
		if !c.has(opt) {
			missing = append(missing, "CONFIG_"+opt+" ("+why+")")
		}
	}
	need("VIRTIO_MMIO", "libkrun's devices are virtio-mmio")
	if arch == "amd64" && c["VIRTIO_MMIO_CMDLINE_DEVICES"] != "y" {
		missing = append(missing, "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y (on x86_64 libkrun lists its devices only on the kernel command line)")
	}
	need("VIRTIO_CONSOLE", "the iii.exec port")
	if rootDisk {
		need("VIRTIO_BLK", "the root image")
	}
	if network {
		need("VIRTIO_NET", "the NIC")
	}
	if len(missing) == 0 {
		return nil
	}
	return &Error{Code: CodeBadSpec, Message: "the guest kernel lacks " + strings.Join(missing, ", ") +
		": use a kernel built with them, or use hypervisor: qemu"}
}

// CheckKernelConfigFile is ParseKernelConfig + CheckForLibkrun on a file.
func CheckKernelConfigFile(path, arch string, rootDisk, network bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	c, err := ParseKernelConfig(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := c.CheckForLibkrun(arch, rootDisk, network); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
