package guest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/iii-sandbox/iii/internal/textscan"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// FS serves the sandbox filesystem operations. Paths in requests are guest
// paths ("/etc/hosts"); Root is where the guest's "/" is. In the VM the agent
// has switched root into the sandbox, so Root is "/". Tests use a temporary
// directory. Root is a prefix, not a security boundary: symlinks are
// followed as the kernel follows them, and the VM is the boundary.
type FS struct {
	Root string
}

type pathPair struct {
	guest string // cleaned absolute guest path
	host  string // where it is for the agent
}

func (f *FS) resolve(p, field string) (pathPair, error) {
	if p == "" {
		return pathPair{}, agentproto.Errorf(agentproto.CodeFSInvalid, "%s is required", field)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return pathPair{}, agentproto.Errorf(agentproto.CodeFSInvalid, "%s holds a NUL byte", field)
	}
	g := path.Clean("/" + p)
	root := f.Root
	if root == "" {
		root = "/"
	}
	return pathPair{guest: g, host: filepath.Join(root, filepath.FromSlash(g))}, nil
}

// fsError turns an OS error into the sandbox contract's S21x error.
func fsError(op, guestPath string, err error) error {
	var ae *agentproto.Error
	if errors.As(err, &ae) {
		return ae
	}
	code := agentproto.CodeFSIO
	var errno syscall.Errno
	switch {
	case errors.Is(err, fs.ErrNotExist):
		code = agentproto.CodeFSNotFound
	case errors.As(err, &errno):
		switch errno {
		case syscall.ENOTDIR, syscall.EISDIR:
			code = agentproto.CodeFSWrongType
		case syscall.EEXIST:
			code = agentproto.CodeFSExists
		case syscall.ENOTEMPTY:
			code = agentproto.CodeFSNotEmpty
		case syscall.EACCES, syscall.EPERM, syscall.EROFS:
			code = agentproto.CodeFSPermission
		}
	case errors.Is(err, fs.ErrPermission):
		code = agentproto.CodeFSPermission
	case errors.Is(err, fs.ErrExist):
		code = agentproto.CodeFSExists
	}
	return &agentproto.Error{Code: code, Message: fmt.Sprintf("%s %s: %s", op, guestPath, errText(err))}
}

// errText strips the host path that os errors carry, which would be
// meaningless (the temporary root in tests) or redundant to the caller.
func errText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err.Error()
	}
	return err.Error()
}

// ParseMode parses an octal mode string such as "0644", "755" or "0o700".
func ParseMode(s string) (uint32, error) {
	t := strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0O")
	if t == "" {
		t = "0"
	}
	if len(t) > 5 {
		return 0, agentproto.Errorf(agentproto.CodeFSInvalid, "mode %q is not an octal mode such as \"0644\"", s)
	}
	v, err := strconv.ParseUint(t, 8, 32)
	if err != nil || v > 0o7777 {
		return 0, agentproto.Errorf(agentproto.CodeFSInvalid, "mode %q is not an octal mode such as \"0644\"", s)
	}
	return uint32(v), nil
}

func modeOr(s string, def uint32) (uint32, error) {
	if s == "" {
		return def, nil
	}
	return ParseMode(s)
}

// FormatMode renders permission bits the way the contract does: "0644".
func FormatMode(fi fs.FileInfo) string {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fmt.Sprintf("%04o", uint32(st.Mode)&0o7777)
	}
	m := uint32(fi.Mode().Perm())
	if fi.Mode()&fs.ModeSetuid != 0 {
		m |= 0o4000
	}
	if fi.Mode()&fs.ModeSetgid != 0 {
		m |= 0o2000
	}
	if fi.Mode()&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	return fmt.Sprintf("%04o", m)
}

func entryOf(name string, fi fs.FileInfo) agentproto.FsEntry {
	return agentproto.FsEntry{
		Name:      name,
		IsDir:     fi.IsDir(),
		Size:      fi.Size(),
		Mode:      FormatMode(fi),
		Mtime:     fi.ModTime().Unix(),
		IsSymlink: fi.Mode()&fs.ModeSymlink != 0,
	}
}

