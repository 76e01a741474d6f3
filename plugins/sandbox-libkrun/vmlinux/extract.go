package vmlinux

import (
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// xenPhys32Entry is XEN_ELFNOTE_PHYS32_ENTRY: the note that gives a kernel
// a PVH entry point, which QEMU needs to boot an ELF vmlinux directly.
const xenPhys32Entry = 18

// Info describes an ELF vmlinux.
type Info struct {
	// PVH is true when the kernel has a PVH entry point (CONFIG_PVH), so
	// QEMU (microvm, pc, q35) can boot the ELF directly.
	PVH bool
}

// InspectELF checks that r is an x86-64 executable ELF and looks for the
// PVH entry note. Malformed input is an error, never a panic.
func InspectELF(r io.ReaderAt) (info Info, err error) {
	defer func() {
		// debug/elf has panicked on hostile input in the past; an image
		// from the cache or the configuration must not take the adapter down.
		if p := recover(); p != nil {
			info, err = Info{}, fmt.Errorf("%w: malformed ELF: %v", ErrFormat, p)
		}
	}()
	f, err := elf.NewFile(r)
	if err != nil {
		return Info{}, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC {
		return Info{}, fmt.Errorf("%w: not an x86-64 executable ELF (class %v, machine %v, type %v)", ErrFormat, f.Class, f.Machine, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE || p.Filesz > 1<<20 {
			continue
		}
		data := make([]byte, p.Filesz)
		if _, err := p.ReadAt(data, 0); err != nil {
			return Info{}, fmt.Errorf("%w: read a note segment: %v", ErrFormat, err)
		}
		if hasNote(data, "Xen", xenPhys32Entry) {
			info.PVH = true
		}
	}
	return info, nil
}

// hasNote walks an ELF note segment (4-byte aligned entries: namesz,
// descsz, type, name, desc) for a note of the given owner and type.
func hasNote(data []byte, owner string, typ uint32) bool {
	align := func(n uint64) uint64 { return (n + 3) &^ 3 }
	for len(data) >= 12 {
		namesz := uint64(binary.LittleEndian.Uint32(data[0:]))
		descsz := uint64(binary.LittleEndian.Uint32(data[4:]))
		t := binary.LittleEndian.Uint32(data[8:])
		rest := uint64(len(data) - 12)
		if align(namesz) > rest || align(descsz) > rest-align(namesz) {
			return false
		}
		name := data[12 : 12+namesz]
		if len(name) > 0 && name[len(name)-1] == 0 {
			name = name[:len(name)-1]
		}
		if t == typ && string(name) == owner {
			return true
		}
		data = data[12+align(namesz)+align(descsz):]
	}
	return false
}

// Extract unpacks the vmlinux inside the bzImage at src into cacheDir,
// keyed by the bzImage's sha256, and returns its path and what it is. A
// cached vmlinux is reused. src may already be an ELF vmlinux: it is then
// returned as it is.
func Extract(ctx context.Context, src, cacheDir string) (string, Info, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", Info{}, err
	}
	defer f.Close()
	head := make([]byte, 4)
	if _, err := io.ReadFull(f, head); err == nil && IsELF(head) {
		info, err := InspectELF(f)
		return src, info, err
	}
	h := sha256.New()
	if _, err := io.Copy(h, ctxReader{ctx, f}); err != nil {
		return "", Info{}, fmt.Errorf("hash %s: %w", src, err)
	}
	dst := filepath.Join(cacheDir, "vmlinux-"+hex.EncodeToString(h.Sum(nil))[:32])
	if info, err := inspectFile(dst); err == nil {
		return dst, info, nil
	}

	fi, err := f.Stat()
	if err != nil {
		return "", Info{}, err
	}
	p, err := ParseBzImage(f, fi.Size())
	if err != nil {
		return "", Info{}, fmt.Errorf("%s: %w", src, err)
	}
	if p.Unpacked < 64 || p.Unpacked > MaxUnpacked {
		return "", Info{}, fmt.Errorf("%s: %w: the payload claims %d unpacked bytes (want 64 B to %d MiB)", src, ErrFormat, p.Unpacked, MaxUnpacked>>20)
	}
	dec, err := Decompressor(p.Compression, io.NewSectionReader(f, p.Offset, p.Length))
	if err != nil {
		return "", Info{}, fmt.Errorf("%s: %w", src, err)
	}
	if c, ok := dec.(io.Closer); ok {
		defer c.Close()
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", Info{}, err
	}
	tmp, err := os.CreateTemp(cacheDir, ".vmlinux-*")
	if err != nil {
		return "", Info{}, err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := io.CopyN(tmp, ctxReader{ctx, dec}, int64(p.Unpacked)); err != nil {
		_ = tmp.Close()
		if ctx.Err() != nil {
			return "", Info{}, ctx.Err()
		}
		return "", Info{}, fmt.Errorf("%s: %w: unpack the %s payload: %v", src, ErrFormat, p.Compression, err)
	}
	info, err := InspectELF(tmp)
	if err != nil {
		_ = tmp.Close()
		return "", Info{}, fmt.Errorf("%s: the unpacked payload: %w", src, err)
	}
	// QEMU maps the file: readable by everyone like the kernel in /boot
	// usually is not, but this is the cache of the user running the VMs.
	if err := tmp.Chmod(0o644); err != nil {
		_ = tmp.Close()
		return "", Info{}, err
	}
	// Written through before it is renamed: a crash never leaves a torn
	// vmlinux under its final name, and QEMU's mapping of it counts as
	// clean page cache, not as dirty memory of every VM.
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return "", Info{}, err
	}
	if err := tmp.Close(); err != nil {
		return "", Info{}, err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", Info{}, err
	}
	return dst, info, nil
}

func inspectFile(p string) (Info, error) {
	f, err := os.Open(p)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	return InspectELF(f)
}

// ctxReader ends a long copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// IsFormat reports whether err says the input was not a usable kernel
// image (as opposed to an I/O failure or a cancelled context).
func IsFormat(err error) bool { return errors.Is(err, ErrFormat) }
