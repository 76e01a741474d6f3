// Package vmlinux finds the compressed kernel inside an x86-64 bzImage and
// unpacks it into the ELF vmlinux it was built from.
//
// Why: QEMU boots a bzImage by reading the whole file into its own heap and
// keeping it there for the VM's lifetime (it serves it over fw_cfg), and the
// guest then decompresses it into guest RAM. With Debian's LZ4 cloud kernel
// that is about 14 MB of private memory in every QEMU plus some 40 MB of
// touched guest RAM. Given the ELF vmlinux of a kernel with a PVH entry
// point, QEMU's microvm maps the file and loads its segments straight into
// guest RAM: the file's pages stay shared, clean page cache, and the guest
// skips its decompressor. libkrun loads an ELF vmlinux whatever compression
// the bzImage used, so the same extraction lets it boot LZ4/XZ kernels.
package vmlinux

import (
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/ulikunitz/xz"
)

// ErrFormat marks input that is not what the function expects (not a
// bzImage, an unknown compression, not an x86-64 ELF).
var ErrFormat = errors.New("kernel image format")

// Compression names, as the kernel's build calls them.
const (
	Gzip  = "gzip"
	Bzip2 = "bzip2"
	Zstd  = "zstd"
	XZ    = "xz"
	LZ4   = "lz4"
	LZO   = "lzo"
	LZMA  = "lzma"
)

// MaxUnpacked bounds the unpacked kernel: a real x86-64 vmlinux is tens of
// MB, and the limit keeps a hostile image from filling the cache's disk.
const MaxUnpacked = 512 << 20

// magic is one compression's leading bytes.
type magic struct {
	name  string
	bytes []byte
}

func magics() []magic {
	return []magic{
		{Gzip, []byte{0x1f, 0x8b}},
		{Bzip2, []byte("BZh")},
		{Zstd, []byte{0x28, 0xb5, 0x2f, 0xfd}},
		{XZ, []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}},
		{LZ4, []byte{0x02, 0x21, 0x4c, 0x18}},
		{LZO, []byte{0x89, 'L', 'Z', 'O'}},
		{LZMA, []byte{0x5d, 0x00, 0x00}},
	}
}

// CompressionOf names the compression whose magic b starts with, or "".
func CompressionOf(b []byte) string {
	for _, m := range magics() {
		if bytes.HasPrefix(b, m.bytes) {
			return m.name
		}
	}
	return ""
}

// IsELF reports whether head starts with the ELF magic.
func IsELF(head []byte) bool { return bytes.HasPrefix(head, []byte("\x7fELF")) }

// Payload is where a bzImage keeps its compressed kernel.
type Payload struct {
	Offset      int64  // from the start of the file
	Length      int64  // compressed bytes, including the 4-byte size trailer
	Compression string // one of the names above, "" when unknown
	// Unpacked is the vmlinux's size as the kernel build appends it to the
	// payload (little-endian, last 4 bytes); 0 when the payload is too
	// short to carry it.
	Unpacked uint32
}

// ParseBzImage reads a bzImage's setup header (boot protocol 2.08 or later,
// which records payload_offset and payload_length) and locates the payload.
func ParseBzImage(r io.ReaderAt, size int64) (Payload, error) {
	head := make([]byte, 0x250)
	n, err := r.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return Payload{}, fmt.Errorf("%w: read the setup header: %v", ErrFormat, err)
	}
	if n < len(head) || string(head[0x202:0x206]) != "HdrS" {
		return Payload{}, fmt.Errorf("%w: not a bzImage (no HdrS setup header)", ErrFormat)
	}
	version := binary.LittleEndian.Uint16(head[0x206:])
	if version < 0x208 {
		return Payload{}, fmt.Errorf("%w: bzImage boot protocol %d.%02d records no payload", ErrFormat, version>>8, version&0xff)
	}
	setupSects := int64(head[0x1f1])
	if setupSects == 0 {
		setupSects = 4 // the boot protocol's rule for old images
	}
	p := Payload{
		Offset: (setupSects+1)*512 + int64(binary.LittleEndian.Uint32(head[0x248:])),
		Length: int64(binary.LittleEndian.Uint32(head[0x24c:])),
	}
	if p.Offset < 0 || p.Length < 8 || p.Offset > size || p.Length > size-p.Offset {
		return Payload{}, fmt.Errorf("%w: bzImage payload (offset %d, %d bytes) is outside the %d-byte file", ErrFormat, p.Offset, p.Length, size)
	}
	lead := make([]byte, 8)
	if _, err := r.ReadAt(lead, p.Offset); err != nil && !errors.Is(err, io.EOF) {
		return Payload{}, fmt.Errorf("%w: read the payload: %v", ErrFormat, err)
	}
	p.Compression = CompressionOf(lead)
	var trailer [4]byte
	if _, err := r.ReadAt(trailer[:], p.Offset+p.Length-4); err != nil && !errors.Is(err, io.EOF) {
		return Payload{}, fmt.Errorf("%w: read the payload's size: %v", ErrFormat, err)
	}
	p.Unpacked = binary.LittleEndian.Uint32(trailer[:])
	return p, nil
}

// Decompressor returns a reader of the unpacked payload. The kernel's
// payloads carry a size trailer after the compressed stream; callers read
// exactly Payload.Unpacked bytes and never ask the stream for its end.
func Decompressor(compression string, r io.Reader) (io.Reader, error) {
	switch compression {
	case Gzip:
		return gzip.NewReader(r)
	case Bzip2:
		return bzip2.NewReader(r), nil
	case Zstd:
		d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(MaxUnpacked))
		if err != nil {
			return nil, err
		}
		return d.IOReadCloser(), nil
	case XZ:
		return xz.NewReader(r)
	case LZ4:
		return lz4.NewReader(r), nil
	case "":
		return nil, fmt.Errorf("%w: the bzImage payload has an unknown compression", ErrFormat)
	default:
		return nil, fmt.Errorf("%w: %s-compressed kernels cannot be unpacked here (gzip, bzip2, zstd, xz and lz4 can)", ErrFormat, compression)
	}
}