// Do runs an operation that needs no data stream (everything except write
// and read) and returns its result body.
func (f *FS) Do(ctx context.Context, req *agentproto.FSRequest) (any, error) {
	switch req.Op {
	case agentproto.OpLs:
		return f.Ls(req)
	case agentproto.OpStat:
		return f.Stat(req)
	case agentproto.OpMkdir:
		return f.Mkdir(req)
	case agentproto.OpRm:
		return f.Rm(req)
	case agentproto.OpChmod:
		return f.Chmod(ctx, req)
	case agentproto.OpMv:
		return f.Mv(req)
	case agentproto.OpGrep:
		return f.Grep(ctx, req)
	case agentproto.OpSed:
		return f.Sed(ctx, req)
	}
	return nil, agentproto.Errorf(agentproto.CodeFSUnsupported, "fs op %q is not supported by this guest agent", req.Op)
}

// Ls lists a directory, sorted by name. Symlinks are reported, not followed.
func (f *FS) Ls(req *agentproto.FSRequest) (*agentproto.LsResult, error) {
	p, err := f.resolve(req.Path, "path")
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(p.host)
	if err != nil {
		return nil, fsError("ls", p.guest, err)
	}
	if !fi.IsDir() {
		return nil, agentproto.Errorf(agentproto.CodeFSWrongType, "ls %s: not a directory", p.guest)
	}
	des, err := os.ReadDir(p.host)
	if err != nil {
		return nil, fsError("ls", p.guest, err)
	}
	res := &agentproto.LsResult{Entries: make([]agentproto.FsEntry, 0, len(des))}
	for _, de := range des {
		info, err := de.Info()
		if err != nil {
			continue // removed while listing
		}
		res.Entries = append(res.Entries, entryOf(de.Name(), info))
	}
	return res, nil
}

// Stat describes one path without following a final symlink.
func (f *FS) Stat(req *agentproto.FSRequest) (*agentproto.FsEntry, error) {
	p, err := f.resolve(req.Path, "path")
	if err != nil {
		return nil, err
	}
	fi, err := os.Lstat(p.host)
	if err != nil {
		return nil, fsError("stat", p.guest, err)
	}
	e := entryOf(path.Base(p.guest), fi)
	return &e, nil
}

// checkParent reports a missing parent as the S211 variant that tells the
// host to offer {"parents": true}, and a parent that is not a directory as
// S212.
func checkParent(op string, p pathPair, fixable bool) error {
	pi, err := os.Stat(filepath.Dir(p.host))
	switch {
	case err == nil && !pi.IsDir():
		return agentproto.Errorf(agentproto.CodeFSWrongType, "%s %s: parent %s is not a directory", op, p.guest, path.Dir(p.guest))
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return &agentproto.Error{
			Code:          agentproto.CodeFSNotFound,
			Message:       fmt.Sprintf("%s %s: parent directory not found: %s", op, p.guest, path.Dir(p.guest)),
			ParentMissing: fixable,
		}
	case err != nil:
		return fsError(op, p.guest, err)
	}
	return nil
}

// Mkdir creates a directory. With parents it behaves like mkdir -p and
// reports created=false for a directory that already exists.
func (f *FS) Mkdir(req *agentproto.FSRequest) (*agentproto.MkdirResult, error) {
	p, err := f.resolve(req.Path, "path")
	if err != nil {
		return nil, err
	}
	mode, err := modeOr(req.Mode, 0o755)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(p.host); err == nil {
		if req.Parents && fi.IsDir() {
			return &agentproto.MkdirResult{Created: false}, nil
		}
		return nil, agentproto.Errorf(agentproto.CodeFSExists, "mkdir %s: already exists", p.guest)
	}
	if req.Parents {
		if err := mkdirParents(filepath.Dir(p.host)); err != nil {
			return nil, fsError("mkdir", p.guest, err)
		}
	} else if err := checkParent("mkdir", p, true); err != nil {
		return nil, err
	}
	if err := os.Mkdir(p.host, 0o700); err != nil {
		return nil, fsError("mkdir", p.guest, err)
	}
	// Set the mode explicitly: Mkdir's mode is filtered by the umask.
	if err := syscall.Chmod(p.host, mode); err != nil {
		return nil, fsError("mkdir", p.guest, err)
	}
	return &agentproto.MkdirResult{Created: true}, nil
}

func mkdirParents(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return nil
}

