//go:build linux || darwin

package libkrun

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// CmdlineMax is libkrun's kernel command line limit per guest architecture
// (CMDLINE_MAX_SIZE in src/arch/src/*/layout.rs). The limit covers what
// libkrun appends too; see cmdlineReserve.
func CmdlineMax(arch string) int {
	if arch == "arm64" {
		return 2048
	}
	return 64 << 10
}

// cmdlineReserve is room kept for what libkrun appends to our command
// line: on x86_64 one virtio_mmio.device=SIZE@ADDR:IRQ per device (about
// 40 bytes each: console, block, net, rng, balloon), on aarch64 an
// earlycon= for the serial console, and " -- " on both.
func cmdlineReserve(arch string) int {
	if arch == "arm64" {
		return 128
	}
	return 1024
}

// KernelConsole is the serial console device the kernel logs to under
// libkrun: the 8250 UART at 0x3f8 on x86_64, the PL011 on aarch64.
func KernelConsole(arch string) string {
	if arch == "arm64" {
		return "ttyAMA0"
	}
	return "ttyS0"
}

// CmdlineOptions is what BuildCmdline puts on the kernel command line.
type CmdlineOptions struct {
	Arch       string // GOARCH of the guest
	RootDisk   bool   // the image is attached as /dev/vda
	DataDisk   bool   // a persistent upper disk follows it (block id iii-upper)
	RootFSType string // erofs (default), ext4 or squashfs
	UpperSize  string // tmpfs size of the writable layer
	Hostname   string
	Debug      bool
	Extra      []string
}

// BuildCmdline returns the guest kernel command line for a libkrun VM,
// with the same iii.* keys the QEMU back end passes, so the agent boots
// the same way under both. reboot=k and panic=-1 make a guest reboot or
// panic end the VMM: libkrun has no ACPI on x86_64, so a guest power-off
// has nothing to act on, while a keyboard-controller reset makes libkrun
// exit (its own init ends VMs by rebooting).
func BuildCmdline(o CmdlineOptions) (string, error) {
	args := []string{"console=" + KernelConsole(o.Arch), "reboot=k", "panic=-1"}
	if o.Arch == "amd64" {
		// libkrun's own default line turns KVM async page faults off.
		args = append(args, "no-kvmapf")
	}
	if o.Debug {
		args = append(args, agentproto.ParamDebug+"=1")
	} else {
		args = append(args, "quiet")
	}
	if o.RootDisk {
		fstype := o.RootFSType
		if fstype == "" {
			fstype = "erofs"
		}
		if o.DataDisk {
			// Two disks: name each by its block id, which libkrun
			// gives the guest as the disk's serial.
			args = append(args, agentproto.ParamRoot+"="+agentproto.SerialPrefix+rootBlockID,
				agentproto.ParamUpper+"="+agentproto.SerialPrefix+dataBlockID, agentproto.ParamRootFSType+"="+fstype)
		} else {
			args = append(args, agentproto.ParamRoot+"=/dev/vda", agentproto.ParamRootFSType+"="+fstype)
		}
		if o.UpperSize != "" && !o.DataDisk {
			args = append(args, agentproto.ParamUpperSize+"="+o.UpperSize)
		}
	}
	if o.Hostname != "" {
		args = append(args, agentproto.ParamHostname+"="+o.Hostname)
	}
	for _, a := range o.Extra {
		if a == "" || strings.ContainsAny(a, " \t\n\"") {
			return "", &Error{Code: CodeBadSpec, Message: fmt.Sprintf("kernel argument %q is empty or holds spaces or quotes", a)}
		}
	}
	args = append(args, o.Extra...)
	line := strings.Join(args, " ")
	// The agent parses the same line at boot: refuse here what it would
	// refuse there, where the error is visible.
	if _, err := agentproto.ParseBootParams(line); err != nil {
		return "", &Error{Code: CodeBadSpec, Message: fmt.Sprintf("kernel command line: %v", err)}
	}
	return line, nil
}

// checkEnv validates the guest environment. krun_set_env puts each entry on
// the kernel command line as "KEY=VALUE" (quoted), and the kernel hands the
// unknown KEY=VALUE words to init as its environment: a quote or a control
// character would break the line, and a dot in the key makes the kernel
// read it as a module parameter instead.
func checkEnv(env []string) error {
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("environment entry %q is not KEY=VALUE", kv)
		}
		for i, r := range k {
			if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
				return fmt.Errorf("environment key %q: use letters, digits and _ (not starting with a digit)", k)
			}
		}
		if !utf8.ValidString(v) {
			return fmt.Errorf("environment value of %s is not UTF-8", k)
		}
		for _, r := range v {
			if r == '"' || r < 0x20 || r == 0x7f {
				return fmt.Errorf("environment value of %s holds a quote or a control character, which the kernel command line cannot carry", k)
			}
		}
	}
	return nil
}

// cmdlineSize is how many bytes libkrun's final command line takes for our
// line and environment, before its own additions.
func cmdlineSize(cmdline string, env []string) int {
	n := len(cmdline)
	for _, kv := range env {
		n += len(kv) + 3 // ` "KEY=VALUE"`
	}
	return n
}
