//go:build linux || darwin

package libkrun

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/usernet"
)

// vmFiles makes a kernel, initramfs and image for a spec; their content
// does not matter to the fake.
func vmFiles(t *testing.T) (dir, kernel, initrd, image string) {
	t.Helper()
	dir = t.TempDir()
	kernel, initrd, image = filepath.Join(dir, "vmlinux"), filepath.Join(dir, "initrd.cpio"), filepath.Join(dir, "root.erofs")
	for _, p := range []string{kernel, initrd, image} {
		assert.NilError(t, os.WriteFile(p, []byte("x"), 0o600))
	}
	return dir, kernel, initrd, image
}

// serveNIC returns an OnNetwork that serves the NIC's host end with the
// runner's user-mode network, as the runner does; the network ends with
// the test.
func serveNIC(t *testing.T) func(*os.File) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	return func(h *os.File) error {
		conn, err := net.FileConn(h)
		_ = h.Close()
		if err != nil {
			return err
		}
		n, err := usernet.New(usernet.Config{DNSServers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}})
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.Check(t, n.Serve(ctx, conn))
		}()
		return nil
	}
}

func closeNIC(h *os.File) error { return h.Close() }

// bootSpec is a spec for the host's architecture; the fake does not care,
// but validation checks the kernel format against it. Its KVM device is a
// plain file beside the kernel that opens read-write, so the fake boots the
// same on hosts with a usable /dev/kvm, a nested one or none at all.
func bootSpec(kernel string) Spec {
	dev := filepath.Join(filepath.Dir(kernel), "kvm")
	if err := os.WriteFile(dev, nil, 0o600); err != nil {
		panic(err) // the temporary directory vmFiles made is gone
	}
	return Spec{Kernel: kernel, KernelFormat: KernelELF, arch: "amd64", kvmDevice: dev}
}

func expectStart(t *testing.T, err error, errno syscall.Errno) {
	t.Helper()
	var e *Error
	assert.Assert(t, errors.As(err, &e), "%v", err)
	assert.Equal(t, e.Code, CodeStart)
	assert.Equal(t, e.Call, "krun_start_enter")
	assert.Equal(t, e.Errno, errno)
}

func TestBootSequence(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the golden sequences are written on Linux")
	}
	tests := []struct {
		name string
		edit func(s *Spec, dir, initrd, image string)
	}{
		{"minimal", func(s *Spec, dir, initrd, image string) {
			s.Cmdline = "console=ttyS0 quiet"
		}},
		{"full", func(s *Spec, dir, initrd, image string) {
			s.VCPUs, s.MemoryMiB = 2, 1024
			s.Initramfs, s.RootDisk = initrd, image
			s.Cmdline, _ = BuildCmdline(CmdlineOptions{Arch: "amd64", RootDisk: true, Hostname: "sb-1"})
			s.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "GREETING=hello world"}
			s.Network = true
			s.OnNetwork = serveNIC(t)
			s.MAC = net.HardwareAddr{0x5a, 0x94, 0xef, 0x01, 0x02, 0x03}
			s.ConsoleLog = filepath.Join(dir, "console.log")
			s.Verbosity = "debug"
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := openFake(t, -22, false)
			dir, kernel, initrd, image := vmFiles(t)
			spec := bootSpec(kernel)
			var host *os.File
			spec.OnChannel = func(h *os.File) error { host = h; return nil }
			tc.edit(&spec, dir, initrd, image)

			err := f.lib.Boot(context.Background(), spec)
			expectStart(t, err, syscall.EINVAL)

			golden.Assert(t, f.calls(t, dir, "$DIR"), "boot-"+tc.name+".golden")

			// The host end of iii.exec is the other end of the socket the
			// guest port was given: the fake wrote into the guest end.
			assert.Assert(t, host != nil)
			defer host.Close()
			line, err := bufio.NewReader(host).ReadString('\n')
			assert.NilError(t, err)
			assert.Equal(t, line, "hello from the guest port\n")

			if spec.ConsoleLog != "" {
				b, err := os.ReadFile(spec.ConsoleLog)
				assert.NilError(t, err)
				assert.Equal(t, string(b), "kernel console line\n")
			}
		})
	}
}

