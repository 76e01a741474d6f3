package guest

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// Workspace unpacks worker workspaces (agentproto.WorkspaceRequest): the
// host streams a tar of the worker's directory and the guest lays it into
// a directory of its own, so the worker never sees a live host share.
type Workspace struct{}

// Unpack reads the tar stream r into req.Dir and, with req.Prune, removes
// what the archive no longer holds. Nothing is ever written through a
// symbolic link: each path's parents are checked and replaced by real
// directories when the archive says so, and files land by rename, which
// replaces a link rather than following it.
func (Workspace) Unpack(ctx context.Context, req *agentproto.WorkspaceRequest, r io.Reader) (*agentproto.WorkspaceResult, error) {
	dir := filepath.Clean(req.Dir)
	if fi, err := os.Lstat(dir); err == nil && !fi.IsDir() {
		if err := os.Remove(dir); err != nil {
			return nil, fsError("workspace", dir, err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fsError("workspace", dir, err)
	}
	u := &unpacker{ctx: ctx, dir: dir, seen: map[string]bool{}, dirs: map[string]bool{}, res: &agentproto.WorkspaceResult{}}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return nil, agentproto.Errorf(agentproto.CodeCanceled, "workspace: %v", err)
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, agentproto.Errorf(agentproto.CodeFSAborted, "workspace: read the archive: %v", err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return nil, err
		}
	}
	// The host sends the archive's padding after its end marker; take it,
	// so the host's stream ends normally rather than being cut off.
	_, _ = io.Copy(io.Discard, r)
	if req.Prune {
		if err := u.prune(dir, "", req.Keep, req.KeepTop); err != nil {
			return nil, err
		}
	}
	return u.res, nil
}

type unpacker struct {
	ctx  context.Context
	dir  string
	seen map[string]bool // relative paths the archive holds
	// dirs are the relative paths known to be real directories now; a
	// later entry that puts a file or link there takes them out.
	dirs map[string]bool
	res  *agentproto.WorkspaceResult
}

// notDir forgets rel, and everything below it, as a directory.
func (u *unpacker) notDir(rel string) {
	for d := range u.dirs {
		if d == rel || strings.HasPrefix(d, rel+"/") {
			delete(u.dirs, d)
		}
	}
}

// relName cleans an archive name into a path relative to the directory;
// "" means the directory itself. Absolute names and names that climb out
// are refused.
func relName(name string) (string, error) {
	n := strings.TrimPrefix(name, "./")
	if strings.IndexByte(n, 0) >= 0 || path.IsAbs(n) {
		return "", fmt.Errorf("archive entry %q is absolute or holds NUL", name)
	}
	clean := path.Clean(n)
	if clean == "." {
		return "", nil
	}
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", fmt.Errorf("archive entry %q leaves the directory", name)
	}
	return clean, nil
}

func (u *unpacker) entry(hdr *tar.Header, body io.Reader) error {
	rel, err := relName(hdr.Name)
	if err != nil {
		return agentproto.Errorf(agentproto.CodeInvalidRequest, "workspace: %v", err)
	}
	if rel == "" {
		return nil
	}
	if err := u.parents(rel); err != nil {
		return err
	}
	target := filepath.Join(u.dir, filepath.FromSlash(rel))
	mode := os.FileMode(hdr.Mode) & os.ModePerm
	if sparse(hdr) {
		// A sparse entry expands to as many zeros as its header claims,
		// whatever the stream holds; the host never sends one.
		u.res.Skipped++
		return nil
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := u.mkdir(target, mode); err != nil {
			return err
		}
		u.dirs[rel] = true
		u.res.Dirs++
	case tar.TypeReg:
		u.notDir(rel)
		n, err := u.file(target, mode, hdr, body)
		if err != nil {
			return err
		}
		u.res.Files++
		u.res.Bytes += n
	case tar.TypeSymlink:
		u.notDir(rel)
		if err := removeAny(target); err != nil {
			return fsError("workspace", target, err)
		}
		if err := os.Symlink(hdr.Linkname, target); err != nil {
			return fsError("workspace", target, err)
		}
		u.res.Symlinks++
	default:
		// Hard links, devices, FIFOs: a worker's source tree has no use
		// for them, and the host never sends them.
		u.res.Skipped++
		return nil
	}
	u.seen[rel] = true
	return nil
}

