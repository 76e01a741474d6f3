// Package initramfs builds the initramfs a sandbox VM boots: the guest
// agent as /init, the kernel modules it needs (dependencies resolved from
// modules.dep, in load order) and a manifest of that order, as an
// uncompressed newc cpio archive, cached by content hash.
package initramfs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
)

// File-type bits of a cpio mode (as in st_mode).
const (
	ModeDir     = 0o040000
	ModeRegular = 0o100000
	ModeSymlink = 0o120000
	ModeCharDev = 0o020000
	modeType    = 0o170000
)

const (
	newcMagic   = "070701"
	headerLen   = 110
	trailerName = "TRAILER!!!"
	// maxName bounds a name the reader accepts (PATH_MAX).
	maxName = 4096
)

// Header describes one cpio entry.
type Header struct {
	Name      string // relative, slash-separated, no leading "/"
	Mode      uint32 // type and permission bits
	UID, GID  uint32
	NLink     uint32
	Mtime     uint32
	Size      int64
	RDevMajor uint32
	RDevMinor uint32
}

// Writer writes a newc ("070701") cpio archive, the format the kernel
// unpacks into its initial root. Parent directories of every entry are
// written first when the caller has not, because the kernel does not create
// them. Every mtime is zero, so equal inputs give equal archives.
type Writer struct {
	w      *bufio.Writer
	ino    uint32
	dirs   map[string]bool
	names  map[string]bool
	closed bool
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriterSize(w, 256<<10), dirs: map[string]bool{".": true}, names: map[string]bool{}}
}

func cleanName(name string) (string, error) {
	n := strings.TrimPrefix(name, "/")
	if n == "" || strings.IndexByte(n, 0) >= 0 || path.Clean(n) != n || n == ".." || strings.HasPrefix(n, "../") {
		return "", fmt.Errorf("cpio: bad entry name %q", name)
	}
	if len(n) >= maxName {
		return "", fmt.Errorf("cpio: entry name too long (%d bytes)", len(n))
	}
	return n, nil
}

func (w *Writer) parents(name string) error {
	dir := path.Dir(name)
	if w.dirs[dir] {
		return nil
	}
	if err := w.parents(dir); err != nil {
		return err
	}
	return w.writeEntry(Header{Name: dir, Mode: ModeDir | 0o755, NLink: 2}, nil)
}

func (w *Writer) add(h Header, data io.Reader) error {
	if w.closed {
		return errors.New("cpio: write after close")
	}
	name, err := cleanName(h.Name)
	if err != nil {
		return err
	}
	h.Name = name
	if w.names[name] {
		return fmt.Errorf("cpio: duplicate entry %q", name)
	}
	if err := w.parents(name); err != nil {
		return err
	}
	return w.writeEntry(h, data)
}

func (w *Writer) writeEntry(h Header, data io.Reader) error {
	w.ino++
	if h.NLink == 0 {
		h.NLink = 1
	}
	if h.Size < 0 || h.Size > 0xffffffff {
		return fmt.Errorf("cpio: %s: size %d does not fit newc", h.Name, h.Size)
	}
	fields := []uint32{
		w.ino, h.Mode, h.UID, h.GID, h.NLink, h.Mtime, uint32(h.Size),
		0, 0, h.RDevMajor, h.RDevMinor, uint32(len(h.Name) + 1), 0,
	}
	var hdr strings.Builder
	hdr.WriteString(newcMagic)
	for _, f := range fields {
		fmt.Fprintf(&hdr, "%08X", f)
	}
	hdr.WriteString(h.Name)
	hdr.WriteByte(0)
	for (hdr.Len())%4 != 0 {
		hdr.WriteByte(0)
	}
	if _, err := w.w.WriteString(hdr.String()); err != nil {
		return err
	}
	if h.Size > 0 {
		n, err := io.CopyN(w.w, data, h.Size)
		if err != nil {
			return fmt.Errorf("cpio: %s: wrote %d of %d bytes: %w", h.Name, n, h.Size, err)
		}
	}
	if pad := (4 - h.Size%4) % 4; pad > 0 {
		if _, err := w.w.Write(make([]byte, pad)); err != nil {
			return err
		}
	}
	if h.Mode&modeType == ModeDir {
		w.dirs[h.Name] = true
	}
	w.names[h.Name] = true
	return nil
}

