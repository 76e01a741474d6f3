package workervm

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// fakeDisk writes a sparse disk image of sizeMB whose superblock carries
// the ext4 magic (unless bad), with a few MiB of data at known places.
func fakeDisk(t *testing.T, p string, sizeMB uint64, bad bool) []byte {
	t.Helper()
	f, err := os.Create(p)
	assert.NilError(t, err)
	defer f.Close()
	assert.NilError(t, f.Truncate(int64(sizeMB)<<20))
	sb := make([]byte, 1024)
	magic := uint16(ext4Magic)
	if bad {
		magic = 0x1234
	}
	binary.LittleEndian.PutUint16(sb[56:], magic)
	_, err = f.WriteAt(sb, 1024)
	assert.NilError(t, err)
	payload := bytes.Repeat([]byte("install result "), 70_000) // ~1 MiB
	_, err = f.WriteAt(payload, 5<<20)
	assert.NilError(t, err)
	_, err = f.WriteAt(payload, int64(sizeMB)<<20-int64(len(payload)))
	assert.NilError(t, err)
	return payload
}

// TestDiskCacheLookup covers what a new worker finds in the install
// cache: only its own namespace's and name's disk, only for the same
// install and disk size, and an unusable entry is deleted and not used.
func TestDiskCacheLookup(t *testing.T) {
	t.Parallel()
	const (
		ns, name = "shop", "w"
		record   = "iii-install-inputs 1\ncommand abc\n"
		sizeMB   = 16
	)
	tests := []struct {
		name string
		// stored is what the cache holds: the disk of record on sizeMB
		// for ns/name, unless changed here.
		storedNS, storedName, storedRecord string
		storedMB                           uint64
		badMagic, truncate                 bool
		off                                bool
		// asked
		wantHit     bool
		wantWhy     string
		wantDeleted bool
	}{
		{name: "hit", wantHit: true},
		{name: "another namespace's disk", storedNS: "other", wantWhy: "no cached disk"},
		{name: "another worker's disk", storedName: "v", wantWhy: "no cached disk"},
		{name: "another install", storedRecord: "iii-install-inputs 1\ncommand def\n", wantWhy: "no cached disk"},
		{name: "another disk size", storedMB: 32, wantWhy: "no cached disk"},
		{name: "not an ext4 image", badMagic: true, wantWhy: "no ext4 superblock", wantDeleted: true},
		{name: "truncated", truncate: true, wantWhy: "bytes, not", wantDeleted: true},
		{name: "cache off", off: true, wantWhy: "off"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := diskCache{dir: filepath.Join(t.TempDir(), diskCacheDirName)}
			sns, sname, srec, smb := ns, name, record, uint64(sizeMB)
			if tc.storedNS != "" {
				sns = tc.storedNS
			}
			if tc.storedName != "" {
				sname = tc.storedName
			}
			if tc.storedRecord != "" {
				srec = tc.storedRecord
			}
			if tc.storedMB != 0 {
				smb = tc.storedMB
			}
			src := filepath.Join(t.TempDir(), "disk.ext4")
			fakeDisk(t, src, smb, tc.badMagic)
			p, err := c.copyIn(sns, sname, srec, smb, src)
			assert.NilError(t, err)
			assert.NilError(t, p.commit(sns, sname))
			if tc.truncate {
				assert.NilError(t, os.Truncate(p.final, 3<<20))
			}
			if tc.off {
				c.dir = ""
			}
			got, why := c.lookup(ns, name, record, sizeMB)
			if tc.wantHit {
				assert.Equal(t, got, p.final)
				assert.Equal(t, why, "")
				return
			}
			assert.Equal(t, got, "")
			assert.Check(t, is.Contains(why, tc.wantWhy))
			_, err = os.Stat(p.final)
			assert.Check(t, is.Equal(os.IsNotExist(err), tc.wantDeleted), "stat: %v", err)
		})
	}
}

