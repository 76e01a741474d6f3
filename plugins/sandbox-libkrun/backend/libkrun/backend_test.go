package libkrun

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
)

// TestRelay joins clients of the agent socket, one after another, to the
// guest's end of a socketpair (what libkrun's console port is): bytes flow
// both ways, and the channel survives a client leaving.
func TestRelay(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	assert.NilError(t, err)
	guestSide := os.NewFile(uintptr(fds[0]), "guest")
	defer guestSide.Close()
	hostFile := os.NewFile(uintptr(fds[1]), "host")
	host, err := net.FileConn(hostFile)
	assert.NilError(t, err)
	_ = hostFile.Close()

	sock := filepath.Join(t.TempDir(), "exec.sock")
	ln, err := net.Listen("unix", sock)
	assert.NilError(t, err)
	done := make(chan struct{})
	go func() { relay(ln, host, hclog.NewNullLogger()); close(done) }()

	for _, msg := range []string{"first client", "second client"} {
		c, err := net.Dial("unix", sock)
		assert.NilError(t, err)
		_, err = c.Write([]byte(msg))
		assert.NilError(t, err)
		buf := make([]byte, len(msg))
		_, err = io.ReadFull(guestSide, buf)
		assert.NilError(t, err)
		assert.Equal(t, string(buf), msg)

		_, err = guestSide.Write([]byte("reply to " + msg))
		assert.NilError(t, err)
		buf = make([]byte, len("reply to "+msg))
		_, err = io.ReadFull(c, buf)
		assert.NilError(t, err)
		assert.Equal(t, string(buf), "reply to "+msg)
		assert.NilError(t, c.Close())
	}
	assert.NilError(t, ln.Close())
	waitfor.Recv(t, done, waitfor.Default, "the listener's server to end")
}

// TestLibkrunSpec maps a VM spec to libkrun's.
func TestSpecFor(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the fake kernel is an x86_64 ELF vmlinux")
	}
	kernel := filepath.Join(t.TempDir(), "vmlinux")
	assert.NilError(t, os.WriteFile(kernel, append([]byte("\x7fELF"), make([]byte, 124)...), 0o644))
	ks, err := SpecFor(backend.Spec{
		ID: "x", CPUs: 2, MemoryMiB: 256, Kernel: kernel, Initrd: "/i", KernelConfig: "/boot/config-x",
		RootDisk: "/img.erofs", Network: true, Hostname: "sandbox-1234abcd", StateDir: "/s/x", Accel: "kvm",
	})
	assert.NilError(t, err)
	assert.Equal(t, ks.VCPUs, 2)
	assert.Equal(t, ks.MemoryMiB, 256)
	assert.Equal(t, ks.Kernel, kernel)
	assert.Equal(t, ks.Initramfs, "/i")
	assert.Equal(t, ks.RootDisk, "/img.erofs")
	assert.Equal(t, ks.KernelConfig, "/boot/config-x")
	assert.Equal(t, ks.ConsoleLog, "/s/x/console.log")
	assert.Check(t, ks.Network)
	assert.Check(t, ks.Env != nil && len(ks.Env) == 0, "the guest environment must be explicit and empty")
	for _, want := range []string{"iii.root=/dev/vda", "iii.rootfstype=erofs", "iii.hostname=sandbox-1234abcd"} {
		assert.Check(t, is.Contains(strings.Fields(ks.Cmdline), want))
	}
	// A kernel libkrun cannot load is refused before anything starts.
	_, err = SpecFor(backend.Spec{ID: "x", CPUs: 1, MemoryMiB: 256, Kernel: "/i", Initrd: "/i", StateDir: "/s/x", Accel: "kvm"})
	assert.Check(t, err != nil)
}
