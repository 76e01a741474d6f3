//go:build unix

package selfupdate

import (
	"os"
	"syscall"
)

// keepOwner gives the staged binary the installed one's owner and group
// when they differ (an update run with sudo on a user's own install must
// not leave a binary that user can no longer replace). Only a privileged
// user can change them, and failing to is no reason to stop: the mode is
// what makes the binary work.
func keepOwner(f *os.File, old os.FileInfo) {
	st, ok := old.Sys().(*syscall.Stat_t)
	if !ok {
		return
	}
	cur, err := f.Stat()
	if err != nil {
		return
	}
	if now, ok := cur.Sys().(*syscall.Stat_t); ok && now.Uid == st.Uid && now.Gid == st.Gid {
		return
	}
	_ = f.Chown(int(st.Uid), int(st.Gid))
}
