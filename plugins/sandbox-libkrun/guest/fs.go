package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/iii-sandbox/iii/internal/sandboxfs"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// FS serves the sandbox filesystem operations with the implementation the
// SDK's fsops shares (internal/sandboxfs). Paths in requests are guest
// paths ("/etc/hosts"); Root is where the guest's "/" is. In the VM the
// agent has switched root into the sandbox, so Root is "/". Tests use a
// temporary directory. Root is a prefix, not a security boundary: symlinks
// are followed as the kernel follows them, and the VM is the boundary.
type FS struct {
	Root string
}

func (f *FS) tree() *sandboxfs.Tree { return sandboxfs.NewTree(sandboxfs.Dir(f.Root), "/") }

// agentCode maps the shared implementation's kinds to the agent
// protocol's codes, which the adapter turns into the same S-codes.
func agentCode(k sandboxfs.Kind) string {
	switch k {
	case sandboxfs.KindInvalid:
		return agentproto.CodeFSInvalid
	case sandboxfs.KindNotFound:
		return agentproto.CodeFSNotFound
	case sandboxfs.KindWrongType:
		return agentproto.CodeFSWrongType
	case sandboxfs.KindExists:
		return agentproto.CodeFSExists
	case sandboxfs.KindNotEmpty:
		return agentproto.CodeFSNotEmpty
	case sandboxfs.KindPermission:
		return agentproto.CodeFSPermission
	case sandboxfs.KindRegex:
		return agentproto.CodeFSRegex
	case sandboxfs.KindAborted:
		return agentproto.CodeFSAborted
	}
	return agentproto.CodeFSIO
}

func fromShared(fe *sandboxfs.Error) *agentproto.Error {
	return &agentproto.Error{Code: agentCode(fe.Kind), Message: fe.Message, ParentMissing: fe.ParentMissing}
}

// agentErr turns an error of the shared implementation into the agent
// protocol's. An agent error inside it (the write content's stream failed
// with one) passes through; the end of the request's context is
// CodeCanceled.
func agentErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var ae *agentproto.Error
	if errors.As(err, &ae) {
		return ae
	}
	var fe *sandboxfs.Error
	if errors.As(err, &fe) && fe.Kind == sandboxfs.KindAborted {
		// A write's stream that ended, for whatever reason, is S218.
		return fromShared(fe)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return agentproto.Errorf(agentproto.CodeCanceled, "%s: canceled", op)
	}
	if errors.As(err, &fe) {
		return fromShared(fe)
	}
	return agentproto.Errorf(agentproto.CodeFSIO, "%s: %v", op, err)
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
		return fmt.Sprintf("%04o", st.Mode&0o7777)
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

