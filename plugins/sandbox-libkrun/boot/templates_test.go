package boot

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestTemplateKey(t *testing.T) {
	base := templateKey{
		Format: templateFormat, Image: "python", Digest: "sha256:aa", Rootfs: fileID{Path: "/c/r", Size: 1},
		Kernel: fileID{Path: "/k", Size: 2}, Initrd: fileID{Path: "/i", Size: 3}, QEMU: fileID{Path: "/q", Size: 4},
		Accel: "tcg", CPUs: 1, MemoryMiB: 512,
	}
	assert.Equal(t, base.slot(), "python-1c512m")
	assert.Equal(t, len(base.id()), 32)
	assert.Equal(t, base.id(), base.id())
	// Everything the saved state depends on changes the id; only the
	// image name and shape change the slot.
	for name, change := range map[string]func(k *templateKey){
		"digest":  func(k *templateKey) { k.Digest = "sha256:bb" },
		"kernel":  func(k *templateKey) { k.Kernel.ModNano++ },
		"initrd":  func(k *templateKey) { k.Initrd.Size++ },
		"qemu":    func(k *templateKey) { k.QEMU.Path = "/other" },
		"rootfs":  func(k *templateKey) { k.Rootfs.Size++ },
		"accel":   func(k *templateKey) { k.Accel = "kvm" },
		"format":  func(k *templateKey) { k.Format++ },
		"cpus":    func(k *templateKey) { k.CPUs = 2 },
		"memory":  func(k *templateKey) { k.MemoryMiB = 640 },
		"network": func(k *templateKey) { k.Network = true },
	} {
		k := base
		change(&k)
		assert.Check(t, k.id() != base.id(), name)
	}
	net := base
	net.Network = true
	assert.Equal(t, net.slot(), "python-1c512m-net")
	odd := base
	odd.Image = "../Weird Name/../x"
	assert.Equal(t, odd.slot(), ".._eird_ame_.._x-1c512m")
	assert.Check(t, !isTemplateID("../x") && !isTemplateID(".recording-1") && isTemplateID(base.id()))
}

// TestTemplateEviction: over snapshot_templates_max_mb, the least recently
// used templates go first; a slot keeps only its newest template.
func TestTemplateEviction(t *testing.T) {
	root := t.TempDir()
	s := &Templates{h: &testHost{}, root: root, maxBytes: 3<<20 + 64<<10, recording: map[string]bool{}, failed: map[string]time.Time{}}
	mk := func(slot string, k templateKey, mib int, age time.Duration) string {
		dir := filepath.Join(root, slot, k.id())
		assert.NilError(t, os.MkdirAll(dir, 0o700))
		assert.NilError(t, os.WriteFile(filepath.Join(dir, templateMemName), make([]byte, mib<<20), 0o600))
		assert.NilError(t, os.WriteFile(filepath.Join(dir, templateStateName), []byte("s"), 0o600))
		when := time.Now().Add(-age)
		assert.NilError(t, os.Chtimes(dir, when, when))
		return dir
	}
	a := templateKey{Image: "a", CPUs: 1, MemoryMiB: 64}
	b := templateKey{Image: "b", CPUs: 1, MemoryMiB: 64}
	c := templateKey{Image: "c", CPUs: 1, MemoryMiB: 64}
	oldest := mk(a.slot(), a, 1, 3*time.Hour)
	mid := mk(b.slot(), b, 1, 2*time.Hour)
	newest := mk(c.slot(), c, 1, time.Hour)
	// A lookup counts as a use: b becomes the newest.
	assert.Check(t, s.lookup(b) != nil)
	mk(c.slot()+"x", templateKey{Image: "d"}, 1, 0)
	s.evict()
	_, err := os.Stat(oldest)
	assert.Check(t, os.IsNotExist(err), "the least recently used template was kept")
	for _, d := range []string{mid, newest} {
		_, err := os.Stat(d)
		assert.Check(t, err, d)
	}

	// A newer template of the same slot replaces the older one.
	c2 := c
	c2.Digest = "sha256:new"
	mk(c2.slot(), c2, 0, 0)
	s.dropOthers(c2)
	_, err = os.Stat(newest)
	assert.Check(t, os.IsNotExist(err))
	assert.Check(t, s.lookup(c2) != nil)
	assert.Check(t, s.lookup(c) == nil)

	// A template that failed is not used for a while.
	s.failed[c2.id()] = time.Now()
	assert.Check(t, s.lookup(c2) == nil)
	assert.Check(t, is.Len(s.list(), 3))
}

func TestParentPID(t *testing.T) {
	for stat, want := range map[string]int{
		"57 (python3) S 1 57 57 0 -1":           1,
		"3 (kworker/0:0) I 2 0 0 0 -1":          2,
		"90 (a) b) (c) R 44 90 90 0 -1 4194560": 44,
	} {
		got, ok := parentPID(stat)
		assert.Check(t, ok && got == want, stat)
	}
	for _, bad := range []string{"", "12 (x", "12 (x) S", "12 (x) S notanumber"} {
		_, ok := parentPID(bad)
		assert.Check(t, !ok, bad)
	}
}
