//go:build linux || darwin

package libkrun

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// KernelFormat is krun_set_kernel's kernel_format (KRUN_KERNEL_FORMAT_*).
type KernelFormat uint32

// Kernel formats, with the values of libkrun.h.
const (
	KernelRaw       KernelFormat = 0 // arm64: an uncompressed Image
	KernelELF       KernelFormat = 1 // x86_64: vmlinux
	KernelPEGz      KernelFormat = 2 // arm64: a gzip-compressed Image, bare or in an EFI zboot PE
	KernelImageBz2  KernelFormat = 3 // x86_64: a bzImage whose payload is bzip2
	KernelImageGz   KernelFormat = 4 // x86_64: a bzImage whose payload is gzip
	KernelImageZstd KernelFormat = 5 // x86_64: a bzImage whose payload is zstd
)

func kernelFormatNames() []string {
	return []string{"raw", "elf", "pe-gz", "image-bz2", "image-gz", "image-zstd"}
}

func (f KernelFormat) String() string {
	if names := kernelFormatNames(); int(f) < len(names) {
		return names[f]
	}
	return fmt.Sprintf("format-%d", uint32(f))
}

// ParseKernelFormat reads a format name as String writes it.
func ParseKernelFormat(s string) (KernelFormat, error) {
	for i, n := range kernelFormatNames() {
		if strings.EqualFold(strings.TrimSpace(s), n) {
			return KernelFormat(i), nil
		}
	}
	return 0, fmt.Errorf("kernel format %q: use one of %s", s, strings.Join(kernelFormatNames(), ", "))
}

// KernelFormatsFor lists the formats libkrun can load for a guest
// architecture (GOARCH). In libkrun's loader ELF and the bzImage formats
// exist only on x86_64, raw and pe-gz only on aarch64; raw on x86_64 means
// a libkrunfw-style kernel bundle, not a kernel file.
func KernelFormatsFor(arch string) []KernelFormat {
	switch arch {
	case "amd64":
		return []KernelFormat{KernelELF, KernelImageBz2, KernelImageGz, KernelImageZstd}
	case "arm64":
		return []KernelFormat{KernelRaw, KernelPEGz}
	}
	return nil
}

func formatOK(f KernelFormat, arch string) bool {
	for _, g := range KernelFormatsFor(arch) {
		if g == f {
			return true
		}
	}
	return false
}

// payloadMagics are the compression magics at the start of a kernel payload.
func payloadMagics() []struct {
	name  string
	magic []byte
} {
	return []struct {
		name  string
		magic []byte
	}{
		{"gzip", []byte{0x1f, 0x8b}},
		{"bzip2", []byte("BZh")},
		{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}},
		{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}},
		{"lz4", []byte{0x02, 0x21, 0x4c, 0x18}},
		{"lzo", []byte{0x89, 'L', 'Z', 'O'}},
		{"lzma", []byte{0x5d, 0x00, 0x00}},
	}
}

func compressionOf(b []byte) string {
	for _, m := range payloadMagics() {
		if bytes.HasPrefix(b, m.magic) {
			return m.name
		}
	}
	return ""
}

// errKernelFormat is wrapped by every DetectKernelFormat failure.
var errKernelFormat = errors.New("kernel format")

// DetectKernelFormat tells which krun_set_kernel format a kernel file is
// for a guest architecture, from its headers. A kernel libkrun cannot load
// (an x86_64 bzImage compressed with lz4 or xz, as Debian's are; an arm64
// zboot image not compressed with gzip) is an error that says what to
// give libkrun instead.
func DetectKernelFormat(r io.ReaderAt, size int64, arch string) (KernelFormat, error) {
	head := make([]byte, 4096)
	n, err := r.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("%w: read: %v", errKernelFormat, err)
	}
	head = head[:n]
	if n < 64 {
		return 0, fmt.Errorf("%w: %d bytes is too short for a kernel", errKernelFormat, n)
	}
	switch arch {
	case "amd64":
		return detectAMD64(r, size, head)
	case "arm64":
		return detectARM64(head)
	}
	return 0, fmt.Errorf("%w: architecture %q: libkrun runs amd64 and arm64 guests", errKernelFormat, arch)
}

func detectAMD64(r io.ReaderAt, size int64, head []byte) (KernelFormat, error) {
	if bytes.HasPrefix(head, []byte("\x7fELF")) {
		return KernelELF, nil
	}
	// The x86 boot protocol: "HdrS" at 0x202; from version 2.08 the
	// setup header says where the compressed payload is.
	if len(head) < 0x250 || string(head[0x202:0x206]) != "HdrS" {
		if c := compressionOf(head); c == "gzip" {
			return KernelImageGz, nil
		}
		return 0, fmt.Errorf("%w: neither an ELF vmlinux nor a bzImage: give libkrun the ELF vmlinux", errKernelFormat)
	}
	version := binary.LittleEndian.Uint16(head[0x206:])
	if version < 0x208 {
		return 0, fmt.Errorf("%w: bzImage boot protocol %d.%02d has no payload header: give libkrun the ELF vmlinux", errKernelFormat, version>>8, version&0xff)
	}
	setupSects := int64(head[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	off := (setupSects+1)*512 + int64(binary.LittleEndian.Uint32(head[0x248:]))
	if off < 0 || off+8 > size {
		return 0, fmt.Errorf("%w: bzImage payload offset %d is outside the %d-byte file", errKernelFormat, off, size)
	}
	magic := make([]byte, 8)
	if _, err := r.ReadAt(magic, off); err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("%w: read payload: %v", errKernelFormat, err)
	}
	switch c := compressionOf(magic); c {
	case "gzip":
		return KernelImageGz, nil
	case "bzip2":
		return KernelImageBz2, nil
	case "zstd":
		return KernelImageZstd, nil
	case "":
		return 0, fmt.Errorf("%w: bzImage payload has an unknown compression: give libkrun the ELF vmlinux", errKernelFormat)
	default:
		return 0, fmt.Errorf("%w: bzImage payload is %s-compressed, which libkrun cannot unpack (it knows gzip, bzip2 and zstd): "+
			"give libkrun the ELF vmlinux (linux-source's scripts/extract-vmlinux writes it from the bzImage)", errKernelFormat, c)
	}
}

func detectARM64(head []byte) (KernelFormat, error) {
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		// A bare Image.gz; libkrun's pe-gz loader looks for the gzip
		// stream anywhere in the file.
		return KernelPEGz, nil
	case bytes.HasPrefix(head, []byte("MZ")) && string(head[4:8]) == "zimg":
		// EFI zboot: the compression is named at offset 24.
		comp := strings.TrimRight(string(head[24:32]), "\x00")
		if comp == "gzip" {
			return KernelPEGz, nil
		}
		return 0, fmt.Errorf("%w: EFI zboot image compressed with %q; libkrun unpacks only gzip: give it the uncompressed Image", errKernelFormat, comp)
	case string(head[56:60]) == "ARM\x64":
		return KernelRaw, nil
	case bytes.HasPrefix(head, []byte("\x7fELF")):
		return 0, fmt.Errorf("%w: an ELF vmlinux cannot be booted by libkrun on arm64: give it the Image (raw) or Image.gz (pe-gz)", errKernelFormat)
	}
	return 0, fmt.Errorf("%w: not an arm64 Image, Image.gz or gzip zboot image", errKernelFormat)
}

// DetectKernelFile is DetectKernelFormat on a file.
func DetectKernelFile(path, arch string) (KernelFormat, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	kf, err := DetectKernelFormat(f, fi.Size(), arch)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return kf, nil
}