// Mkdir adds a directory.
func (w *Writer) Mkdir(name string, perm uint32) error {
	n, err := cleanName(name)
	if err == nil && w.dirs[n] {
		return nil
	}
	return w.add(Header{Name: name, Mode: ModeDir | perm&0o7777, NLink: 2}, nil)
}

// WriteFile adds a regular file of size bytes read from r.
func (w *Writer) WriteFile(name string, perm uint32, size int64, r io.Reader) error {
	return w.add(Header{Name: name, Mode: ModeRegular | perm&0o7777, Size: size}, r)
}

// Symlink adds a symbolic link.
func (w *Writer) Symlink(name, target string) error {
	if target == "" {
		return fmt.Errorf("cpio: symlink %s has no target", name)
	}
	return w.add(Header{Name: name, Mode: ModeSymlink | 0o777, Size: int64(len(target))}, strings.NewReader(target))
}

// CharDev adds a character device node.
func (w *Writer) CharDev(name string, perm, major, minor uint32) error {
	return w.add(Header{Name: name, Mode: ModeCharDev | perm&0o7777, RDevMajor: major, RDevMinor: minor}, nil)
}

// Close writes the trailer and flushes. It does not close the underlying
// writer.
func (w *Writer) Close() error {
	if w.closed {
		return nil
	}
	if err := w.writeEntry(Header{Name: trailerName}, nil); err != nil {
		return err
	}
	w.closed = true
	return w.w.Flush()
}

// Entry is one entry read back from an archive.
type Entry struct {
	Header
	Data []byte // contents of regular files and symlink targets
}

// ReadAll reads a newc archive up to its trailer. It keeps at most
// maxTotal bytes of file data in memory and fails beyond that.
func ReadAll(r io.Reader, maxTotal int64) ([]Entry, error) {
	br := bufio.NewReader(r)
	var out []Entry
	var total int64
	var off int64
	for {
		var hdr [headerLen]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return out, fmt.Errorf("cpio: header at %d: %w", off, err)
		}
		off += headerLen
		if string(hdr[:6]) != newcMagic {
			return out, fmt.Errorf("cpio: bad magic %q at %d", hdr[:6], off-headerLen)
		}
		var f [13]uint32
		for i := range f {
			v, err := strconv.ParseUint(string(hdr[6+8*i:14+8*i]), 16, 32)
			if err != nil {
				return out, fmt.Errorf("cpio: bad header field %d at %d", i, off-headerLen)
			}
			f[i] = uint32(v)
		}
		nameSize := int64(f[11])
		if nameSize < 1 || nameSize > maxName {
			return out, fmt.Errorf("cpio: name size %d out of range", nameSize)
		}
		namePad := (4 - (headerLen+nameSize)%4) % 4
		name := make([]byte, nameSize+namePad)
		if _, err := io.ReadFull(br, name); err != nil {
			return out, fmt.Errorf("cpio: name: %w", err)
		}
		off += int64(len(name))
		if name[nameSize-1] != 0 {
			return out, errors.New("cpio: name is not NUL-terminated")
		}
		e := Entry{Header: Header{
			Name: string(name[:nameSize-1]), Mode: f[1], UID: f[2], GID: f[3], NLink: f[4], Mtime: f[5],
			Size: int64(f[6]), RDevMajor: f[9], RDevMinor: f[10],
		}}
		if e.Name == trailerName {
			return out, nil
		}
		if total+e.Size > maxTotal {
			return out, fmt.Errorf("cpio: archive holds more than %d bytes", maxTotal)
		}
		total += e.Size
		dataPad := (4 - e.Size%4) % 4
		data := make([]byte, e.Size+dataPad)
		if _, err := io.ReadFull(br, data); err != nil {
			return out, fmt.Errorf("cpio: %s: data: %w", e.Name, err)
		}
		off += int64(len(data))
		e.Data = data[:e.Size]
		out = append(out, e)
	}
}
