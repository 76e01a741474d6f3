//go:build unix

package ownfile

import (
	"io/fs"
	"os"
	"syscall"
)

// OpenNoFollow opens path for reading without following a final symbolic
// link.
func OpenNoFollow(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
}

// Owner is the uid that owns the file; false where the system has none.
func Owner(fi fs.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
