package qemu

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Kernel is a guest kernel on the host: the image QEMU boots and the module
// tree the initramfs builder packs from.
type Kernel struct {
	Path       string // /boot/vmlinuz-<version>
	Version    string
	ModulesDir string // /lib/modules/<version>
	Config     string // /boot/config-<version>, "" when absent
	// Boot is the ELF vmlinux unpacked from Path (package vmlinux) when the
	// kernel has a PVH entry point; "" boots Path itself.
	Boot string
}

// BootImage is the file a VM boots: the unpacked vmlinux when there is one
// (QEMU maps it instead of copying a bzImage into its heap, and the guest
// skips its decompressor), else the installed image.
func (k Kernel) BootImage() string {
	if k.Boot != "" {
		return k.Boot
	}
	return k.Path
}

// FindKernel picks the newest installed kernel that has its modules next to
// it, preferring Debian's cloud flavour on amd64 (it boots fastest). boot
// and modules are normally "/boot" and "/lib/modules".
func FindKernel(boot, modules, arch string) (*Kernel, error) {
	images, _ := filepath.Glob(filepath.Join(boot, "vmlinuz-*"))
	var found []Kernel
	for _, img := range images {
		ver := strings.TrimPrefix(filepath.Base(img), "vmlinuz-")
		k := Kernel{Path: img, Version: ver, ModulesDir: filepath.Join(modules, ver)}
		if _, err := os.Stat(filepath.Join(k.ModulesDir, "modules.dep")); err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(boot, "config-"+ver)); err == nil {
			k.Config = filepath.Join(boot, "config-"+ver)
		}
		found = append(found, k)
	}
	if len(found) == 0 {
		pkg := "linux-image-cloud-amd64"
		if arch == "arm64" {
			pkg = "linux-image-arm64"
		}
		return nil, &Error{Code: CodeKernel, Message: fmt.Sprintf("no kernel with modules under %s and %s: install %s (scripts/setup-vm.sh does)", boot, modules, pkg)}
	}
	sort.SliceStable(found, func(i, j int) bool {
		ci, cj := strings.Contains(found[i].Version, "-cloud-"), strings.Contains(found[j].Version, "-cloud-")
		if ci != cj && arch == "amd64" {
			return ci
		}
		return compareVersions(found[i].Version, found[j].Version) > 0
	})
	k := found[0]
	f, err := os.Open(k.Path)
	if err != nil {
		return nil, &Error{Code: CodeKernel, Message: fmt.Sprintf("kernel %s is not readable by this user (%v); some distributions install it mode 0600", k.Path, err)}
	}
	_ = f.Close()
	return &k, nil
}

// compareVersions orders kernel release strings by their numeric parts.
func compareVersions(a, b string) int {
	pa, pb := versionParts(a), versionParts(b)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		if pa[i] != pb[i] {
			if pa[i] > pb[i] {
				return 1
			}
			return -1
		}
	}
	return len(pa) - len(pb)
}

func versionParts(v string) []int {
	var out []int
	for _, f := range strings.FieldsFunc(v, func(r rune) bool { return r < '0' || r > '9' }) {
		n, err := strconv.Atoi(f)
		if err != nil {
			n = 0
		}
		out = append(out, n)
	}
	return out
}