// parents makes sure every parent of rel is a real directory.
func (u *unpacker) parents(rel string) error {
	parts := strings.Split(rel, "/")
	for i := 1; i < len(parts); i++ {
		prefix := strings.Join(parts[:i], "/")
		if u.dirs[prefix] {
			continue
		}
		if err := u.mkdir(filepath.Join(u.dir, filepath.FromSlash(prefix)), 0o755); err != nil {
			return err
		}
		u.dirs[prefix] = true
		u.seen[prefix] = true
	}
	return nil
}

// mkdir makes p a directory with mode, replacing a file or link there.
func (u *unpacker) mkdir(p string, mode os.FileMode) error {
	fi, err := os.Lstat(p)
	switch {
	case err == nil && fi.IsDir():
		if fi.Mode().Perm() != mode {
			if err := os.Chmod(p, mode); err != nil {
				return fsError("workspace", p, err)
			}
		}
		return nil
	case err == nil:
		if err := os.Remove(p); err != nil {
			return fsError("workspace", p, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return fsError("workspace", p, err)
	}
	if err := os.Mkdir(p, mode); err != nil {
		return fsError("workspace", p, err)
	}
	// Mkdir applies the umask; the archive's mode is what was asked for.
	return chmodErr(p, mode)
}

func chmodErr(p string, mode os.FileMode) error {
	if err := os.Chmod(p, mode); err != nil {
		return fsError("workspace", p, err)
	}
	return nil
}

// file writes body beside target and renames it into place.
func (u *unpacker) file(target string, mode os.FileMode, hdr *tar.Header, body io.Reader) (int64, error) {
	tmp, err := os.CreateTemp(filepath.Dir(target), ".iii-ws-*")
	if err != nil {
		return 0, fsError("workspace", target, err)
	}
	done := false
	defer func() {
		if !done {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	n, err := io.Copy(tmp, ctxReader{u.ctx, body})
	if err != nil {
		if u.ctx.Err() != nil {
			return 0, agentproto.Errorf(agentproto.CodeCanceled, "workspace: %v", u.ctx.Err())
		}
		return 0, agentproto.Errorf(agentproto.CodeFSAborted, "workspace: %s: %v", target, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		return 0, fsError("workspace", target, err)
	}
	if err := tmp.Close(); err != nil {
		return 0, fsError("workspace", target, err)
	}
	if !hdr.ModTime.IsZero() {
		_ = os.Chtimes(tmp.Name(), hdr.ModTime, hdr.ModTime)
	}
	if fi, err := os.Lstat(target); err == nil && fi.IsDir() {
		if err := os.RemoveAll(target); err != nil {
			return 0, fsError("workspace", target, err)
		}
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return 0, fsError("workspace", target, err)
	}
	done = true
	return n, nil
}

// sparse reports whether hdr is a GNU sparse file in PAX form (the old
// GNU form keeps its own type flag and is skipped as any unknown type).
func sparse(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// removeAny removes whatever is at p, a directory with its contents.
func removeAny(p string) error {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return os.RemoveAll(p)
	}
	return os.Remove(p)
}

// prune removes what lies under dir (rel below the workspace) that the
// archive did not hold, leaving names in keep alone at any depth and those
// in keepTop directly under the workspace. It never descends into a
// symbolic link.
func (u *unpacker) prune(dir, rel string, keep, keepTop []string) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return fsError("workspace", dir, err)
	}
	for _, de := range des {
		if err := u.ctx.Err(); err != nil {
			return agentproto.Errorf(agentproto.CodeCanceled, "workspace: %v", err)
		}
		name := de.Name()
		if slices.Contains(keep, name) || (rel == "" && slices.Contains(keepTop, name)) {
			continue
		}
		r := path.Join(rel, name)
		p := filepath.Join(dir, name)
		if !u.seen[r] {
			if err := removeAny(p); err != nil {
				return fsError("workspace", p, err)
			}
			u.res.Removed++
			continue
		}
		if de.IsDir() {
			if err := u.prune(p, r, keep, keepTop); err != nil {
				return err
			}
		}
	}
	return nil
}

// ctxReader stops a copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
