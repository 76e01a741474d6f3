package ownfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Rules say what Read accepts.
type Rules struct {
	// MaxBytes bounds the content.
	MaxBytes int64
	// ForbiddenPerm are the permission bits the file may not have: 0o077
	// for a secret no other user may read, 0o022 for a file whose content
	// others must not be able to change.
	ForbiddenPerm fs.FileMode
	// FollowSymlinks reads through symbolic links (the target is checked)
	// for a file that is only ever read: what a link could redirect a
	// write to does not arise. Secret mounts (Kubernetes) are links.
	FollowSymlinks bool
	// RootMayOwn accepts a file root owns as well as this user's: root
	// can read and change anything anyway, and mounted secrets are root's.
	RootMayOwn bool
}

// Refusal names why a file was refused.
type Refusal int

const (
	// Symlink: the path is a symbolic link.
	Symlink Refusal = iota + 1
	// NotRegular: the path is a directory, device, socket or pipe.
	NotRegular
	// ForeignOwner: another user owns the file.
	ForeignOwner
	// OpenMode: the file has a forbidden permission bit.
	OpenMode
	// TooLarge: the content is over Rules.MaxBytes.
	TooLarge
)

// RefusedError is Read's answer for a file that breaks the rules. Its
// message reads after the file's name ("is a symbolic link"), so callers
// say which file and what to do.
type RefusedError struct {
	Why    Refusal
	Reason string
}

func (e *RefusedError) Error() string { return e.Reason }

// Read returns the content of the file at path, which must be a regular
// file (not a symbolic link, unless the rules follow them) owned by this
// user (or root, when the rules allow), without the forbidden permission
// bits and at most MaxBytes long. A missing file is an error
// that errors.Is(err, fs.ErrNotExist); a refused one is a *RefusedError.
func Read(path string, r Rules) ([]byte, error) {
	open := OpenNoFollow
	if r.FollowSymlinks {
		open = os.Open
	}
	f, err := open(path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) && !r.FollowSymlinks {
			if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
				return nil, &RefusedError{Symlink, "is a symbolic link; it must be a file of its own"}
			}
		}
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, &RefusedError{NotRegular, "is not a regular file"}
	}
	if uid, ok := Owner(fi); ok && uid != os.Getuid() && (uid != 0 || !r.RootMayOwn) {
		return nil, &RefusedError{ForeignOwner, fmt.Sprintf("is owned by uid %d, not by this user (uid %d)", uid, os.Getuid())}
	}
	if perm := fi.Mode().Perm(); perm&r.ForbiddenPerm != 0 {
		may := "read"
		if perm&r.ForbiddenPerm&0o022 != 0 {
			may = "change"
		}
		return nil, &RefusedError{OpenMode, fmt.Sprintf("has mode %04o: other users may %s it", perm, may)}
	}
	data, err := io.ReadAll(io.LimitReader(f, r.MaxBytes+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > r.MaxBytes {
		return nil, &RefusedError{TooLarge, fmt.Sprintf("is larger than %d bytes", r.MaxBytes)}
	}
	return data, nil
}
