//go:build linux || darwin

package libkrun

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// bzImage builds an x86 boot-protocol header whose payload starts with
// magic, with setupSects 512-byte setup sectors after the boot sector.
func bzImage(version uint16, setupSects byte, payloadOff uint32, magic []byte) []byte {
	sects := int(setupSects)
	if sects == 0 {
		sects = 4
	}
	start := (sects+1)*512 + int(payloadOff)
	b := make([]byte, start+64)
	b[0x1f1] = setupSects
	binary.LittleEndian.PutUint16(b[0x1fe:], 0xaa55)
	copy(b[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(b[0x206:], version)
	binary.LittleEndian.PutUint32(b[0x248:], payloadOff)
	binary.LittleEndian.PutUint32(b[0x24c:], 64)
	copy(b[start:], magic)
	return b
}

func arm64Image() []byte {
	b := make([]byte, 128)
	copy(b, "MZ")
	copy(b[56:], "ARM\x64")
	return b
}

func zboot(comp string) []byte {
	b := make([]byte, 128)
	copy(b, "MZ")
	copy(b[4:], "zimg")
	copy(b[24:], comp)
	return b
}

func TestDetectKernelFormat(t *testing.T) {
	gz := []byte{0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0}
	tests := []struct {
		name string
		arch string
		data []byte
		want KernelFormat
		err  string
	}{
		{"amd64 vmlinux", "amd64", append([]byte("\x7fELF\x02\x01\x01"), make([]byte, 100)...), KernelELF, ""},
		{"amd64 bzImage gzip", "amd64", bzImage(0x20f, 27, 0x3a0, gz), KernelImageGz, ""},
		{"amd64 bzImage bzip2", "amd64", bzImage(0x20f, 0, 0, []byte("BZh91AY")), KernelImageBz2, ""},
		{"amd64 bzImage zstd", "amd64", bzImage(0x20f, 30, 16, []byte{0x28, 0xb5, 0x2f, 0xfd}), KernelImageZstd, ""},
		{"amd64 bzImage lz4 (Debian)", "amd64", bzImage(0x20f, 30, 16, []byte{0x02, 0x21, 0x4c, 0x18}), 0, "lz4-compressed"},
		{"amd64 bzImage xz", "amd64", bzImage(0x20f, 30, 16, []byte{0xfd, '7', 'z', 'X', 'Z', 0}), 0, "xz-compressed"},
		{"amd64 bzImage unknown", "amd64", bzImage(0x20f, 30, 16, []byte("????")), 0, "unknown compression"},
		{"amd64 old protocol", "amd64", bzImage(0x206, 30, 16, gz), 0, "boot protocol 2.06"},
		{"amd64 payload past end", "amd64", func() []byte {
			b := bzImage(0x20f, 1, 0, gz)
			binary.LittleEndian.PutUint32(b[0x248:], 1<<30)
			return b
		}(), 0, "outside"},
		{"amd64 bare gzip", "amd64", append(gz, make([]byte, 100)...), KernelImageGz, ""},
		{"amd64 garbage", "amd64", bytes.Repeat([]byte{0x90}, 1024), 0, "neither an ELF vmlinux nor a bzImage"},
		{"arm64 Image", "arm64", arm64Image(), KernelRaw, ""},
		{"arm64 Image.gz", "arm64", append(gz, make([]byte, 100)...), KernelPEGz, ""},
		{"arm64 zboot gzip", "arm64", zboot("gzip"), KernelPEGz, ""},
		{"arm64 zboot zstd", "arm64", zboot("zstd"), 0, `compressed with "zstd"`},
		{"arm64 ELF", "arm64", append([]byte("\x7fELF\x02\x01\x01"), make([]byte, 100)...), 0, "cannot be booted by libkrun on arm64"},
		{"arm64 garbage", "arm64", make([]byte, 200), 0, "not an arm64 Image"},
		{"short", "amd64", []byte("\x7fELF"), 0, "too short"},
		{"riscv", "riscv64", make([]byte, 200), 0, "amd64 and arm64"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DetectKernelFormat(bytes.NewReader(tc.data), int64(len(tc.data)), tc.arch)
			if tc.err != "" {
				assert.Assert(t, errors.Is(err, errKernelFormat), "%v", err)
				assert.Check(t, is.ErrorContains(err, tc.err))
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
			assert.Assert(t, formatOK(got, tc.arch), "detected a format libkrun cannot load on %s", tc.arch)
		})
	}
}

// TestDetectHostKernel runs the detector on the installed kernels: it must
// answer, one way or the other, without a panic.
func TestDetectHostKernel(t *testing.T) {
	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(kernels) == 0 {
		t.Skip("no kernel in /boot")
	}
	for _, k := range kernels {
		f, err := DetectKernelFile(k, runtime.GOARCH)
		if errors.Is(err, os.ErrPermission) {
			continue
		}
		if err != nil {
			assert.Assert(t, errors.Is(err, errKernelFormat), "%v", err)
			t.Logf("%s: %v", k, err)
			continue
		}
		t.Logf("%s: %s", k, f)
		assert.Assert(t, formatOK(f, runtime.GOARCH))
	}
}

func TestKernelFormatNames(t *testing.T) {
	for _, f := range []KernelFormat{KernelRaw, KernelELF, KernelPEGz, KernelImageBz2, KernelImageGz, KernelImageZstd} {
		g, err := ParseKernelFormat(f.String())
		assert.NilError(t, err)
		assert.Equal(t, g, f)
	}
	g, err := ParseKernelFormat(" ELF ")
	assert.NilError(t, err)
	assert.Equal(t, g, KernelELF)
	_, err = ParseKernelFormat("bzimage")
	assert.ErrorContains(t, err, "use one of raw, elf, pe-gz")
	assert.Equal(t, KernelFormat(9).String(), "format-9")
}

func FuzzDetectKernelFormat(f *testing.F) {
	f.Add(bzImage(0x20f, 27, 0x3a0, []byte{0x1f, 0x8b}), true)
	f.Add(bzImage(0x20f, 0, 0, []byte{0x02, 0x21, 0x4c, 0x18}), true)
	f.Add(arm64Image(), false)
	f.Add(zboot("gzip"), false)
	f.Add([]byte("\x7fELF"), true)
	f.Fuzz(func(t *testing.T, data []byte, amd64 bool) {
		arch := "arm64"
		if amd64 {
			arch = "amd64"
		}
		got, err := DetectKernelFormat(bytes.NewReader(data), int64(len(data)), arch)
		if err != nil {
			if !errors.Is(err, errKernelFormat) {
				t.Fatalf("error does not wrap errKernelFormat: %v", err)
			}
			return
		}
		if !formatOK(got, arch) {
			t.Fatalf("detected %s, which libkrun cannot load on %s", got, arch)
		}
	})
}