func TestBootFallsBackOnOlderSymbols(t *testing.T) {
	// A 1.17.0-like library: no krun_init_log is unusual, but krun_add_disk2
	// missing with krun_add_disk present happens on builds that trimmed it;
	// both alternatives must be used.
	f := openFake(t, -22, false, "krun_init_log", "krun_add_disk2", "krun_get_shutdown_eventfd")
	_, kernel, _, image := vmFiles(t)
	spec := bootSpec(kernel)
	spec.RootDisk = image
	spec.Cmdline = "console=ttyS0"
	spec.OnChannel = func(h *os.File) error { return h.Close() }
	expectStart(t, f.lib.Boot(context.Background(), spec), syscall.EINVAL)
	calls := f.calls(t)
	assert.Check(t, is.Contains(calls, "krun_set_log_level(2)\n"))
	assert.Check(t, is.Contains(calls, `krun_add_disk(7, "vda", "`+image+`", true)`))
	assert.Check(t, !strings.Contains(calls, "krun_get_shutdown_eventfd"))
}

func TestBootRefusesOldLibraryBeforeAnyCall(t *testing.T) {
	f := openFake(t, -22, false, "krun_add_console_port_inout")
	_, kernel, _, _ := vmFiles(t)
	spec := bootSpec(kernel)
	spec.OnChannel = func(h *os.File) error { t.Fatal("must not be called"); return nil }
	err := f.lib.Boot(context.Background(), spec)
	var e *Error
	assert.Assert(t, errors.As(err, &e))
	assert.Equal(t, e.Code, CodeTooOld)
	assert.Check(t, is.Contains(err.Error(), "krun_add_console_port_inout (added in libkrun 1.17.0)"))
	assert.Equal(t, f.calls(t), "")
}

func TestBootNeedsNetAndBlockSymbolsOnlyWhenUsed(t *testing.T) {
	f := openFake(t, -22, false, "krun_add_net_unixstream", "krun_add_disk", "krun_add_disk2")
	_, kernel, _, image := vmFiles(t)
	spec := bootSpec(kernel)
	spec.OnChannel = func(h *os.File) error { return h.Close() }
	expectStart(t, f.lib.Boot(context.Background(), spec), syscall.EINVAL)

	spec.RootDisk = image
	err := f.lib.Boot(context.Background(), spec)
	assert.Check(t, is.ErrorContains(err, "krun_add_disk2 (libkrun built without BLK=1"))
	spec.RootDisk, spec.Network, spec.OnNetwork = "", true, closeNIC
	err = f.lib.Boot(context.Background(), spec)
	assert.Check(t, is.ErrorContains(err, "krun_add_net_unixstream (libkrun built without NET=1"))
}

func TestBootConfigErrorNamesCallAndFreesContext(t *testing.T) {
	f := openFake(t, -22, false)
	_, kernel, _, _ := vmFiles(t)
	spec := bootSpec(kernel)
	spec.MemoryMiB = 4242 // the fake's krun_set_vm_config fails with ENOMEM
	spec.Network, spec.OnNetwork = true, closeNIC
	called := false
	spec.OnChannel = func(h *os.File) error { called = true; return h.Close() }
	err := f.lib.Boot(context.Background(), spec)
	var e *Error
	assert.Assert(t, errors.As(err, &e))
	assert.Equal(t, e.Code, CodeConfig)
	assert.Equal(t, e.Call, "krun_set_vm_config")
	assert.Equal(t, e.Errno, syscall.ENOMEM)
	assert.Check(t, is.Contains(err.Error(), "krun_set_vm_config returned -ENOMEM"))
	assert.Assert(t, !called)
	calls := f.calls(t)
	assert.Check(t, strings.HasSuffix(calls, "krun_set_vm_config(7, 1, 4242)\nkrun_free_ctx(7)\n"), calls)
}

