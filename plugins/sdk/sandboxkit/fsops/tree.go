package fsops

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"

	"github.com/iii-sandbox/iii/contract"
)

// Tree serves the contract's filesystem operations on a directory opened
// as an *os.Root, which is the whole sandbox: the sandbox path "/" is the
// root's directory. os.Root confines every operation to it, so neither
// ".." nor a symbolic link can reach outside (such attempts are S215).
//
// Tree is safe for concurrent use; operations on the same paths race the
// way they would in any filesystem.
type Tree struct {
	root *os.Root
	home string
}

// NewTree serves root. home is the sandbox path relative paths are
// resolved against ("/" when empty).
func NewTree(root *os.Root, home string) *Tree {
	if home == "" || !path.IsAbs(home) {
		home = "/"
	}
	return &Tree{root: root, home: path.Clean(home)}
}

// Resolve turns a sandbox path into the root-relative name os.Root takes
// and the cleaned absolute sandbox path used in replies and messages.
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

// fileMode converts a contract mode into Go's, whose setuid, setgid and
// sticky bits are not the Unix ones.
func fileMode(m contract.Mode) fs.FileMode {
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

// Entry describes info as an FsEntry named name.
func Entry(name string, info fs.FileInfo) contract.FsEntry {
	size := info.Size()
	if size < 0 {
		size = 0
	}
	return contract.FsEntry{
		Name:      name,
		IsDir:     info.IsDir(),
		Size:      uint64(size),
		Mode:      contract.ModeFromFileMode(info.Mode()),
		Mtime:     info.ModTime().Unix(),
		IsSymlink: info.Mode()&fs.ModeSymlink != 0,
	}
}

// Ls serves fs::ls: the directory's entries sorted by name, symlinks not
// followed.
func (t *Tree) Ls(ctx context.Context, req *contract.FsLsRequest) (*contract.FsLsResponse, error) {
	name, display := t.Resolve(req.Path)
	f, err := t.root.Open(name)
	if err != nil {
		return nil, Error(display, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, Error(display, err)
	}
	if !st.IsDir() {
		return nil, contract.NewError(contract.S212, "not a directory: %s (use sandbox::fs::stat for a file)", display)
	}
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, Error(display, err)
	}
	out := &contract.FsLsResponse{Entries: make([]contract.FsEntry, 0, len(ents))}
	for _, d := range ents {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		info, err := d.Info()
		if err != nil {
			// Removed between the listing and the stat.
			continue
		}
		out.Entries = append(out.Entries, Entry(d.Name(), info))
	}
	sort.Slice(out.Entries, func(i, j int) bool { return out.Entries[i].Name < out.Entries[j].Name })
	return out, nil
}

// Stat serves fs::stat; a symbolic link describes itself.
func (t *Tree) Stat(_ context.Context, req *contract.FsStatRequest) (*contract.FsEntry, error) {
	name, display := t.Resolve(req.Path)
	info, err := t.root.Lstat(name)
	if err != nil {
		return nil, Error(display, err)
	}
	e := Entry(path.Base(display), info)
	return &e, nil
}

// parentMissing reports whether the directory that would hold name does
// not exist, which turns a not-found into S211 with fix {parents: true}.
func (t *Tree) parentMissing(name string) bool {
	dir := path.Dir(name)
	if dir == "." {
		return false
	}
	_, err := t.root.Stat(dir)
	return errors.Is(err, fs.ErrNotExist)
}

// Mkdir serves fs::mkdir. Without parents, a missing parent is S211 with
// fix {parents: true} and an existing path is S213; with parents, an
// existing directory is {created: false}, like mkdir -p.
func (t *Tree) Mkdir(_ context.Context, req *contract.FsMkdirRequest) (*contract.FsMkdirResponse, error) {
	name, display := t.Resolve(req.Path)
	mode := fileMode(req.Mode)
	if req.Parents {
		if st, err := t.root.Stat(name); err == nil {
			if !st.IsDir() {
				return nil, contract.NewError(contract.S212, "%s exists and is not a directory", display)
			}
			return &contract.FsMkdirResponse{Created: false}, nil
		}
		if err := t.mkdirAll(name, mode.Perm()|0o700); err != nil {
			return nil, Error(display, err)
		}
	} else if err := t.root.Mkdir(name, mode.Perm()|0o700); err != nil {
		if errors.Is(err, fs.ErrNotExist) && t.parentMissing(name) {
			return nil, contract.ParentNotFound(display)
		}
		return nil, Error(display, err)
	}
	// The umask shaped the mode at creation; set the one asked for.
	if err := t.root.Chmod(name, mode); err != nil {
		return nil, Error(display, err)
	}
	return &contract.FsMkdirResponse{Created: true}, nil
}

// mkdirAll is MkdirAll, reporting a file in the way as the wrong type
// (S212) rather than as something that already exists (S213).
func (t *Tree) mkdirAll(name string, perm fs.FileMode) error {
	err := t.root.MkdirAll(name, perm)
	if errors.Is(err, fs.ErrExist) {
		return &fs.PathError{Op: "mkdir", Path: name, Err: syscall.ENOTDIR}
	}
	return err
}

// Write serves fs::write: content replaces the file (created with mode,
// which is also applied to an existing file). Without parents, a missing
// parent is S211 with fix {parents: true}.
func (t *Tree) Write(ctx context.Context, req *contract.FsWriteRequest, content io.Reader) (*contract.FsWriteResponse, error) {
	name, display := t.Resolve(req.Path)
	if name == "." {
		return nil, contract.NewError(contract.S212, "is a directory: /")
	}
	if req.Parents {
		if dir := path.Dir(name); dir != "." {
			if err := t.mkdirAll(dir, 0o755); err != nil {
				return nil, Error(path.Dir(display), err)
			}
		}
	}
	mode := fileMode(req.Mode)
	f, err := t.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode.Perm())
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && t.parentMissing(name) {
			return nil, contract.ParentNotFound(display)
		}
		return nil, Error(display, err)
	}
	if content == nil {
		content = strings.NewReader("")
	}
	n, err := io.Copy(f, &ctxReader{ctx: ctx, r: content})
	cerr := f.Close()
	if err == nil {
		err = cerr
	}
	if err != nil {
		return nil, Error(display, err)
	}
	if err := t.root.Chmod(name, mode); err != nil {
		return nil, Error(display, err)
	}
	return &contract.FsWriteResponse{BytesWritten: uint64(n), Path: display}, nil
}

