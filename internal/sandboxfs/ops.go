package sandboxfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"
)

// Ls lists a directory's entries sorted by name; symbolic links are
// reported, not followed.
func (t *Tree) Ls(ctx context.Context, p string) ([]Entry, error) {
	name, display, err := t.resolve("ls", "path", p)
	if err != nil {
		return nil, err
	}
	f, err := t.fsys.Open(name)
	if err != nil {
		return nil, FromOS(display, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, FromOS(display, err)
	}
	if !st.IsDir() {
		return nil, errorf(KindWrongType, "not a directory: %s (use sandbox::fs::stat for a file)", display)
	}
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, FromOS(display, err)
	}
	out := make([]Entry, 0, len(ents))
	for _, d := range ents {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		info, err := d.Info()
		if err != nil {
			continue // removed between the listing and the stat
		}
		out = append(out, EntryOf(d.Name(), info))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Stat describes one path; a symbolic link describes itself.
func (t *Tree) Stat(_ context.Context, p string) (Entry, error) {
	name, display, err := t.resolve("stat", "path", p)
	if err != nil {
		return Entry{}, err
	}
	info, err := t.fsys.Lstat(name)
	if err != nil {
		return Entry{}, FromOS(display, err)
	}
	return EntryOf(path.Base(display), info), nil
}

// checkParent reports a missing parent directory (fixable says whether
// {"parents": true} would help) and a parent that is not a directory.
func (t *Tree) checkParent(name, display string, fixable bool) error {
	dir := path.Dir(name)
	if dir == "." {
		return nil
	}
	st, err := t.fsys.Stat(dir)
	switch {
	case err == nil && !st.IsDir():
		return errorf(KindWrongType, "not a directory: %s, or one of its parents, is a file", path.Dir(display))
	case errors.Is(err, fs.ErrNotExist):
		return parentNotFound(display, fixable)
	case errors.Is(err, syscall.ENOTDIR):
		return errorf(KindWrongType, "not a directory: %s, or one of its parents, is a file", path.Dir(display))
	case err != nil:
		return FromOS(display, err)
	}
	return nil
}

// mkdirAll is MkdirAll, reporting a file in the way as the wrong type
// rather than as something that already exists.
func (t *Tree) mkdirAll(name string, perm fs.FileMode) error {
	err := t.fsys.MkdirAll(name, perm)
	if errors.Is(err, fs.ErrExist) {
		return &fs.PathError{Op: "mkdir", Path: name, Err: syscall.ENOTDIR}
	}
	return err
}

// Mkdir creates a directory with mode (Unix bits, applied exactly, not
// masked by the umask). Without parents, a missing parent is not found
// (fixable) and an existing path already exists; with parents it behaves
// like mkdir -p: an existing directory is created=false, and a file in the
// way is the wrong type.
func (t *Tree) Mkdir(_ context.Context, p string, mode uint32, parents bool) (created bool, err error) {
	name, display, err := t.resolve("mkdir", "path", p)
	if err != nil {
		return false, err
	}
	if parents {
		if st, err := t.fsys.Stat(name); err == nil {
			if !st.IsDir() {
				return false, errorf(KindWrongType, "not a directory: %s, or one of its parents, is a file", display)
			}
			return false, nil
		}
		if dir := path.Dir(name); dir != "." {
			if err := t.mkdirAll(dir, 0o755); err != nil {
				return false, FromOS(display, err)
			}
		}
	} else {
		if _, err := t.fsys.Lstat(name); err == nil {
			return false, errorf(KindExists, "path already exists: %s", display)
		}
		if err := t.checkParent(name, display, true); err != nil {
			return false, err
		}
	}
	if err := t.fsys.Mkdir(name, 0o700); err != nil {
		return false, FromOS(display, err)
	}
	// The umask shaped the mode at creation; set the one asked for.
	if err := t.fsys.Chmod(name, FileMode(mode)); err != nil {
		return false, FromOS(display, err)
	}
	return true, nil
}

// tempName is a name beside name for a file being prepared. It needs to
// be unlikely, not secret (O_EXCL settles collisions), so it comes from
// math/rand: crypto/rand could block on an early-boot entropy pool in a
// VM. The base is shortened so a name near the 255-byte limit still has
// room for a temporary sibling.
func tempName(name, tag string) string {
	dir, base := path.Split(name)
	if len(base) > 64 {
		base = base[:64]
	}
	return dir + fmt.Sprintf(".%s.iii-%s-%012x", base, tag, rand.Uint64()&0xffffffffffff)
}

// createTemp creates a new file beside name, readable only by its owner
// until it is complete.
func (t *Tree) createTemp(name, tag string) (string, *os.File, error) {
	for try := 0; ; try++ {
		tmp := tempName(name, tag)
		f, err := t.fsys.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) && try < 10 {
			continue
		}
		return tmp, f, err
	}
}

// errSink marks a failure to write the file, told apart from a failure to
// read the content stream.
type errSink struct{ err error }

func (e errSink) Error() string { return e.err.Error() }
func (e errSink) Unwrap() error { return e.err }

// copyCtx copies r to w until EOF or ctx ends.
func copyCtx(ctx context.Context, w io.Writer, r io.Reader) (int64, error) {
	buf := make([]byte, 64<<10)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		k, rerr := r.Read(buf)
		if k > 0 {
			if _, err := w.Write(buf[:k]); err != nil {
				return n, errSink{err}
			}
			n += int64(k)
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

// Write stores what content yields at p with mode (Unix bits, exact): into
// a temporary file beside it, synced and renamed over the target, so a
// reader never sees half a file and the file is a new inode. With parents,
// missing directories are created (0755); without, a missing parent is not
// found (fixable). A failure to read content is KindAborted, with the
// reader's error as Cause.
func (t *Tree) Write(ctx context.Context, p string, mode uint32, parents bool, content io.Reader) (n int64, display string, err error) {
	name, display, err := t.resolve("write", "path", p)
	if err != nil {
		return 0, "", err
	}
	if name == "." {
		return 0, "", errorf(KindWrongType, "is a directory: /")
	}
	if parents {
		if dir := path.Dir(name); dir != "." {
			if err := t.mkdirAll(dir, 0o755); err != nil {
				return 0, "", FromOS(path.Dir(display), err)
			}
		}
	} else if err := t.checkParent(name, display, true); err != nil {
		return 0, "", err
	}
	if st, err := t.fsys.Stat(name); err == nil && st.IsDir() {
		return 0, "", errorf(KindWrongType, "is a directory: %s", display)
	}
	tmp, f, err := t.createTemp(name, "write")
	if err != nil {
		return 0, "", FromOS(display, err)
	}
	done := false
	defer func() {
		if !done {
			_ = f.Close()
			_ = t.fsys.Remove(tmp)
		}
	}()
	if content == nil {
		content = strings.NewReader("")
	}
	n, err = copyCtx(ctx, f, content)
	if err != nil {
		var sink errSink
		if errors.As(err, &sink) {
			return 0, "", FromOS(display, sink.err)
		}
		return 0, "", &Error{Kind: KindAborted, Message: fmt.Sprintf("write %s: the content stream failed after %d bytes: %v", display, n, err), Cause: err}
	}
	if err := f.Sync(); err != nil {
		return 0, "", FromOS(display, err)
	}
	if err := f.Close(); err != nil {
		done = true
		_ = t.fsys.Remove(tmp)
		return 0, "", FromOS(display, err)
	}
	done = true
	// An explicit chmod, because the create mode is filtered by the umask.
	if err := t.fsys.Chmod(tmp, FileMode(mode)); err != nil {
		_ = t.fsys.Remove(tmp)
		return 0, "", FromOS(display, err)
	}
	if err := t.fsys.Rename(tmp, name); err != nil {
		_ = t.fsys.Remove(tmp)
		return 0, "", FromOS(display, err)
	}
	return n, display, nil
}

// FileMeta is what read reports about a file before its bytes.
type FileMeta struct {
	Size  int64
	Mode  uint32
	Mtime int64
}

// Read opens a regular file to stream; the caller closes it.
func (t *Tree) Read(_ context.Context, p string) (FileMeta, *os.File, error) {
	name, display, err := t.resolve("read", "path", p)
	if err != nil {
		return FileMeta{}, nil, err
	}
	f, err := t.fsys.Open(name)
	if err != nil {
		return FileMeta{}, nil, FromOS(display, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return FileMeta{}, nil, FromOS(display, err)
	}
	if st.IsDir() {
		f.Close()
		return FileMeta{}, nil, errorf(KindWrongType, "is a directory: %s (use sandbox::fs::ls)", display)
	}
	if !st.Mode().IsRegular() {
		// A FIFO or device would block or never end.
		f.Close()
		return FileMeta{}, nil, errorf(KindWrongType, "not a regular file: %s", display)
	}
	return FileMeta{Size: max(st.Size(), 0), Mode: UnixMode(st.Mode()), Mtime: st.ModTime().Unix()}, f, nil
}

// Rm removes a file, a symbolic link, an empty directory, or with
// recursive a whole tree. The sandbox's root cannot be removed: that is an
// invalid request.
func (t *Tree) Rm(_ context.Context, p string, recursive bool) error {
	name, display, err := t.resolve("rm", "path", p)
	if err != nil {
		return err
	}
	if name == "." {
		return invalid("rm", "the sandbox's root directory cannot be removed")
	}
	st, err := t.fsys.Lstat(name)
	if err != nil {
		return FromOS(display, err)
	}
	if recursive {
		err = t.fsys.RemoveAll(name)
	} else {
		err = t.fsys.Remove(name)
		if st.IsDir() && (errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTEMPTY)) {
			// Some systems report a non-empty directory as EEXIST.
			return errorf(KindNotEmpty, "directory not empty: %s (pass recursive: true)", display)
		}
	}
	return FromOS(display, err)
}

// Chmod sets mode (Unix bits) and, when uid or gid is not -1, the owner of
// p, following a symbolic link there; with recursive, of everything
// beneath a directory too, where symbolic links are left alone. It reports
// how many paths it changed.
func (t *Tree) Chmod(ctx context.Context, p string, mode uint32, uid, gid int, recursive bool) (int64, error) {
	name, display, err := t.resolve("chmod", "path", p)
	if err != nil {
		return 0, err
	}
	if uid < -1 || gid < -1 {
		return 0, invalid("chmod", "uid and gid must not be negative")
	}
	fm := FileMode(mode)
	apply := func(n string) error {
		// Owner first: chown clears the setuid and setgid bits.
		if uid != -1 || gid != -1 {
			if err := t.fsys.Chown(n, uid, gid); err != nil {
				return FromOS(show(n), err)
			}
		}
		if err := t.fsys.Chmod(n, fm); err != nil {
			return FromOS(show(n), err)
		}
		return nil
	}
	st, err := t.fsys.Stat(name)
	if err != nil {
		return 0, FromOS(display, err)
	}
	if !recursive || !st.IsDir() {
		if err := apply(name); err != nil {
			return 0, err
		}
		return 1, nil
	}
	if err := apply(name); err != nil {
		return 0, err
	}
	updated := int64(1)
	err = t.walk(ctx, name, func(n string, d fs.DirEntry) (bool, error) {
		if d.Type()&fs.ModeSymlink != 0 {
			return false, nil
		}
		if err := apply(n); err != nil {
			return false, err
		}
		updated++
		return false, nil
	})
	if err != nil {
		return updated, err
	}
	return updated, nil
}

// Mv renames src to dst, copying across filesystems when the two are on
// different ones. An existing dst is refused unless overwrite; with
// overwrite a directory replaces only an (empty) directory and a file only
// a file. A directory cannot move into itself, and the sandbox's root
// cannot move or be replaced.
func (t *Tree) Mv(_ context.Context, srcPath, dstPath string, overwrite bool) error {
	src, srcShown, err := t.resolve("mv", "src", srcPath)
	if err != nil {
		return err
	}
	dst, dstShown, err := t.resolve("mv", "dst", dstPath)
	if err != nil {
		return err
	}
	if src == "." || dst == "." {
		return errorf(KindPermission, "permission denied: the sandbox's root directory cannot be moved or replaced")
	}
	sst, err := t.fsys.Lstat(src)
	if err != nil {
		return FromOS(srcShown, err)
	}
	if src == dst {
		return nil
	}
	if sst.IsDir() && strings.HasPrefix(dst+"/", src+"/") {
		return invalid("mv", "cannot move %s into itself (%s)", srcShown, dstShown)
	}
	// mv has no parents field, so a missing parent is not fixable.
	if err := t.checkParent(dst, dstShown, false); err != nil {
		return err
	}
	if dst2, err := t.fsys.Lstat(dst); err == nil {
		switch {
		case !overwrite:
			return errorf(KindExists, "path already exists: %s (pass overwrite: true to replace it)", dstShown)
		case dst2.IsDir() && !sst.IsDir():
			return errorf(KindWrongType, "is a directory: %s cannot be replaced by the file %s", dstShown, srcShown)
		case !dst2.IsDir() && sst.IsDir():
			return errorf(KindWrongType, "not a directory: %s cannot be replaced by the directory %s", dstShown, srcShown)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return FromOS(dstShown, err)
	}
	err = t.fsys.Rename(src, dst)
	if errors.Is(err, syscall.EXDEV) {
		err = t.moveAcross(src, dst, sst)
	}
	if sst.IsDir() && (errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTEMPTY)) {
		// rename(2) may say either for a non-empty target directory.
		return errorf(KindNotEmpty, "directory not empty: %s", dstShown)
	}
	return FromOS(dstShown, err)
}

// moveAcross copies src to another filesystem, then removes it. The copy
// goes to a temporary name first so a failure leaves dst as it was.
func (t *Tree) moveAcross(src, dst string, st fs.FileInfo) error {
	tmp := tempName(dst, "mv")
	if err := t.copyTree(src, tmp, st); err != nil {
		_ = t.fsys.RemoveAll(tmp)
		return err
	}
	if dt, err := t.fsys.Lstat(dst); err == nil && dt.IsDir() {
		// rename(2) onto a directory needs it empty, as a same-filesystem
		// mv would; Remove fails on a non-empty one.
		if err := t.fsys.Remove(dst); err != nil {
			_ = t.fsys.RemoveAll(tmp)
			return err
		}
	}
	if err := t.fsys.Rename(tmp, dst); err != nil {
		_ = t.fsys.RemoveAll(tmp)
		return err
	}
	return t.fsys.RemoveAll(src)
}

func (t *Tree) copyTree(src, dst string, st fs.FileInfo) error {
	switch {
	case st.Mode()&fs.ModeSymlink != 0:
		target, err := t.fsys.Readlink(src)
		if err != nil {
			return err
		}
		return t.fsys.Symlink(target, dst)
	case st.IsDir():
		if err := t.fsys.Mkdir(dst, 0o700); err != nil {
			return err
		}
		ents, err := t.readDir(src)
		if err != nil {
			return err
		}
		for _, d := range ents {
			info, err := d.Info()
			if err != nil {
				return err
			}
			if err := t.copyTree(path.Join(src, d.Name()), path.Join(dst, d.Name()), info); err != nil {
				return err
			}
		}
		return t.fsys.Chmod(dst, st.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
	case st.Mode().IsRegular():
		in, err := t.fsys.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := t.fsys.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			_ = out.Close()
			return err
		}
		if err := out.Sync(); err != nil {
			_ = out.Close()
			return err
		}
		if err := out.Close(); err != nil {
			return err
		}
		return t.fsys.Chmod(dst, st.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
	}
	return &fs.PathError{Op: "mv", Path: src, Err: errors.New("a special file cannot be moved across filesystems")}
}

// readDir lists a directory sorted by name.
func (t *Tree) readDir(name string) ([]fs.DirEntry, error) {
	f, err := t.fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	return ents, err
}

// walk calls fn for everything beneath the directory name (not name
// itself), depth first in lexical order, without following symbolic links.
// fn returns skip to leave a directory out. An unreadable directory below
// name is skipped; name itself being unreadable is an error.
func (t *Tree) walk(ctx context.Context, name string, fn func(n string, d fs.DirEntry) (skip bool, err error)) error {
	ents, err := t.readDir(name)
	if err != nil {
		return FromOS(show(name), err)
	}
	var rec func(dir string, ents []fs.DirEntry) error
	rec = func(dir string, ents []fs.DirEntry) error {
		for _, d := range ents {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := d.Name()
			if dir != "." {
				n = dir + "/" + n
			}
			skip, err := fn(n, d)
			if err != nil {
				return err
			}
			if skip || !d.IsDir() {
				continue
			}
			sub, err := t.readDir(n)
			if err != nil {
				// An unreadable corner of the tree is skipped, as grep
				// -r skips it with a warning.
				continue
			}
			if err := rec(n, sub); err != nil {
				return err
			}
		}
		return nil
	}
	return rec(name, ents)
}