func TestBootOnChannelErrorAborts(t *testing.T) {
	f := openFake(t, -22, false)
	_, kernel, _, _ := vmFiles(t)
	spec := bootSpec(kernel)
	spec.Network, spec.OnNetwork = true, closeNIC
	spec.OnChannel = func(h *os.File) error { h.Close(); return errors.New("relay socket busy") }
	err := f.lib.Boot(context.Background(), spec)
	assert.ErrorContains(t, err, "relay socket busy")
	calls := f.calls(t)
	assert.Check(t, strings.HasSuffix(calls, "krun_free_ctx(7)\n"), calls)
	assert.Check(t, !strings.Contains(calls, "krun_start_enter"))
}

func TestBootCanceledContextStopsBeforeStart(t *testing.T) {
	f := openFake(t, -22, false)
	_, kernel, _, _ := vmFiles(t)
	spec := bootSpec(kernel)
	spec.OnChannel = func(h *os.File) error { return h.Close() }
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := f.lib.Boot(ctx, spec)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, f.calls(t), "")
}

func TestBootShutdownEventfdOnCancel(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the fake's eventfd is Linux's")
	}
	f := openFake(t, -22, true)
	_, kernel, _, _ := vmFiles(t)
	spec := bootSpec(kernel)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan struct{})
	spec.OnChannel = func(h *os.File) error {
		// Cancel once the VM is entered: the fake logs the call, then
		// blocks reading the eventfd.
		go func() {
			defer close(started)
			defer cancel()
			for i := 0; i < 1000; i++ {
				b, _ := os.ReadFile(f.log)
				if strings.Contains(string(b), "krun_start_enter(7)") {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
		return h.Close()
	}
	err := f.lib.Boot(ctx, spec)
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the watcher that cancels once krun_start_enter is logged never finished")
	}
	expectStart(t, err, syscall.EINTR)
	assert.Check(t, is.Contains(f.calls(t), "krun_start_enter(7)\nshutdown requested (1)\n"))
}

func TestBootNoKVM(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/dev/kvm is Linux's")
	}
	f := openFake(t, -22, false)
	_, kernel, _, _ := vmFiles(t)
	spec := bootSpec(kernel)
	spec.kvmDevice = filepath.Join(t.TempDir(), "no-kvm-here")
	spec.OnChannel = func(h *os.File) error { return h.Close() }
	err := f.lib.Boot(context.Background(), spec)
	var e *Error
	assert.Assert(t, errors.As(err, &e))
	assert.Equal(t, e.Code, CodeNoKVM)
	assert.Check(t, is.Contains(err.Error(), "modprobe kvm_intel or kvm_amd"))
	assert.Check(t, is.Contains(err.Error(), "hypervisor: qemu"))
	assert.Equal(t, f.calls(t), "")
}

func TestBootNICHandOver(t *testing.T) {
	f := openFake(t, -22, false)
	_, kernel, _, _ := vmFiles(t)
	spec := bootSpec(kernel)
	spec.Network = true
	spec.OnChannel = closeNIC
	spec.OnNetwork = func(h *os.File) error { h.Close(); return errors.New("no network for you") }
	err := f.lib.Boot(context.Background(), spec)
	assert.ErrorContains(t, err, "hand over the NIC: no network for you")
	calls := f.calls(t)
	assert.Check(t, strings.HasSuffix(calls, "krun_free_ctx(7)\n"), calls)
	assert.Check(t, !strings.Contains(calls, "krun_start_enter"))
}

