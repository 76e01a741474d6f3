package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentclient"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
)

func TestMain(m *testing.M) {
	code := m.Run()
	cleanupKit()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func TestArgsGolden(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"amd64-tcg-minimal", Config{Arch: "amd64", Accel: AccelTCG, Kernel: "/boot/vmlinuz", Initrd: "/c/initrd.cpio",
			StateDir: "/run/iii/vm1", TSCKHz: 2596108}},
		{"amd64-kvm-disk-net", Config{Arch: "amd64", Accel: AccelKVM, MemoryMiB: 1024, CPUs: 2, Kernel: "/boot/vmlinuz",
			Initrd: "/c/initrd.cpio", RootDisk: "/c/python.erofs", UpperSize: "50%", Network: true, StateDir: "/run/iii/vm2",
			TSCKHz: 2100000, ExtraAppend: []string{"iii.hostname=sb1"}}},
		{"arm64-hvf", Config{Arch: "arm64", Accel: AccelHVF, Kernel: "/k/Image", Initrd: "/c/initrd.cpio",
			RootDisk: "/c/node.img", RootFSType: "ext4", StateDir: "/tmp/vm3", Debug: true}},
		{"arm64-tcg-nosandbox", Config{Arch: "arm64", Accel: AccelTCG, Kernel: "/k/Image", Initrd: "/c/i.cpio",
			StateDir: "/tmp/vm4", TBSizeMiB: 32, NoSandbox: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args, err := tc.cfg.Args()
			assert.NilError(t, err)
			golden.Assert(t, strings.Join(args, "\n")+"\n", tc.name+".args")
		})
	}
}

func TestArgsNetworkOffHasNoNetdev(t *testing.T) {
	cfg := Config{Arch: "amd64", Accel: AccelTCG, Kernel: "k", Initrd: "i", StateDir: "/s", TSCKHz: 1}
	args, err := cfg.Args()
	assert.NilError(t, err)
	joined := strings.Join(args, " ")
	assert.Assert(t, !strings.Contains(joined, "netdev"), joined)
	assert.Assert(t, !strings.Contains(joined, "restrict"), joined)
	cfg.Network = true
	args, err = cfg.Args()
	assert.NilError(t, err)
	joined = strings.Join(args, " ")
	assert.Assert(t, strings.Contains(joined, "-netdev socket,id=net0,fd=3 -device virtio-net-device,netdev=net0"), joined)
	// Never QEMU's user network: it maps the gateway to the host's loopback.
	assert.Assert(t, !strings.Contains(joined, "user,"), joined)
}

