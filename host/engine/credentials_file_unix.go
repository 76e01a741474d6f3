//go:build unix

package engine

import (
	"io/fs"
	"os"
	"syscall"
)

// openNoFollow opens path for reading without following a final symbolic
// link.
func openNoFollow(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
}

// fileOwner is the uid that owns the file.
func fileOwner(fi fs.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