func TestSpecValidation(t *testing.T) {
	_, kernel, initrd, _ := vmFiles(t)
	ok := func(h *os.File) error { return nil }
	tests := []struct {
		name string
		edit func(s *Spec)
		want string
	}{
		{"no kernel", func(s *Spec) { s.Kernel = "" }, "kernel is required"},
		{"missing kernel", func(s *Spec) { s.Kernel = "/nonexistent/vmlinux" }, "no such file"},
		{"missing initramfs", func(s *Spec) { s.Initramfs = initrd + ".gone" }, "no such file"},
		{"vcpus", func(s *Spec) { s.VCPUs = 256 }, "vcpus 256"},
		{"negative memory", func(s *Spec) { s.MemoryMiB = -1 }, "out of range"},
		{"tiny memory", func(s *Spec) { s.MemoryMiB = 16 }, "at least 64"},
		{"raw on amd64", func(s *Spec) { s.KernelFormat = KernelRaw }, "kernel format raw cannot be loaded by libkrun on amd64: use elf or image-bz2"},
		{"elf on arm64", func(s *Spec) { s.arch = "arm64" }, "kernel format elf cannot be loaded by libkrun on arm64: use raw or pe-gz"},
		{"NUL in cmdline", func(s *Spec) { s.Cmdline = "a\x00b" }, "NUL"},
		{"env quote", func(s *Spec) { s.Env = []string{`A="x"`} }, "quote"},
		{"env dotted key", func(s *Spec) { s.Env = []string{"virtio_mmio.device=x"} }, "letters, digits"},
		{"env no equals", func(s *Spec) { s.Env = []string{"JUSTKEY"} }, "KEY=VALUE"},
		{"cmdline too long arm64", func(s *Spec) { s.arch, s.KernelFormat, s.Cmdline = "arm64", KernelRaw, strings.Repeat("a", 1921) }, "take 1921 bytes; libkrun allows 1920 on arm64"},
		{"env too long arm64", func(s *Spec) {
			s.arch, s.KernelFormat = "arm64", KernelRaw
			s.Env = []string{"X=" + strings.Repeat("v", 1000), "Y=" + strings.Repeat("v", 1000)}
		}, "libkrun allows 1920"},
		{"verbosity", func(s *Spec) { s.Verbosity = "loud" }, "verbosity"},
		{"mac", func(s *Spec) { s.MAC = net.HardwareAddr{1, 2, 3} }, "not 6 bytes"},
		{"no channel", func(s *Spec) { s.OnChannel = nil }, "OnChannel is required"},
		{"network without a server", func(s *Spec) { s.Network = true }, "OnNetwork is required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := Spec{Kernel: kernel, KernelFormat: KernelELF, arch: "amd64", OnChannel: ok}
			tc.edit(&s)
			err := s.validate()
			var e *Error
			assert.Assert(t, errors.As(err, &e), "%v", err)
			assert.Equal(t, e.Code, CodeBadSpec)
			assert.Check(t, is.Contains(err.Error(), tc.want))
		})
	}
	good := Spec{Kernel: kernel, KernelFormat: KernelPEGz, arch: "arm64", Initramfs: initrd, Verbosity: "TRACE",
		Env: []string{"A=1", "_B=two words", "C="}, OnChannel: ok}
	assert.NilError(t, good.validate())
}

func TestRandomMAC(t *testing.T) {
	m := randomMAC()
	assert.Equal(t, len(m), 6)
	assert.Equal(t, m[0]&0x01, byte(0), "unicast")
	assert.Equal(t, m[0]&0x02, byte(0x02), "locally administered")
}

func TestBootChecksKernelConfig(t *testing.T) {
	f := openFake(t, -22, false)
	dir, kernel, _, _ := vmFiles(t)
	cfg := filepath.Join(dir, "config")
	assert.NilError(t, os.WriteFile(cfg, []byte(debianLikeConfig), 0o600))
	spec := bootSpec(kernel)
	spec.KernelConfig = cfg
	spec.OnChannel = func(h *os.File) error { return h.Close() }
	err := f.lib.Boot(context.Background(), spec)
	var e *Error
	assert.Assert(t, errors.As(err, &e))
	assert.Equal(t, e.Code, CodeBadSpec)
	assert.Check(t, is.ErrorContains(err, "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y"))
	assert.Equal(t, f.calls(t), "")

	assert.NilError(t, os.WriteFile(cfg, []byte(debianLikeConfig+"CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y\n"), 0o600))
	expectStart(t, f.lib.Boot(context.Background(), spec), syscall.EINVAL)

	spec.KernelConfig = filepath.Join(dir, "missing-config")
	err = f.lib.Boot(context.Background(), spec)
	assert.Assert(t, errors.As(err, &e))
	assert.Equal(t, e.Code, CodeBadSpec)
}
