package workervm

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// cloneFile makes out share in's blocks (FICLONE): btrfs, XFS with
// reflink, bcachefs. Elsewhere it fails (EOPNOTSUPP, EXDEV, EINVAL) and
// the caller copies.
func cloneFile(out, in *os.File) error {
	return unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
}

// copyRange copies n bytes at off from in to the same offset of out in the
// kernel (copy_file_range), falling back to reads and writes where the
// kernel or the filesystems cannot.
func copyRange(out, in *os.File, off, n int64) error {
	roff, woff := off, off
	for n > 0 {
		c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(min(n, 1<<30)), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				return copyRangeBuffered(out, in, roff, n)
			}
			return err
		}
		if c == 0 {
			return errors.New("copy_file_range copied nothing before the end of the range")
		}
		n -= int64(c)
	}
	return nil
}
