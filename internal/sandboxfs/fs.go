package sandboxfs

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// FS is the file system the operations run on. Names are slash-separated
// and relative to the sandbox's root ("." is the root itself, "etc/hosts"
// is /etc/hosts). *os.Root implements it, confined to its directory; Dir
// implements it over plain paths.
type FS interface {
	Open(name string) (*os.File, error)
	OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error)
	Stat(name string) (fs.FileInfo, error)
	Lstat(name string) (fs.FileInfo, error)
	Mkdir(name string, perm fs.FileMode) error
	MkdirAll(name string, perm fs.FileMode) error
	Remove(name string) error
	RemoveAll(name string) error
	Rename(oldname, newname string) error
	Chmod(name string, mode fs.FileMode) error
	Chown(name string, uid, gid int) error
	Lchown(name string, uid, gid int) error
	Readlink(name string) (string, error)
	Symlink(oldname, newname string) error
}

var _ FS = (*os.Root)(nil)

// Dir is a directory served over plain paths: symbolic links are followed
// as the kernel follows them, wherever they lead. It is for a sandbox whose
// boundary is elsewhere (the guest agent inside a VM serves "/").
type Dir string

func (d Dir) path(name string) string {
	root := string(d)
	if root == "" {
		root = "/"
	}
	return filepath.Join(root, filepath.FromSlash(name))
}

// Open implements FS.
func (d Dir) Open(name string) (*os.File, error) { return os.Open(d.path(name)) }

// OpenFile implements FS.
func (d Dir) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	return os.OpenFile(d.path(name), flag, perm)
}

// Stat implements FS.
func (d Dir) Stat(name string) (fs.FileInfo, error) { return os.Stat(d.path(name)) }

// Lstat implements FS.
func (d Dir) Lstat(name string) (fs.FileInfo, error) { return os.Lstat(d.path(name)) }

// Mkdir implements FS.
func (d Dir) Mkdir(name string, perm fs.FileMode) error { return os.Mkdir(d.path(name), perm) }

// MkdirAll implements FS.
func (d Dir) MkdirAll(name string, perm fs.FileMode) error { return os.MkdirAll(d.path(name), perm) }

// Remove implements FS.
func (d Dir) Remove(name string) error { return os.Remove(d.path(name)) }

// RemoveAll implements FS.
func (d Dir) RemoveAll(name string) error { return os.RemoveAll(d.path(name)) }

// Rename implements FS.
func (d Dir) Rename(oldname, newname string) error {
	return os.Rename(d.path(oldname), d.path(newname))
}

// Chmod implements FS.
func (d Dir) Chmod(name string, mode fs.FileMode) error { return os.Chmod(d.path(name), mode) }

// Chown implements FS.
func (d Dir) Chown(name string, uid, gid int) error { return os.Chown(d.path(name), uid, gid) }

// Lchown implements FS.
func (d Dir) Lchown(name string, uid, gid int) error { return os.Lchown(d.path(name), uid, gid) }

// Readlink implements FS.
func (d Dir) Readlink(name string) (string, error) { return os.Readlink(d.path(name)) }

// Symlink implements FS. oldname is the link's target, kept as given.
func (d Dir) Symlink(oldname, newname string) error { return os.Symlink(oldname, d.path(newname)) }

// Tree serves the operations on an FS. Home is the sandbox path relative
// paths are resolved against.
//
// Tree is safe for concurrent use; operations on the same paths race the
// way they would in any filesystem.
type Tree struct {
	fsys FS
	home string
}

// NewTree serves fsys; relative paths resolve against home ("/" when empty
// or not absolute).
func NewTree(fsys FS, home string) *Tree {
	if home == "" || !path.IsAbs(home) {
		home = "/"
	}
	return &Tree{fsys: fsys, home: path.Clean(home)}
}

// Resolve turns a sandbox path into the root-relative name FS takes and
// the cleaned absolute sandbox path used in replies and messages.
// Cleaning is lexical, so "/../x" is "/x": ".." cannot climb above the
// sandbox's root.
func (t *Tree) Resolve(p string) (name, display string) {
	if !path.IsAbs(p) {
		p = path.Join(t.home, p)
	}
	display = path.Clean(p)
	if display == "/" {
		return ".", "/"
	}
	return display[1:], display
}

// resolve is Resolve for a request field, refusing what no filesystem
// could name.
func (t *Tree) resolve(op, field, p string) (name, display string, err error) {
	if p == "" {
		return "", "", invalid(op, "%s is required", field)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", "", invalid(op, "%s holds a NUL byte", field)
	}
	name, display = t.Resolve(p)
	return name, display, nil
}

// show is the sandbox path of a root-relative name.
func show(name string) string {
	if name == "." || name == "" {
		return "/"
	}
	return "/" + name
}

// FileMode converts Unix permission bits (0o7777) into Go's, whose
// setuid, setgid and sticky bits are not the Unix ones.
func FileMode(m uint32) fs.FileMode {
	fm := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		fm |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}

// UnixMode is the reverse of FileMode: the permission bits of fm.
func UnixMode(fm fs.FileMode) uint32 {
	m := uint32(fm.Perm())
	if fm&fs.ModeSetuid != 0 {
		m |= 0o4000
	}
	if fm&fs.ModeSetgid != 0 {
		m |= 0o2000
	}
	if fm&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	return m
}

// Entry describes one path, as ls and stat report it.
type Entry struct {
	Name      string
	IsDir     bool
	Size      int64
	Mode      uint32 // Unix permission bits, 0o7777 at most
	Mtime     int64  // seconds since the epoch
	IsSymlink bool
}

// EntryOf describes info as an Entry named name.
func EntryOf(name string, info fs.FileInfo) Entry {
	return Entry{
		Name:      name,
		IsDir:     info.IsDir(),
		Size:      max(info.Size(), 0),
		Mode:      UnixMode(info.Mode()),
		Mtime:     info.ModTime().Unix(),
		IsSymlink: info.Mode()&fs.ModeSymlink != 0,
	}
}
