package workervm

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// How copyDisk copied a disk, for the worker's log.
const (
	copyReflink = "reflink"
	copySparse  = "sparse copy"
)

// copyDisk copies the disk image src to dst, which it creates (and which
// must not exist): a reflink (FICLONE) when the filesystem shares blocks
// between files, else a copy of src's data extents only (SEEK_DATA and
// SEEK_HOLE), so a mostly empty 1 GiB disk costs what it holds, and its
// holes stay holes. data is how many bytes were copied (0 for a reflink).
// dst is not synced: the caller decides whether it must survive a crash.
func copyDisk(src, dst string) (method string, data int64, err error) {
	in, err := os.Open(src)
	if err != nil {
		return "", 0, err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return "", 0, err
	}
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", 0, err
	}
	ok := false
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err, ok = cerr, false
		}
		if !ok {
			_ = os.Remove(dst)
		}
	}()
	if cloneFile(out, in) == nil {
		ok = true
		return copyReflink, 0, nil
	}
	if err := out.Truncate(fi.Size()); err != nil {
		return "", 0, err
	}
	segs, err := dataSegments(in, fi.Size())
	if err != nil {
		return "", 0, err
	}
	for _, s := range segs {
		if err := copyRange(out, in, s.off, s.n); err != nil {
			return "", 0, fmt.Errorf("copy bytes %d to %d: %w", s.off, s.off+s.n, err)
		}
		data += s.n
	}
	ok = true
	return copySparse, data, nil
}

// segment is a run of a file's bytes.
type segment struct{ off, n int64 }

// dataSegments lists the runs of f that hold data, by SEEK_DATA and
// SEEK_HOLE; a filesystem that cannot tell reports the whole file as one.
func dataSegments(f *os.File, size int64) ([]segment, error) {
	var out []segment
	for off := int64(0); off < size; {
		start, err := f.Seek(off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole remains
		}
		if err != nil {
			if len(out) == 0 && off == 0 && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTSUP)) {
				return []segment{{0, size}}, nil
			}
			return nil, fmt.Errorf("seek data from %d: %w", off, err)
		}
		end, err := f.Seek(start, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("seek hole from %d: %w", start, err)
		}
		end = min(end, size)
		if end > start {
			out = append(out, segment{start, end - start})
		}
		off = end
	}
	return out, nil
}

// copyRangeBuffered copies n bytes at off from in to out by reads and
// writes, leaving a hole for each all-zero block: the portable path.
func copyRangeBuffered(out, in *os.File, off, n int64) error {
	const block = 1 << 20
	buf := make([]byte, block)
	for done := int64(0); done < n; {
		m := min(int64(block), n-done)
		if _, err := io.ReadFull(io.NewSectionReader(in, off+done, m), buf[:m]); err != nil {
			return err
		}
		if !allZero(buf[:m]) {
			if _, err := out.WriteAt(buf[:m], off+done); err != nil {
				return err
			}
		}
		done += m
	}
	return nil
}

func allZero(p []byte) bool {
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}
