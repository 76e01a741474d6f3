package qemu

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// TestArgsUpperDisk: with a persistent upper disk both disks carry serials
// and the agent is told to find them by serial; without one nothing
// changes for sandboxes.
func TestArgsUpperDisk(t *testing.T) {
	cfg := Config{Arch: "amd64", Accel: AccelTCG, Kernel: "/k", Initrd: "/i", RootDisk: "/img.erofs", UpperDisk: "/state/disk.ext4", StateDir: "/state", TSCKHz: 1000}
	args, err := cfg.Args()
	assert.NilError(t, err)
	line := strings.Join(args, " ")
	assert.Check(t, is.Contains(line, "virtio-blk-device,drive=root,serial=iii-root"))
	assert.Check(t, is.Contains(line, "file=/state/disk.ext4,if=none,id=upper,format=raw,discard=unmap"))
	assert.Check(t, is.Contains(line, "virtio-blk-device,drive=upper,serial=iii-upper"))
	assert.Check(t, is.Contains(line, "iii.root=serial:iii-root iii.upper=serial:iii-upper"))
	assert.Check(t, !strings.Contains(line, "readonly=on,serial"), "the upper disk is writable")

	cfg.UpperDisk = ""
	args, err = cfg.Args()
	assert.NilError(t, err)
	line = strings.Join(args, " ")
	assert.Check(t, is.Contains(line, "iii.root=/dev/vda"))
	assert.Check(t, !strings.Contains(line, "serial="))

	_, err = (&Config{Accel: AccelTCG, Kernel: "/k", Initrd: "/i", UpperDisk: "/d", StateDir: "/s"}).Args()
	assert.ErrorContains(t, err, "needs a root disk")
}
