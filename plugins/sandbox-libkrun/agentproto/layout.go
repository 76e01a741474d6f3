package agentproto

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"
)

// The initramfs layout and the kernel command line are the other half of
// the host↔guest contract: the initramfs builder and the QEMU back end
// write them, the agent reads them.
const (
	// ModuleManifestPath lists, one per line, the kernel modules the agent
	// loads at boot, in load order (dependencies first).
	ModuleManifestPath = "/iii/modules.list"
	// ModulesDir holds the module files inside the initramfs.
	ModulesDir = "/iii/modules"
	// PortName is the name of the virtio-console port the agent serves.
	PortName = "iii.exec"
)

// Kernel command-line keys the agent understands.
const (
	ParamRoot       = "iii.root"       // block device holding the image, e.g. /dev/vda or serial:iii-root
	ParamUpper      = "iii.upper"      // block device of a persistent ext4 upper layer (worker VMs); absent: tmpfs
	ParamRootFSType = "iii.rootfstype" // erofs (default), ext4 or squashfs
	ParamUpperSize  = "iii.upper_size" // tmpfs size of the writable layer, e.g. 512m or 50%
	ParamPort       = "iii.port"       // port name, default PortName
	ParamHostname   = "iii.hostname"
	ParamDebug      = "iii.debug" // verbose agent logs on the console
)

// BootParams is what the agent takes from /proc/cmdline.
type BootParams struct {
	// Root and Upper name block devices: a path under /dev, or
	// "serial:<id>" for the virtio disk whose serial is id (the order in
	// which disks appear is not something to rely on once there are two).
	Root       string
	Upper      string
	RootFSType string
	UpperSize  string
	Port       string
	Hostname   string
	Debug      bool
}

var (
	sizeRe     = regexp.MustCompile(`^[0-9]{1,12}[kKmMgG%]?$`)
	hostnameRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)
	portRe     = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
)

// ParseBootParams reads the iii.* keys of a kernel command line and
// ignores everything else. Values may be double-quoted.
func ParseBootParams(cmdline string) (BootParams, error) {
	p := BootParams{RootFSType: "erofs", Port: PortName}
	for _, tok := range splitCmdline(cmdline) {
		key, val, _ := strings.Cut(tok, "=")
		switch key {
		case ParamRoot, ParamUpper:
			if !validDevice(val) {
				return p, fmt.Errorf("%s=%q: want a device path under /dev or serial:<id>", key, val)
			}
			if key == ParamRoot {
				p.Root = val
			} else {
				p.Upper = val
			}
		case ParamRootFSType:
			switch val {
			case "erofs", "ext4", "squashfs":
				p.RootFSType = val
			default:
				return p, fmt.Errorf("%s=%q: want erofs, ext4 or squashfs", key, val)
			}
		case ParamUpperSize:
			if !sizeRe.MatchString(val) {
				return p, fmt.Errorf("%s=%q: want a tmpfs size such as 512m or 50%%", key, val)
			}
			p.UpperSize = val
		case ParamPort:
			if !portRe.MatchString(val) {
				return p, fmt.Errorf("%s=%q: not a port name", key, val)
			}
			p.Port = val
		case ParamHostname:
			if !hostnameRe.MatchString(val) {
				return p, fmt.Errorf("%s=%q: not a host name", key, val)
			}
			p.Hostname = val
		case ParamDebug:
			p.Debug = val == "" || val == "1" || val == "true"
		}
	}
	return p, nil
}

// SerialPrefix marks a device named by its virtio serial.
const SerialPrefix = "serial:"

// serialRE is a virtio-blk serial (at most 20 bytes).
var serialRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,20}$`)

func validDevice(val string) bool {
	if id, ok := strings.CutPrefix(val, SerialPrefix); ok {
		return serialRE.MatchString(id)
	}
	clean := path.Clean(val)
	return strings.HasPrefix(clean, "/dev/") && clean == val
}

// splitCmdline splits on spaces outside double quotes and drops the quotes,
// as the kernel does.
func splitCmdline(s string) []string {
	var out []string
	var cur strings.Builder
	inQuote, have := false, false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote = !inQuote
			have = true
		case (r == ' ' || r == '\t' || r == '\n') && !inQuote:
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
}

// ModuleCompressed reports whether a module file is compressed, so the
// agent asks the kernel to decompress it (MODULE_INIT_COMPRESSED_FILE).
func ModuleCompressed(p string) bool {
	return strings.HasSuffix(p, ".ko.xz") || strings.HasSuffix(p, ".ko.zst") || strings.HasSuffix(p, ".ko.gz")
}

// FormatModuleManifest renders the module list.
func FormatModuleManifest(paths []string) string {
	var b strings.Builder
	b.WriteString("# kernel modules in load order, written by the initramfs builder\n")
	for _, p := range paths {
		b.WriteString(p)
		b.WriteByte('\n')
	}
	return b.String()
}

// ParseModuleManifest reads the module list: absolute paths under
// ModulesDir, one per line; blank lines and # comments are ignored.
func ParseModuleManifest(s string) ([]string, error) {
	var out []string
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if path.Clean(line) != line || !strings.HasPrefix(line, ModulesDir+"/") {
			return nil, fmt.Errorf("module manifest line %d: %q is not a clean path under %s", i+1, line, ModulesDir)
		}
		if !strings.HasSuffix(line, ".ko") && !ModuleCompressed(line) {
			return nil, fmt.Errorf("module manifest line %d: %q is not a kernel module", i+1, line)
		}
		out = append(out, line)
	}
	if len(out) > 4096 {
		return nil, errors.New("module manifest: more than 4096 modules")
	}
	return out, nil
}