func entryOf(e sandboxfs.Entry) agentproto.FsEntry {
	return agentproto.FsEntry{
		Name:      e.Name,
		IsDir:     e.IsDir,
		Size:      e.Size,
		Mode:      fmt.Sprintf("%04o", e.Mode),
		Mtime:     e.Mtime,
		IsSymlink: e.IsSymlink,
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
	ents, err := f.tree().Ls(context.Background(), req.Path)
	if err != nil {
		return nil, agentErr("ls", err)
	}
	res := &agentproto.LsResult{Entries: make([]agentproto.FsEntry, 0, len(ents))}
	for _, e := range ents {
		res.Entries = append(res.Entries, entryOf(e))
	}
	return res, nil
}

// Stat describes one path without following a final symlink.
func (f *FS) Stat(req *agentproto.FSRequest) (*agentproto.FsEntry, error) {
	e, err := f.tree().Stat(context.Background(), req.Path)
	if err != nil {
		return nil, agentErr("stat", err)
	}
	out := entryOf(e)
	return &out, nil
}

// Mkdir creates a directory. With parents it behaves like mkdir -p and
// reports created=false for a directory that already exists.
func (f *FS) Mkdir(req *agentproto.FSRequest) (*agentproto.MkdirResult, error) {
	mode, err := modeOr(req.Mode, 0o755)
	if err != nil {
		return nil, err
	}
	created, err := f.tree().Mkdir(context.Background(), req.Path, mode, req.Parents)
	if err != nil {
		return nil, agentErr("mkdir", err)
	}
	return &agentproto.MkdirResult{Created: created}, nil
}

// Write stores what r yields at the path: into a temporary file beside it,
// synced and renamed over the target, so readers never see half a file.
// An error from r (the stream was cut) is reported as S218.
func (f *FS) Write(ctx context.Context, req *agentproto.FSRequest, r io.Reader) (*agentproto.WriteResult, error) {
	mode, err := modeOr(req.Mode, 0o644)
	if err != nil {
		return nil, err
	}
	n, display, err := f.tree().Write(ctx, req.Path, mode, req.Parents, r)
	if err != nil {
		return nil, agentErr("write", err)
	}
	return &agentproto.WriteResult{BytesWritten: n, Path: display}, nil
}

// OpenRead opens a regular file for a streamed read.
func (f *FS) OpenRead(req *agentproto.FSRequest) (*agentproto.FileMeta, *os.File, error) {
	meta, file, err := f.tree().Read(context.Background(), req.Path)
	if err != nil {
		return nil, nil, agentErr("read", err)
	}
	return &agentproto.FileMeta{Size: meta.Size, Mode: fmt.Sprintf("%04o", meta.Mode), Mtime: meta.Mtime}, file, nil
}

// Rm removes a file, a symlink, an empty directory, or with recursive a
// whole tree. The root cannot be removed (S210).
func (f *FS) Rm(req *agentproto.FSRequest) (*agentproto.RmResult, error) {
	if err := f.tree().Rm(context.Background(), req.Path, boolOr(req.Recursive, false)); err != nil {
		return nil, agentErr("rm", err)
	}
	return &agentproto.RmResult{Removed: true}, nil
}

func boolOr(b *bool, def bool) bool {
	if b == nil {
		return def
	}
	return *b
}

// Chmod sets the mode (and optionally the owner) of a path, or with
// recursive of a whole tree. Symlinks inside the tree are left alone.
func (f *FS) Chmod(ctx context.Context, req *agentproto.FSRequest) (*agentproto.ChmodResult, error) {
	if req.Mode == "" {
		return nil, agentproto.Errorf(agentproto.CodeFSInvalid, "invalid sandbox::fs::chmod request: mode is required")
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
	n, err := f.tree().Chmod(ctx, req.Path, mode, uid, gid, boolOr(req.Recursive, false))
	if err != nil {
		return nil, agentErr("chmod", err)
	}
	return &agentproto.ChmodResult{Updated: n}, nil
}

// Mv renames src to dst, copying across filesystems (the overlay root and
// the tmpfs /tmp are different filesystems inside the VM).
func (f *FS) Mv(req *agentproto.FSRequest) (*agentproto.MvResult, error) {
	if err := f.tree().Mv(context.Background(), req.Src, req.Dst, req.Overwrite); err != nil {
		return nil, agentErr("mv", err)
	}
	return &agentproto.MvResult{Moved: true}, nil
}

// Grep searches files for an RE2 pattern, line by line.
func (f *FS) Grep(ctx context.Context, req *agentproto.FSRequest) (*agentproto.GrepResult, error) {
	matches, truncated, err := f.tree().Grep(ctx, &sandboxfs.GrepRequest{
		Path: req.Path, Pattern: req.Pattern, IgnoreCase: req.IgnoreCase, Recursive: boolOr(req.Recursive, true),
		IncludeGlob: req.IncludeGlob, ExcludeGlob: req.ExcludeGlob,
		MaxMatches: uint64(max(req.MaxMatches, 0)), MaxLineBytes: uint64(max(req.MaxLineBytes, 0)),
	})
	if err != nil {
		return nil, agentErr("grep", err)
	}
	res := &agentproto.GrepResult{Matches: make([]agentproto.GrepMatch, 0, len(matches)), Truncated: truncated}
	for _, m := range matches {
		res.Matches = append(res.Matches, agentproto.GrepMatch{Path: m.Path, Line: int(m.Line), Content: m.Content})
	}
	return res, nil
}

// Sed replaces pattern matches over each file's whole content: the listed
// files, or the files under path filtered by the globs (then only the
// files changed or failed are reported, sorted by path). first_only
// replaces only the first match in each file. A file that fails is
// reported in its result and does not stop the others.
func (f *FS) Sed(ctx context.Context, req *agentproto.FSRequest) (*agentproto.SedResult, error) {
	if req.Replacement == nil {
		return nil, agentproto.Errorf(agentproto.CodeFSInvalid, "invalid sandbox::fs::sed request: replacement is required")
	}
	results, total, err := f.tree().Sed(ctx, &sandboxfs.SedRequest{
		Files: req.Files, Path: req.Path, Recursive: boolOr(req.Recursive, true),
		IncludeGlob: req.IncludeGlob, ExcludeGlob: req.ExcludeGlob,
		Pattern: req.Pattern, Replacement: *req.Replacement, Regex: boolOr(req.Regex, true),
		FirstOnly: req.FirstOnly, IgnoreCase: req.IgnoreCase,
	})
	if err != nil {
		return nil, agentErr("sed", err)
	}
	res := &agentproto.SedResult{Results: make([]agentproto.SedFileResult, 0, len(results)), TotalReplacements: int(total)}
	for _, r := range results {
		fr := agentproto.SedFileResult{Path: r.Path, Replacements: int(r.Replacements), Success: r.Err == nil}
		if r.Err != nil {
			// The S-code prefix, as a sandbox error renders itself.
			fr.Error = agentCode(r.Err.Kind) + ": " + r.Err.Message
		}
		res.Results = append(res.Results, fr)
	}
	return res, nil
}