func TestConfigValidation(t *testing.T) {
	base := Config{Arch: "amd64", Accel: AccelTCG, Kernel: "k", Initrd: "i", StateDir: "/s"}
	tests := []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"accel", func(c *Config) { c.Accel = "xen" }, "use kvm, hvf or tcg"},
		{"hvf on amd64", func(c *Config) { c.Accel = AccelHVF }, "arm64"},
		{"no kernel", func(c *Config) { c.Kernel = "" }, "kernel and initrd"},
		{"no state", func(c *Config) { c.StateDir = "" }, "state dir"},
		{"long state", func(c *Config) { c.StateDir = "/" + strings.Repeat("x", 120) }, "too long"},
		{"arch", func(c *Config) { c.Arch = "riscv64" }, "not supported"},
		{"fstype", func(c *Config) { c.RootFSType = "nfs" }, "erofs, ext4 or squashfs"},
		{"upper", func(c *Config) { c.UpperSize = "huge" }, "tmpfs size"},
		{"append", func(c *Config) { c.ExtraAppend = []string{"a b"} }, "spaces"},
		{"comma", func(c *Config) { c.RootDisk = "/a,b" }, "comma"},
		{"negative", func(c *Config) { c.MemoryMiB = -1 }, "negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.mutate(&c)
			_, err := c.Args()
			var qe *Error
			assert.Assert(t, errors.As(err, &qe), "%v", err)
			assert.Equal(t, qe.Code, CodeBadConfig)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func TestParseCPUInfoKHz(t *testing.T) {
	tests := []struct {
		in   string
		want int
		err  bool
	}{
		{"processor\t: 0\ncpu MHz\t\t: 2596.108\nflags : x\ncpu MHz : 1.0\n", 2596108, false},
		{"cpu MHz : 2100.000", 2100000, false},
		{"cpu MHz : fast", 0, true},
		{"cpu MHz : -5", 0, true},
		{"BogoMIPS : 50.00", 0, true},
	}
	for _, tc := range tests {
		got, err := ParseCPUInfoKHz(tc.in)
		assert.Equal(t, err != nil, tc.err, tc.in)
		assert.Equal(t, got, tc.want)
	}
}

func FuzzParseCPUInfoKHz(f *testing.F) {
	f.Add("cpu MHz\t\t: 2596.108\n")
	f.Fuzz(func(t *testing.T, s string) {
		if v, err := ParseCPUInfoKHz(s); err == nil && (v <= 0 || v > 100000000) {
			t.Fatalf("%d kHz accepted", v)
		}
	})
}

func TestFindKernel(t *testing.T) {
	boot, mods := t.TempDir(), t.TempDir()
	mk := func(ver string, withModules bool) {
		assert.NilError(t, os.WriteFile(filepath.Join(boot, "vmlinuz-"+ver), []byte("k"), 0o644))
		if withModules {
			assert.NilError(t, os.MkdirAll(filepath.Join(mods, ver), 0o755))
			assert.NilError(t, os.WriteFile(filepath.Join(mods, ver, "modules.dep"), nil, 0o644))
		}
	}
	_, err := FindKernel(boot, mods, "amd64")
	assert.ErrorContains(t, err, "linux-image-cloud-amd64")

	mk("6.1.0-9-amd64", true)
	mk("6.1.0-57-cloud-amd64", true)
	mk("6.1.0-10-cloud-amd64", true)
	mk("6.12.0-1-cloud-amd64", false) // no modules: skipped
	assert.NilError(t, os.WriteFile(filepath.Join(boot, "config-6.1.0-57-cloud-amd64"), nil, 0o644))
	k, err := FindKernel(boot, mods, "amd64")
	assert.NilError(t, err)
	assert.Equal(t, k.Version, "6.1.0-57-cloud-amd64")
	assert.Equal(t, k.ModulesDir, filepath.Join(mods, "6.1.0-57-cloud-amd64"))
	assert.Equal(t, k.Config, filepath.Join(boot, "config-6.1.0-57-cloud-amd64"))

	assert.Assert(t, compareVersions("6.1.0-57", "6.1.0-9") > 0)
	assert.Assert(t, compareVersions("6.12.0", "6.1.0") > 0)
	assert.Equal(t, compareVersions("6.1.0", "6.1.0"), 0)
}

func TestTailFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	assert.NilError(t, os.WriteFile(p, []byte("a\nb\nc\nd\n"), 0o644))
	assert.Equal(t, tailFile(p, 2), "c\nd")
	assert.Equal(t, tailFile(p, 10), "a\nb\nc\nd")
	assert.Equal(t, tailFile(filepath.Join(t.TempDir(), "none"), 3), "")
}

// TestLaunchFailureCarriesStderr starts a real QEMU with a kernel that does
// not exist: the error must carry QEMU's own complaint.
func TestLaunchFailureCarriesStderr(t *testing.T) {
	cfg := Config{Accel: AccelTCG, Kernel: "/nonexistent/vmlinuz", Initrd: "/nonexistent/initrd", StateDir: t.TempDir(), TSCKHz: 1}
	if _, err := cfg.Binary(); err != nil {
		t.Skipf("QEMU not installed: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// QEMU creates the socket before it loads the kernel, so the failure
	// shows either in Launch or when connecting.
	vm, err := Launch(ctx, cfg)
	if err == nil {
		defer vm.Kill()
		_, err = vm.Connect(ctx, agentclient.Options{})
	}
	var qe *Error
	assert.Assert(t, errors.As(err, &qe), "%v", err)
	assert.Assert(t, qe.Code == CodeStartFailed || qe.Code == CodeExited, qe.Code)
	assert.Assert(t, strings.Contains(qe.StderrTail, "/nonexistent/vmlinuz"), qe.StderrTail)
}

// TestConfigForTranslationBuffer: a worker VM (one with a data disk) gets
// the larger TCG translation buffer; a sandbox keeps the default.
func TestConfigForTranslationBuffer(t *testing.T) {
	tests := []struct {
		name string
		spec backend.Spec
		want string
	}{
		{name: "sandbox", spec: backend.Spec{ID: "s", Accel: AccelTCG, Kernel: "/k", Initrd: "/i", RootDisk: "/r", StateDir: "/tmp/s"}, want: "tcg,tb-size=64"},
		{name: "worker VM", spec: backend.Spec{ID: "w", Accel: AccelTCG, Kernel: "/k", Initrd: "/i", RootDisk: "/r", DataDisk: "/d", StateDir: "/tmp/w"}, want: fmt.Sprintf("tcg,tb-size=%d", WorkerTBSizeMiB)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ConfigFor(tc.spec)
			cfg.TSCKHz = 1 // no /proc/cpuinfo read
			args, err := cfg.Args()
			assert.NilError(t, err)
			assert.Assert(t, strings.Contains(strings.Join(args, " "), "-accel "+tc.want), "args: %v", args)
		})
	}
}