// TestDiskCacheReplaceAndRemove: an entry holds one disk, the latest
// install's; worker::remove's clean-up deletes it and no other entry.
func TestDiskCacheReplaceAndRemove(t *testing.T) {
	t.Parallel()
	c := diskCache{dir: filepath.Join(t.TempDir(), diskCacheDirName)}
	src := filepath.Join(t.TempDir(), "disk.ext4")
	fakeDisk(t, src, 8, false)
	keep := func(ns, name, record string) string {
		p, err := c.copyIn(ns, name, record, 8, src)
		assert.NilError(t, err)
		assert.NilError(t, p.commit(ns, name))
		return p.final
	}
	first := keep("shop", "w", "one")
	// A copy an adapter crash interrupted is cleaned up by the next commit.
	assert.NilError(t, os.WriteFile(filepath.Join(filepath.Dir(first), ".tmp-123.ext4"), []byte("x"), 0o600))
	second := keep("shop", "w", "two")
	other := keep("bar", "w", "one")
	des, err := os.ReadDir(filepath.Dir(second))
	assert.NilError(t, err)
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	assert.DeepEqual(t, names, []string{filepath.Base(second), ownerFile})
	got, _ := c.lookup("shop", "w", "one", 8)
	assert.Equal(t, got, "", "the older install's disk was replaced")

	assert.NilError(t, c.remove("shop", "w"))
	got, _ = c.lookup("shop", "w", "two", 8)
	assert.Equal(t, got, "")
	got, _ = c.lookup("bar", "w", "one", 8)
	assert.Equal(t, got, other, "another namespace's entry stays")
}

// TestCopyDiskSparse: the copy has the same bytes and stays sparse.
func TestCopyDiskSparse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join(dir, "src.ext4")
	payload := fakeDisk(t, src, 64, false)
	tests := []struct {
		name string
		copy func(src, dst string) (string, error)
	}{
		{"copyDisk", func(src, dst string) (string, error) { m, _, err := copyDisk(src, dst); return m, err }},
		{"restore", restore},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "dst.ext4")
			method, err := tc.copy(src, dst)
			assert.NilError(t, err)
			assert.Check(t, method == copyReflink || method == copySparse, method)
			a, err := os.ReadFile(src)
			assert.NilError(t, err)
			b, err := os.ReadFile(dst)
			assert.NilError(t, err)
			assert.Check(t, bytes.Equal(a, b), "the copy's bytes differ")
			var st syscall.Stat_t
			assert.NilError(t, syscall.Stat(dst, &st))
			// 64 MiB apparent; the data is ~2 MiB plus the superblock.
			assert.Check(t, st.Blocks*512 < 8<<20, "the copy allocates %d bytes", st.Blocks*512)
			assert.Check(t, bytes.Contains(b[5<<20:6<<20+len(payload)], payload[:4096]))
		})
	}
	_, err := restore(filepath.Join(dir, "missing"), filepath.Join(dir, "out.ext4"))
	assert.Check(t, err != nil)
	_, err = os.Stat(filepath.Join(dir, "out.ext4"))
	assert.Check(t, os.IsNotExist(err), "a failed restore leaves no disk")
}

// TestHostManifests: the install's key computed on the host before the VM
// boots is the one the copy computes from what it sends.
func TestHostManifests(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		files map[string]string
		links map[string]string
		rule  func(root string) copyRule
	}{
		{name: "none", files: map[string]string{"worker.mjs": "x"}},
		{name: "top-level manifests only", files: map[string]string{
			"package.json": `{"name":"w"}`, "requirements-dev.txt": "pytest\n", "src/package.json": "{}",
			"node_modules/package.json": "{}", "README.md": "r",
		}},
		{name: "a link is not a manifest", files: map[string]string{"real.json": "{}"}, links: map[string]string{"package.json": "real.json"}},
		{name: "excluded", files: map[string]string{"package.json": "{}", "go.mod": "module x\n"},
			rule: func(root string) copyRule { return copyRule{exclude: []string{filepath.Join(root, "go.mod")}} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			for n, content := range tc.files {
				p := filepath.Join(root, filepath.FromSlash(n))
				assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
				assert.NilError(t, os.WriteFile(p, []byte(content), 0o644))
			}
			for n, target := range tc.links {
				assert.NilError(t, os.Symlink(target, filepath.Join(root, n)))
			}
			rule := copyRule{}
			if tc.rule != nil {
				rule = tc.rule(root)
			}
			st, err := writeWorkspaceTar(context.Background(), io.Discard, root, rule)
			assert.NilError(t, err)
			got, err := hostManifests(root, rule)
			assert.NilError(t, err)
			assert.DeepEqual(t, got, st.Manifests)
		})
	}
}