// ctxReader stops a copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Read serves fs::read: the file's metadata and an open file to stream.
func (t *Tree) Read(_ context.Context, req *contract.FsReadRequest) (*contract.FsReadMeta, io.ReadCloser, error) {
	name, display := t.Resolve(req.Path)
	f, err := t.root.Open(name)
	if err != nil {
		return nil, nil, Error(display, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, Error(display, err)
	}
	if st.IsDir() {
		f.Close()
		return nil, nil, contract.NewError(contract.S212, "is a directory: %s (use sandbox::fs::ls)", display)
	}
	if !st.Mode().IsRegular() {
		// A FIFO or device would block or never end.
		f.Close()
		return nil, nil, contract.NewError(contract.S212, "not a regular file: %s", display)
	}
	size := max(st.Size(), 0)
	return &contract.FsReadMeta{
		Size:  uint64(size),
		Mode:  contract.ModeFromFileMode(st.Mode()),
		Mtime: st.ModTime().Unix(),
	}, f, nil
}

// Rm serves fs::rm: a file or an empty directory, or a whole tree with
// recursive. The sandbox's root itself cannot be removed (S215).
func (t *Tree) Rm(_ context.Context, req *contract.FsRmRequest) (*contract.FsRmResponse, error) {
	name, display := t.Resolve(req.Path)
	if name == "." {
		return nil, contract.NewError(contract.S215, "permission denied: the sandbox's root directory cannot be removed")
	}
	if _, err := t.root.Lstat(name); err != nil {
		return nil, Error(display, err)
	}
	var err error
	if req.Recursive {
		err = t.root.RemoveAll(name)
	} else {
		err = t.root.Remove(name)
		var errno syscall.Errno
		if errors.As(err, &errno) && errno == syscall.EEXIST {
			// Some systems report a non-empty directory as EEXIST.
			err = &fs.PathError{Op: "remove", Path: name, Err: syscall.ENOTEMPTY}
		}
	}
	if err != nil {
		return nil, Error(display, err)
	}
	return &contract.FsRmResponse{Removed: true}, nil
}

// Chmod serves fs::chmod: mode (and owner, when uid or gid is set) on the
// path, or on everything beneath it with recursive. Symbolic links met
// while recursing are left alone; updated counts the paths changed.
func (t *Tree) Chmod(ctx context.Context, req *contract.FsChmodRequest) (*contract.FsChmodResponse, error) {
	name, display := t.Resolve(req.Path)
	mode := fileMode(req.Mode)
	uid, gid := -1, -1
	if req.UID != nil {
		uid = int(*req.UID)
	}
	if req.GID != nil {
		gid = int(*req.GID)
	}
	apply := func(n, shown string) error {
		if err := t.root.Chmod(n, mode); err != nil {
			return Error(shown, err)
		}
		if uid >= 0 || gid >= 0 {
			if err := t.root.Chown(n, uid, gid); err != nil {
				return Error(shown, err)
			}
		}
		return nil
	}
	if _, err := t.root.Stat(name); err != nil {
		return nil, Error(display, err)
	}
	if !req.Recursive {
		if err := apply(name, display); err != nil {
			return nil, err
		}
		return &contract.FsChmodResponse{Updated: 1}, nil
	}
	var updated uint64
	err := fs.WalkDir(t.root.FS(), name, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return Error(t.display(p), err)
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		if err := apply(p, t.display(p)); err != nil {
			return err
		}
		updated++
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &contract.FsChmodResponse{Updated: updated}, nil
}

// display is the sandbox path of a root-relative name.
func (t *Tree) display(name string) string {
	if name == "." || name == "" {
		return "/"
	}
	return "/" + name
}

// Mv serves fs::mv. An existing destination is S213 unless overwrite; a
// directory cannot move into itself (S210) and the root cannot move
// (S215).
func (t *Tree) Mv(_ context.Context, req *contract.FsMvRequest) (*contract.FsMvResponse, error) {
	src, srcShown := t.Resolve(req.Src)
	dst, dstShown := t.Resolve(req.Dst)
	if src == "." || dst == "." {
		return nil, contract.NewError(contract.S215, "permission denied: the sandbox's root directory cannot be moved or replaced")
	}
	if _, err := t.root.Lstat(src); err != nil {
		return nil, Error(srcShown, err)
	}
	if strings.HasPrefix(dst+"/", src+"/") && dst != src {
		return nil, contract.NewError(contract.S210, "invalid sandbox::fs::mv request: cannot move %s into itself (%s)", srcShown, dstShown)
	}
	if _, err := t.root.Lstat(dst); err == nil {
		if !req.Overwrite {
			return nil, contract.NewError(contract.S213, "path already exists: %s (pass overwrite: true to replace it)", dstShown)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, Error(dstShown, err)
	}
	if err := t.root.Rename(src, dst); err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) && errno == syscall.EEXIST {
			err = &fs.PathError{Op: "rename", Path: dst, Err: syscall.ENOTEMPTY}
		}
		if errors.Is(err, fs.ErrNotExist) && t.parentMissing(dst) {
			return nil, contract.NewError(contract.S211, "path not found: the parent directory of %s does not exist", dstShown)
		}
		return nil, Error(dstShown, err)
	}
	return &contract.FsMvResponse{Moved: true}, nil
}
