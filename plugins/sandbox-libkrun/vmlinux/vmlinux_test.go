package vmlinux

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/ulikunitz/xz"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// testELF is a minimal x86-64 executable: the ELF header, one PT_NOTE
// program header and the note, with the Xen PVH entry note when pvh.
func testELF(machine elfMachine, pvh bool) []byte {
	var note bytes.Buffer
	typ := uint32(xenPhys32Entry)
	if !pvh {
		typ = 6 // XEN_ELFNOTE_GUEST_OS: a Xen note, not the entry point
	}
	for _, v := range []uint32{4, 8, typ} {
		_ = binary.Write(&note, binary.LittleEndian, v)
	}
	note.WriteString("Xen\x00")
	_ = binary.Write(&note, binary.LittleEndian, uint64(0x1000000))

	var b bytes.Buffer
	ident := [16]byte{0x7f, 'E', 'L', 'F', 2, 1, 1}
	b.Write(ident[:])
	le := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	le(uint16(2))       // ET_EXEC
	le(uint16(machine)) // e_machine
	le(uint32(1))       // e_version
	le(uint64(0x1000000))
	le(uint64(64)) // e_phoff
	le(uint64(0))  // e_shoff
	le(uint32(0))
	le(uint16(64)) // e_ehsize
	le(uint16(56)) // e_phentsize
	le(uint16(1))  // e_phnum
	le(uint16(64)) // e_shentsize
	le(uint16(0))
	le(uint16(0))
	// PT_NOTE at 120.
	le(uint32(4))
	le(uint32(4))
	le(uint64(120))
	le(uint64(0))
	le(uint64(0))
	le(uint64(note.Len()))
	le(uint64(note.Len()))
	le(uint64(4))
	b.Write(note.Bytes())
	// Padding, so the payload is not trivially small.
	b.Write(bytes.Repeat([]byte("kernel text "), 400))
	return b.Bytes()
}

type elfMachine uint16

const (
	machineX86   elfMachine = 62
	machineARM64 elfMachine = 183
)

func compress(t *testing.T, name string, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	switch name {
	case Gzip:
		w := gzip.NewWriter(&b)
		_, err := w.Write(data)
		assert.NilError(t, err)
		assert.NilError(t, w.Close())
	case LZ4:
		w := lz4.NewWriter(&b)
		assert.NilError(t, w.Apply(lz4.LegacyOption(true)))
		_, err := w.Write(data)
		assert.NilError(t, err)
		assert.NilError(t, w.Close())
	case Zstd:
		w, err := zstd.NewWriter(&b)
		assert.NilError(t, err)
		_, err = w.Write(data)
		assert.NilError(t, err)
		assert.NilError(t, w.Close())
	case XZ:
		w, err := xz.NewWriter(&b)
		assert.NilError(t, err)
		_, err = w.Write(data)
		assert.NilError(t, err)
		assert.NilError(t, w.Close())
	default:
		b.Write(data)
	}
	return b.Bytes()
}

// bzImage wraps a payload the way the kernel build does: setup sectors
// with the header, then the payload followed by its unpacked size.
func bzImage(payload []byte, unpacked uint32) []byte {
	const setupSects = 3
	img := make([]byte, (setupSects+1)*512)
	img[0x1f1] = setupSects
	copy(img[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(img[0x206:], 0x20f)
	// payload_offset counts from the protected-mode code; put a little
	// decompressor-shaped filler before it.
	filler := bytes.Repeat([]byte{0x90}, 256)
	binary.LittleEndian.PutUint32(img[0x248:], uint32(len(filler)))
	binary.LittleEndian.PutUint32(img[0x24c:], uint32(len(payload)+4))
	img = append(img, filler...)
	img = append(img, payload...)
	return binary.LittleEndian.AppendUint32(img, unpacked)
}

func TestExtract(t *testing.T) {
	elfPVH := testELF(machineX86, true)
	for _, c := range []string{Gzip, LZ4, Zstd, XZ} {
		t.Run(c, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(dir, "vmlinuz")
			assert.NilError(t, os.WriteFile(src, bzImage(compress(t, c, elfPVH), uint32(len(elfPVH))), 0o600))
			cache := filepath.Join(dir, "cache")
			got, info, err := Extract(context.Background(), src, cache)
			assert.NilError(t, err)
			assert.Check(t, info.PVH)
			data, err := os.ReadFile(got)
			assert.NilError(t, err)
			assert.Check(t, bytes.Equal(data, elfPVH))
			fi, err := os.Stat(got)
			assert.NilError(t, err)
			assert.Check(t, is.Equal(fi.Mode().Perm(), os.FileMode(0o644)))

			// Cached: the same path, and no temporary files left.
			again, info2, err := Extract(context.Background(), src, cache)
			assert.NilError(t, err)
			assert.Check(t, is.Equal(again, got))
			assert.Check(t, info2.PVH)
			entries, err := os.ReadDir(cache)
			assert.NilError(t, err)
			assert.Check(t, is.Len(entries, 1))
		})
	}
}

func TestExtractELFAsIs(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "vmlinux")
	assert.NilError(t, os.WriteFile(src, testELF(machineX86, false), 0o600))
	got, info, err := Extract(context.Background(), src, filepath.Join(dir, "cache"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(got, src))
	assert.Check(t, !info.PVH)
}

func TestExtractRefuses(t *testing.T) {
	elfPVH := testELF(machineX86, true)
	cases := []struct {
		name string
		img  []byte
		want string
	}{
		{"not a bzImage", bytes.Repeat([]byte{1}, 4096), "no HdrS"},
		{"unknown compression", bzImage(bytes.Repeat([]byte{7}, 100), 100), "unknown compression"},
		{"lzo", bzImage(append([]byte{0x89, 'L', 'Z', 'O'}, make([]byte, 100)...), 100), "lzo-compressed"},
		{"size too large", bzImage(compress(t, Gzip, elfPVH), MaxUnpacked+1), "claims"},
		{"size larger than the stream", bzImage(compress(t, Gzip, elfPVH), uint32(len(elfPVH)+10)), "unpack the gzip payload"},
		{"not x86-64", bzImage(compress(t, Gzip, testELF(machineARM64, true)), uint32(len(elfPVH))), "not an x86-64"},
		{"not an ELF", bzImage(compress(t, Gzip, bytes.Repeat([]byte{3}, 500)), 500), "kernel image format"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(dir, "vmlinuz")
			assert.NilError(t, os.WriteFile(src, c.img, 0o600))
			cache := filepath.Join(dir, "cache")
			_, _, err := Extract(context.Background(), src, cache)
			assert.ErrorContains(t, err, c.want)
			assert.Check(t, IsFormat(err), "%v", err)
			entries, _ := os.ReadDir(cache)
			assert.Check(t, is.Len(entries, 0), "nothing is left in the cache")
		})
	}
}

