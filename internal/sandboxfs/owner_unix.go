//go:build unix

package sandboxfs

import (
	"io/fs"
	"syscall"
)

// owner is the uid and gid of a file, where the platform reports them.
func owner(st fs.FileInfo) (uid, gid int, ok bool) {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return int(sys.Uid), int(sys.Gid), true
}