// Write stores what r yields at the path: into a temporary file beside it,
// synced and renamed over the target, so readers never see half a file.
// An error from r (the stream was cut) is reported as S218.
func (f *FS) Write(ctx context.Context, req *agentproto.FSRequest, r io.Reader) (*agentproto.WriteResult, error) {
	p, err := f.resolve(req.Path, "path")
	if err != nil {
		return nil, err
	}
	mode, err := modeOr(req.Mode, 0o644)
	if err != nil {
		return nil, err
	}
	if req.Parents {
		if err := mkdirParents(filepath.Dir(p.host)); err != nil {
			return nil, fsError("write", p.guest, err)
		}
	} else if err := checkParent("write", p, true); err != nil {
		return nil, err
	}
	if fi, err := os.Stat(p.host); err == nil && fi.IsDir() {
		return nil, agentproto.Errorf(agentproto.CodeFSWrongType, "write %s: is a directory", p.guest)
	}
	tmp, err := createTemp(filepath.Dir(p.host), filepath.Base(p.host))
	if err != nil {
		return nil, fsError("write", p.guest, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	n, err := copyCtx(ctx, tmp, r)
	if err != nil {
		var ae *agentproto.Error
		if errors.As(err, &ae) {
			return nil, ae
		}
		if errors.Is(err, errSinkWrite) {
			return nil, fsError("write", p.guest, errors.Unwrap(err))
		}
		return nil, agentproto.Errorf(agentproto.CodeFSAborted, "write %s: content stream aborted after %d bytes: %v", p.guest, n, err)
	}
	if err := tmp.Sync(); err != nil {
		return nil, fsError("write", p.guest, err)
	}
	// An explicit chmod, because the create mode is filtered by the umask.
	if err := syscall.Chmod(tmp.Name(), mode); err != nil {
		return nil, fsError("write", p.guest, err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fsError("write", p.guest, err)
	}
	if err := os.Rename(tmp.Name(), p.host); err != nil {
		return nil, fsError("write", p.guest, err)
	}
	ok = true
	return &agentproto.WriteResult{BytesWritten: n, Path: p.guest}, nil
}

var errSinkWrite = errors.New("write to file")

// copyCtx copies r to w, telling a failure to write (the disk) from a
// failure to read (the stream).
func copyCtx(ctx context.Context, w io.Writer, r io.Reader) (int64, error) {
	buf := make([]byte, agentproto.ChunkSize)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		k, rerr := r.Read(buf)
		if k > 0 {
			if _, err := w.Write(buf[:k]); err != nil {
				return n, fmt.Errorf("%w: %w", errSinkWrite, err)
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

// createTemp creates a temporary file beside base. The name needs to be
// unlikely, not secret (O_EXCL settles collisions), so it comes from
// math/rand: crypto/rand could block on an early-boot entropy pool.
func createTemp(dir, base string) (*os.File, error) {
	for try := 0; ; try++ {
		name := filepath.Join(dir, fmt.Sprintf(".%s.iii-%012x", base, rand.Uint64()&0xffffffffffff))
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) && try < 10 {
			continue
		}
		return f, err
	}
}

// OpenRead opens a regular file for a streamed read.
func (f *FS) OpenRead(req *agentproto.FSRequest) (*agentproto.FileMeta, *os.File, error) {
	p, err := f.resolve(req.Path, "path")
	if err != nil {
		return nil, nil, err
	}
	file, err := os.Open(p.host)
	if err != nil {
		return nil, nil, fsError("read", p.guest, err)
	}
	fi, err := file.Stat()
	if err != nil {
		_ = file.Close()
		return nil, nil, fsError("read", p.guest, err)
	}
	if !fi.Mode().IsRegular() {
		_ = file.Close()
		what := "not a regular file"
		if fi.IsDir() {
			what = "is a directory"
		}
		return nil, nil, agentproto.Errorf(agentproto.CodeFSWrongType, "read %s: %s", p.guest, what)
	}
	return &agentproto.FileMeta{Size: fi.Size(), Mode: FormatMode(fi), Mtime: fi.ModTime().Unix()}, file, nil
}

// Rm removes a file, a symlink, an empty directory, or with recursive a
// whole tree.
func (f *FS) Rm(req *agentproto.FSRequest) (*agentproto.RmResult, error) {
	p, err := f.resolve(req.Path, "path")
	if err != nil {
		return nil, err
	}
	if p.guest == "/" {
		return nil, agentproto.Errorf(agentproto.CodeFSInvalid, "rm /: refusing to remove the root directory")
	}
	fi, err := os.Lstat(p.host)
	if err != nil {
		return nil, fsError("rm", p.guest, err)
	}
	if fi.IsDir() && boolOr(req.Recursive, false) {
		if err := os.RemoveAll(p.host); err != nil {
			return nil, fsError("rm", p.guest, err)
		}
		return &agentproto.RmResult{Removed: true}, nil
	}
	if err := syscallRemove(p.host, fi.IsDir()); err != nil {
		if fi.IsDir() && (errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST)) {
			return nil, agentproto.Errorf(agentproto.CodeFSNotEmpty, "rm %s: directory not empty (pass recursive: true)", p.guest)
		}
		return nil, fsError("rm", p.guest, err)
	}
	return &agentproto.RmResult{Removed: true}, nil
}

// syscallRemove calls the one syscall that fits, so the error is the real
// one (os.Remove tries both and may report the wrong errno).
func syscallRemove(p string, dir bool) error {
	var err error
	if dir {
		err = syscall.Rmdir(p)
	} else {
		err = syscall.Unlink(p)
	}
	if err != nil {
		return &fs.PathError{Op: "remove", Path: p, Err: err}
	}
	return nil
}

func boolOr(b *bool, def bool) bool {
	if b == nil {
		return def
	}
	return *b
}

// Chmod sets the mode (and optionally the owner) of a path, or with
// recursive of a whole tree. Symlinks inside the tree are not followed.
func (f *FS) Chmod(ctx context.Context, req *agentproto.FSRequest) (*agentproto.ChmodResult, error) {
	p, err := f.resolve(req.Path, "path")
	if err != nil {
		return nil, err
	}
	if req.Mode == "" {
		return nil, agentproto.Errorf(agentproto.CodeFSInvalid, "chmod %s: mode is required", p.guest)
	}
	mode, err := ParseMode(req.Mode)
	if err != nil {
		return nil, err
	}
	uid, gid := -1, -1
	if req.UID != nil {
		uid = *req.UID
	}
	if req.GID != nil {
		gid = *req.GID
	}
	if uid < -1 || gid < -1 {
		return nil, agentproto.Errorf(agentproto.CodeFSInvalid, "chmod %s: uid and gid must not be negative", p.guest)
	}
	apply := func(hostPath string, symlink bool) error {
		// Owner first: chown clears the setuid and setgid bits.
		if uid != -1 || gid != -1 {
			if err := os.Lchown(hostPath, uid, gid); err != nil {
				return err
			}
		}
		if symlink {
			return nil
		}
		return syscall.Chmod(hostPath, mode)
	}
	fi, err := os.Stat(p.host)
	if err != nil {
		return nil, fsError("chmod", p.guest, err)
	}
	var updated int64
	if !fi.IsDir() || !boolOr(req.Recursive, false) {
		if err := apply(p.host, false); err != nil {
			return nil, fsError("chmod", p.guest, err)
		}
		return &agentproto.ChmodResult{Updated: 1}, nil
	}
	err = filepath.WalkDir(p.host, func(hp string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := apply(hp, d.Type()&fs.ModeSymlink != 0); err != nil {
			return err
		}
		updated++
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, agentproto.Errorf(agentproto.CodeCanceled, "chmod %s: canceled after %d entries", p.guest, updated)
		}
		return nil, fsError("chmod", p.guest, err)
	}
	return &agentproto.ChmodResult{Updated: updated}, nil
}

// Mv renames src to dst, copying across filesystems (the overlay root and
// the tmpfs /tmp are different filesystems inside the VM).
func (f *FS) Mv(req *agentproto.FSRequest) (*agentproto.MvResult, error) {
	src, err := f.resolve(req.Src, "src")
	if err != nil {
		return nil, err
	}
	dst, err := f.resolve(req.Dst, "dst")
	if err != nil {
		return nil, err
	}
	sfi, err := os.Lstat(src.host)
	if err != nil {
		return nil, fsError("mv", src.guest, err)
	}
	if src.guest == dst.guest {
		return &agentproto.MvResult{Moved: true}, nil
	}
	if sfi.IsDir() && strings.HasPrefix(dst.guest, strings.TrimSuffix(src.guest, "/")+"/") {
		return nil, agentproto.Errorf(agentproto.CodeFSInvalid, "mv %s → %s: cannot move a directory into itself", src.guest, dst.guest)
	}
	// mv has no "parents" field, so a missing parent is not fixable.
	if err := checkParent("mv", dst, false); err != nil {
		return nil, err
	}
	if dfi, err := os.Lstat(dst.host); err == nil {
		if !req.Overwrite {
			return nil, agentproto.Errorf(agentproto.CodeFSExists, "mv %s: destination %s exists (pass overwrite: true)", src.guest, dst.guest)
		}
		if dfi.IsDir() && !sfi.IsDir() {
			return nil, agentproto.Errorf(agentproto.CodeFSWrongType, "mv %s: destination %s is a directory", src.guest, dst.guest)
		}
		if !dfi.IsDir() && sfi.IsDir() {
			return nil, agentproto.Errorf(agentproto.CodeFSWrongType, "mv %s: destination %s is not a directory", src.guest, dst.guest)
		}
	}
	err = os.Rename(src.host, dst.host)
	if errors.Is(err, syscall.EXDEV) {
		err = moveAcross(src.host, dst.host, sfi)
	}
	if sfi.IsDir() && (errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTEMPTY)) {
		// rename(2) may say either for a non-empty target directory.
		return nil, agentproto.Errorf(agentproto.CodeFSNotEmpty, "mv %s: destination %s is a non-empty directory", src.guest, dst.guest)
	}
	if err != nil {
		return nil, fsError("mv", src.guest, err)
	}
	return &agentproto.MvResult{Moved: true}, nil
}

// moveAcross copies a tree to another filesystem, then removes the source.
// The copy goes to a temporary name first so a failure leaves dst as it was.
func moveAcross(src, dst string, sfi fs.FileInfo) error {
	tmp := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".iii-mv")
	_ = os.RemoveAll(tmp)
	if err := copyTree(src, tmp, sfi); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	if fi, err := os.Lstat(dst); err == nil && fi.IsDir() {
		// rename(2) onto a directory needs it empty, as a same-filesystem
		// mv would; RemoveAll only runs when Rmdir says it is empty.
		if err := syscall.Rmdir(dst); err != nil {
			_ = os.RemoveAll(tmp)
			return &fs.PathError{Op: "rename", Path: dst, Err: err}
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	return os.RemoveAll(src)
}

func copyTree(src, dst string, fi fs.FileInfo) error {
	mode := uint32(fi.Mode().Perm())
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		mode = uint32(st.Mode) & 0o7777
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	case fi.IsDir():
		if err := os.Mkdir(dst, 0o700); err != nil {
			return err
		}
		des, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, de := range des {
			cfi, err := de.Info()
			if err != nil {
				return err
			}
			if err := copyTree(filepath.Join(src, de.Name()), filepath.Join(dst, de.Name()), cfi); err != nil {
				return err
			}
		}
		return syscall.Chmod(dst, mode)
	case fi.Mode().IsRegular():
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			_ = out.Close()
			return err
		}
		if err := out.Close(); err != nil {
			return err
		}
		return syscall.Chmod(dst, mode)
	}
	return fmt.Errorf("cannot move special file %s across filesystems", filepath.Base(src))
}

// walkFiles calls fn for each regular file to search: root itself when it is
// a file, else the files under it (all levels with recursive, the top level
// without), filtered by the globs. rel is relative to root.
func (f *FS) walkFiles(ctx context.Context, op string, root pathPair, recursive bool, include, exclude *GlobSet,
	fn func(guestPath, hostPath string) (stop bool)) error {
	fi, err := os.Stat(root.host)
	if err != nil {
		return fsError(op, root.guest, err)
	}
	if !fi.IsDir() {
		fn(root.guest, root.host)
		return nil
	}
	stopped := false
	err = filepath.WalkDir(root.host, func(hp string, d fs.DirEntry, err error) error {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if err != nil {
			// An unreadable subdirectory is skipped, as grep -r does.
			if d != nil && d.IsDir() && hp != root.host {
				return fs.SkipDir
			}
			if hp == root.host {
				return err
			}
			return nil
		}
		if hp == root.host {
			return nil
		}
		rel, rerr := filepath.Rel(root.host, hp)
		if rerr != nil {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if !recursive || exclude.Match(rel, true) {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil // symlinks, devices, fifos
		}
		if exclude.Match(rel, false) || (!include.Empty() && !include.Match(rel, false)) {
			return nil
		}
		if fn(path.Join(root.guest, rel), hp) {
			stopped = true
			return fs.SkipAll
		}
		return nil
	})
	if err != nil && !stopped {
		if ctx.Err() != nil {
			return agentproto.Errorf(agentproto.CodeCanceled, "%s %s: canceled", op, root.guest)
		}
		return fsError(op, root.guest, err)
	}
	return nil
}

func compileRegex(op, pattern string, literal, ignoreCase bool) (*regexp.Regexp, error) {
	if pattern == "" {
		return nil, agentproto.Errorf(agentproto.CodeFSInvalid, "%s: pattern is required", op)
	}
	if literal {
		pattern = regexp.QuoteMeta(pattern)
	}
	if ignoreCase {
		pattern = "(?i)" + pattern
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, agentproto.Errorf(agentproto.CodeFSRegex, "%s: invalid regular expression: %v", op, err)
	}
	return re, nil
}

func compileGlobPair(op string, inc, exc []string) (*GlobSet, *GlobSet, error) {
	include, err := CompileGlobs(inc)
	if err != nil {
		return nil, nil, agentproto.Errorf(agentproto.CodeFSInvalid, "%s: include_glob: %v", op, err)
	}
	exclude, err := CompileGlobs(exc)
	if err != nil {
		return nil, nil, agentproto.Errorf(agentproto.CodeFSInvalid, "%s: exclude_glob: %v", op, err)
	}
	return include, exclude, nil
}

// Grep searches files for an RE2 pattern, line by line.
func (f *FS) Grep(ctx context.Context, req *agentproto.FSRequest) (*agentproto.GrepResult, error) {
	root, err := f.resolve(req.Path, "path")
	if err != nil {
		return nil, err
	}
	re, err := compileRegex("grep", req.Pattern, false, req.IgnoreCase)
	if err != nil {
		return nil, err
	}
	include, exclude, err := compileGlobPair("grep", req.IncludeGlob, req.ExcludeGlob)
	if err != nil {
		return nil, err
	}
	maxMatches := req.MaxMatches
	if maxMatches == 0 {
		maxMatches = agentproto.DefaultMaxMatches
	}
	maxLine := req.MaxLineBytes
	if maxLine == 0 {
		maxLine = agentproto.DefaultMaxLineBytes
	}
	res := &agentproto.GrepResult{Matches: []agentproto.GrepMatch{}}
	err = f.walkFiles(ctx, "grep", root, boolOr(req.Recursive, true), include, exclude, func(gp, hp string) bool {
		return grepFile(ctx, re, gp, hp, maxMatches, maxLine, res)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// grepFile appends matches from one file and reports whether the match
// limit was reached. Unreadable and binary files are skipped.
func grepFile(ctx context.Context, re *regexp.Regexp, guestPath, hostPath string, maxMatches, maxLine int, res *agentproto.GrepResult) bool {
	file, err := os.Open(hostPath)
	if err != nil {
		return false
	}
	defer file.Close()
	br := bufio.NewReaderSize(file, 64<<10)
	if head, _ := br.Peek(textscan.BinarySniff); textscan.IsBinary(head) {
		return false
	}
	for lineNo := 1; ; lineNo++ {
		if lineNo%4096 == 0 && ctx.Err() != nil {
			return true
		}
		line, err := readLine(br)
		if err == nil || len(line) > 0 {
			if re.Match(line) {
				if len(res.Matches) >= maxMatches {
					res.Truncated = true
					return true
				}
				res.Matches = append(res.Matches, agentproto.GrepMatch{
					Path: guestPath, Line: lineNo, Content: textscan.CutLine(line, maxLine),
				})
			}
		}
		if err != nil {
			return false
		}
	}
}

// readLine returns one line without its newline, at most textscan.MaxLine
// bytes of it (the rest of a longer line is skipped), and io.EOF after the
// last.
func readLine(br *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(buf)+len(chunk) <= textscan.MaxLine {
			buf = append(buf, chunk...)
		} else if len(buf) < textscan.MaxLine {
			buf = append(buf, chunk[:textscan.MaxLine-len(buf)]...)
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == nil:
			buf = bytes.TrimSuffix(buf, []byte("\n"))
			return bytes.TrimSuffix(buf, []byte("\r")), nil
		default:
			return buf, err
		}
	}
}

// Sed replaces pattern matches in files: the listed files, or the files
// under path filtered by the globs. first_only replaces only the first
// match in each file. A file that fails is reported in its result and
// does not stop the others.
func (f *FS) Sed(ctx context.Context, req *agentproto.FSRequest) (*agentproto.SedResult, error) {
	hasFiles, hasPath := len(req.Files) > 0, req.Path != ""
	if hasFiles == hasPath {
		return nil, agentproto.Errorf(agentproto.CodeFSInvalid, "sed: give exactly one of files and path")
	}
	if req.Replacement == nil {
		return nil, agentproto.Errorf(agentproto.CodeFSInvalid, "sed: replacement is required")
	}
	literal := !boolOr(req.Regex, true)
	re, err := compileRegex("sed", req.Pattern, literal, req.IgnoreCase)
	if err != nil {
		return nil, err
	}
	res := &agentproto.SedResult{Results: []agentproto.SedFileResult{}}
	one := func(gp, hp string, skipBinary bool) {
		n, err := sedFile(re, hp, *req.Replacement, literal, req.FirstOnly, skipBinary)
		if errors.Is(err, errSkipped) {
			return
		}
		r := agentproto.SedFileResult{Path: gp, Replacements: n, Success: err == nil}
		if err != nil {
			var ae *agentproto.Error
			if errors.As(fsError("sed", gp, err), &ae) {
				r.Error = ae.Message
			}
		}
		res.Results = append(res.Results, r)
		res.TotalReplacements += n
	}
	if hasFiles {
		for _, name := range req.Files {
			if ctx.Err() != nil {
				return nil, agentproto.Errorf(agentproto.CodeCanceled, "sed: canceled")
			}
			p, err := f.resolve(name, "files[]")
			if err != nil {
				return nil, err
			}
			one(p.guest, p.host, false)
		}
		return res, nil
	}
	root, err := f.resolve(req.Path, "path")
	if err != nil {
		return nil, err
	}
	include, exclude, err := compileGlobPair("sed", req.IncludeGlob, req.ExcludeGlob)
	if err != nil {
		return nil, err
	}
	err = f.walkFiles(ctx, "sed", root, boolOr(req.Recursive, true), include, exclude, func(gp, hp string) bool {
		one(gp, hp, true)
		return false
	})
	if err != nil {
		return nil, err
	}
	sort.SliceStable(res.Results, func(i, j int) bool { return res.Results[i].Path < res.Results[j].Path })
	return res, nil
}

var errSkipped = errors.New("skipped")

// sedFile rewrites one file and returns how many replacements it made. An
// unchanged file is not rewritten.
func sedFile(re *regexp.Regexp, hostPath, repl string, literal, firstOnly, skipBinary bool) (int, error) {
	fi, err := os.Stat(hostPath)
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, &fs.PathError{Op: "sed", Path: hostPath, Err: syscall.EISDIR}
	}
	if fi.Size() > textscan.MaxSedFile {
		return 0, agentproto.Errorf(agentproto.CodeFSIO, "file is larger than %d MiB", textscan.MaxSedFile>>20)
	}
	data, err := os.ReadFile(hostPath)
	if err != nil {
		return 0, err
	}
	if skipBinary && textscan.IsBinary(data[:min(len(data), textscan.BinarySniff)]) {
		return 0, errSkipped
	}
	locs := re.FindAllSubmatchIndex(data, -1)
	if firstOnly && len(locs) > 1 {
		locs = locs[:1]
	}
	if len(locs) == 0 {
		return 0, nil
	}
	out := make([]byte, 0, len(data))
	last := 0
	for _, loc := range locs {
		out = append(out, data[last:loc[0]]...)
		if literal {
			out = append(out, repl...)
		} else {
			out = re.Expand(out, []byte(repl), data, loc)
		}
		last = loc[1]
	}
	out = append(out, data[last:]...)
	if err := replaceFile(hostPath, out, fi); err != nil {
		return 0, err
	}
	return len(locs), nil
}

// replaceFile writes data beside path and renames it over, keeping the mode.
func replaceFile(hostPath string, data []byte, fi fs.FileInfo) error {
	tmp, err := createTemp(filepath.Dir(hostPath), filepath.Base(hostPath))
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	mode := uint32(fi.Mode().Perm())
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		mode = uint32(st.Mode) & 0o7777
		_ = os.Lchown(tmp.Name(), int(st.Uid), int(st.Gid))
	}
	if err := syscall.Chmod(tmp.Name(), mode); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), hostPath); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	return nil
}