func TestExtractCancelled(t *testing.T) {
	elfPVH := testELF(machineX86, true)
	dir := t.TempDir()
	src := filepath.Join(dir, "vmlinuz")
	assert.NilError(t, os.WriteFile(src, bzImage(compress(t, Gzip, elfPVH), uint32(len(elfPVH))), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err := Extract(ctx, src, filepath.Join(dir, "cache"))
	assert.ErrorIs(t, err, context.Canceled)
}

// TestExtractInstalledKernel unpacks the host's own kernel when it has one
// (Debian's cloud kernel is LZ4 with CONFIG_PVH).
func TestExtractInstalledKernel(t *testing.T) {
	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(kernels) == 0 {
		t.Skip("no kernel in /boot")
	}
	src := kernels[len(kernels)-1]
	if f, err := os.Open(src); err != nil {
		t.Skipf("kernel not readable: %v", err)
	} else {
		f.Close()
	}
	got, info, err := Extract(context.Background(), src, t.TempDir())
	assert.NilError(t, err)
	cfg, err := os.ReadFile(filepath.Join("/boot", "config-"+strings.TrimPrefix(filepath.Base(src), "vmlinuz-")))
	if err == nil {
		assert.Check(t, is.Equal(info.PVH, strings.Contains(string(cfg), "\nCONFIG_PVH=y")))
	}
	fi, err := os.Stat(got)
	assert.NilError(t, err)
	assert.Check(t, fi.Size() > 1<<20, "a real vmlinux is megabytes, got %d bytes", fi.Size())
}

func TestHasNote(t *testing.T) {
	var b bytes.Buffer
	for _, v := range []uint32{4, 3, 1} { // GNU-style note, odd desc size
		_ = binary.Write(&b, binary.LittleEndian, v)
	}
	b.WriteString("GNU\x00abc\x00")
	for _, v := range []uint32{4, 8, xenPhys32Entry} {
		_ = binary.Write(&b, binary.LittleEndian, v)
	}
	b.WriteString("Xen\x00")
	b.Write(make([]byte, 8))
	assert.Check(t, hasNote(b.Bytes(), "Xen", xenPhys32Entry))
	assert.Check(t, !hasNote(b.Bytes(), "Xen", 6))
	assert.Check(t, !hasNote(b.Bytes()[:20], "Xen", xenPhys32Entry), "truncated")
	huge := binary.LittleEndian.AppendUint32(nil, 0xffffffff)
	huge = append(huge, make([]byte, 12)...)
	assert.Check(t, !hasNote(huge, "Xen", xenPhys32Entry))
}

func FuzzParseBzImage(f *testing.F) {
	elfPVH := testELF(machineX86, true)
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, _ = w.Write(elfPVH)
	_ = w.Close()
	f.Add(bzImage(gz.Bytes(), uint32(len(elfPVH))))
	f.Add(bytes.Repeat([]byte{0}, 0x300))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseBzImage(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		if p.Offset < 0 || p.Offset+p.Length > int64(len(data)) {
			t.Fatalf("payload %+v outside %d bytes", p, len(data))
		}
	})
}

func FuzzInspectELF(f *testing.F) {
	f.Add(testELF(machineX86, true))
	f.Add(testELF(machineX86, false))
	f.Add(testELF(machineARM64, true))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = InspectELF(bytes.NewReader(data))
	})
}
