package boot

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/initramfs"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/vmlinux"
)

// AgentName is the guest agent's file name for a guest architecture, as
// `make build` puts it beside the adapter and releases ship it in
// ~/.iii/lib.
func AgentName(arch string) string { return "iii-guest-agent-linux-" + arch }

// agentCandidates lists where the guest agent is looked for, in order:
// agent_path, beside the adapter binary, ~/.iii/lib.
func agentCandidates(cfg *config.Config, exe, home, arch string) []string {
	if cfg.AgentPath != "" {
		return []string{cfg.AgentPath}
	}
	var out []string
	if exe != "" {
		out = append(out, filepath.Join(filepath.Dir(exe), AgentName(arch)))
	}
	if home != "" {
		out = append(out, filepath.Join(home, ".iii", "lib", AgentName(arch)))
	}
	return out
}

// findAgent returns the first candidate that is a Linux executable for
// arch; S300 naming every place it looked and how to get one otherwise.
func findAgent(candidates []string, arch string) (string, error) {
	var why []string
	for _, p := range candidates {
		err := checkAgentBinary(p, arch)
		if err == nil {
			return p, nil
		}
		why = append(why, err.Error())
	}
	return "", contract.NewError(contract.S300,
		"the guest agent %s was not found (%s); build it with `CGO_ENABLED=0 GOOS=linux GOARCH=%s go build -o bin/%s ./plugins/sandbox-libkrun/cmd/iii-guest-agent` (make build does) and put it beside the adapter or in ~/.iii/lib, or set agent_path",
		AgentName(arch), strings.Join(why, "; "), arch, AgentName(arch))
}

// checkAgentBinary opens p and checks its ELF header: a wrong file would
// only show as a guest kernel panic ("init failed") deep in a console log.
func checkAgentBinary(p, arch string) error {
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s: not there", p)
		}
		return fmt.Errorf("%s: %v", p, err)
	}
	defer f.Close()
	var head [20]byte
	if _, err := io.ReadFull(f, head[:]); err != nil {
		return fmt.Errorf("%s: not an ELF executable", p)
	}
	got, err := ELFArch(head[:])
	if err != nil {
		return fmt.Errorf("%s: %v", p, err)
	}
	if got != arch {
		return fmt.Errorf("%s: built for linux/%s, the guest needs linux/%s", p, got, arch)
	}
	return nil
}

// ELFArch reads the architecture (GOARCH spelling) from the first 20 bytes
// of a 64-bit little-endian ELF executable.
func ELFArch(head []byte) (string, error) {
	if len(head) < 20 || string(head[:4]) != "\x7fELF" {
		return "", errors.New("not an ELF executable")
	}
	if head[4] != 2 || head[5] != 1 {
		return "", errors.New("not a 64-bit little-endian ELF executable")
	}
	if t := binary.LittleEndian.Uint16(head[16:]); t != 2 && t != 3 {
		return "", fmt.Errorf("ELF type %d is not an executable", t)
	}
	switch m := binary.LittleEndian.Uint16(head[18:]); m {
	case 62:
		return "amd64", nil
	case 183:
		return "arm64", nil
	default:
		return "", fmt.Errorf("ELF machine %d is neither x86-64 nor aarch64", m)
	}
}

// findKernel resolves the guest kernel: the configured one (its modules
// from /lib/modules/<version> when its name says the version and they are
// there), else the newest installed kernel with modules.
func findKernel(cfg *config.Config, arch string) (*qemu.Kernel, error) {
	if cfg.Kernel == "" {
		k, err := qemu.FindKernel("/boot", "/lib/modules", arch)
		if err != nil {
			return nil, contract.NewError(contract.S300, "no guest kernel: %v; or set kernel: to a kernel image", err)
		}
		return k, nil
	}
	f, err := os.Open(cfg.Kernel)
	if err != nil {
		return nil, contract.NewError(contract.S300, "kernel %s cannot be read: %v; fix kernel: in the adapter's configuration", cfg.Kernel, err)
	}
	_ = f.Close()
	k := &qemu.Kernel{Path: cfg.Kernel}
	if ver, ok := strings.CutPrefix(filepath.Base(cfg.Kernel), "vmlinuz-"); ok && ver != "" {
		k.Version = ver
		mods := filepath.Join("/lib/modules", ver)
		if _, err := os.Stat(filepath.Join(mods, "modules.dep")); err == nil {
			k.ModulesDir = mods
		}
		if c := filepath.Join(filepath.Dir(cfg.Kernel), "config-"+ver); FileExists(c) {
			k.Config = c
		}
	}
	return k, nil
}

func FileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// unpackKernel returns the ELF vmlinux inside the bzImage at path (cached
// under the cache's kernel/ directory) when it has a PVH entry point, so
// VMs boot it directly; "" (boot the bzImage) otherwise. Failing to unpack
// costs memory, not correctness, so it is logged, not returned.
func unpackKernel(ctx context.Context, p Host, path string) string {
	boot, info, err := vmlinux.Extract(ctx, path, filepath.Join(p.Config().CacheDir, "kernel"))
	switch {
	case err != nil:
		p.Log().Info("booting the kernel image as it is: its vmlinux could not be unpacked", "kernel", path, "reason", err)
		return ""
	case !info.PVH:
		p.Log().Info("booting the kernel image as it is: the kernel has no PVH entry point (CONFIG_PVH)", "kernel", path)
		return ""
	case boot == path:
		return ""
	}
	return boot
}

// buildInitramfs packs the agent and the kernel's modules, reusing a cached
// archive with the same inputs.
func buildInitramfs(ctx context.Context, k *qemu.Kernel, agent, cacheDir string) (string, error) {
	p, err := initramfs.Build(ctx, initramfs.Options{
		AgentPath:    agent,
		ModulesDir:   k.ModulesDir,
		KernelConfig: k.Config,
		CacheDir:     filepath.Join(cacheDir, "initramfs"),
	})
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", contract.NewError(contract.S300, "build the VM's initramfs: %v", err)
	}
	return p, nil
}
