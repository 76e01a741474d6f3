package fsops

import (
	"context"
	"io"
	"io/fs"
	"os"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/sandboxfs"
)

// Tree serves the contract's filesystem operations on a directory opened
// as an *os.Root, which is the whole sandbox: the sandbox path "/" is the
// root's directory. os.Root confines every operation to it, so neither
// ".." nor a symbolic link can reach outside (such attempts are S215).
//
// Tree is safe for concurrent use; operations on the same paths race the
// way they would in any filesystem.
type Tree struct {
	t *sandboxfs.Tree
}

// NewTree serves root. home is the sandbox path relative paths are
// resolved against ("/" when empty).
func NewTree(root *os.Root, home string) *Tree {
	var fsys sandboxfs.FS
	if root != nil {
		fsys = root
	}
	return &Tree{t: sandboxfs.NewTree(fsys, home)}
}

// Resolve turns a sandbox path into the root-relative name os.Root takes
// and the cleaned absolute sandbox path used in replies and messages.
// Cleaning is lexical, so "/../x" is "/x": ".." cannot climb above the
// sandbox's root.
func (t *Tree) Resolve(p string) (name, display string) { return t.t.Resolve(p) }

// Entry describes info as an FsEntry named name.
func Entry(name string, info fs.FileInfo) contract.FsEntry {
	return entry(sandboxfs.EntryOf(name, info))
}

func entry(e sandboxfs.Entry) contract.FsEntry {
	return contract.FsEntry{
		Name:      e.Name,
		IsDir:     e.IsDir,
		Size:      uint64(max(e.Size, 0)),
		Mode:      contract.Mode(e.Mode),
		Mtime:     e.Mtime,
		IsSymlink: e.IsSymlink,
	}
}

// Ls serves fs::ls: the directory's entries sorted by name, symlinks not
// followed.
func (t *Tree) Ls(ctx context.Context, req *contract.FsLsRequest) (*contract.FsLsResponse, error) {
	ents, err := t.t.Ls(ctx, req.Path)
	if err != nil {
		return nil, toContract(err)
	}
	out := &contract.FsLsResponse{Entries: make([]contract.FsEntry, 0, len(ents))}
	for _, e := range ents {
		out.Entries = append(out.Entries, entry(e))
	}
	return out, nil
}

// Stat serves fs::stat; a symbolic link describes itself.
func (t *Tree) Stat(ctx context.Context, req *contract.FsStatRequest) (*contract.FsEntry, error) {
	e, err := t.t.Stat(ctx, req.Path)
	if err != nil {
		return nil, toContract(err)
	}
	out := entry(e)
	return &out, nil
}

// Mkdir serves fs::mkdir. Without parents, a missing parent is S211 with
// fix {parents: true} and an existing path is S213; with parents, an
// existing directory is {created: false}, like mkdir -p, and a file in the
// way is S212.
func (t *Tree) Mkdir(ctx context.Context, req *contract.FsMkdirRequest) (*contract.FsMkdirResponse, error) {
	created, err := t.t.Mkdir(ctx, req.Path, uint32(req.Mode), req.Parents)
	if err != nil {
		return nil, toContract(err)
	}
	return &contract.FsMkdirResponse{Created: created}, nil
}

// Write serves fs::write: content goes to a temporary file beside the
// path, synced and renamed over it (a new inode; readers never see half a
// file), with mode applied exactly. Without parents, a missing parent is
// S211 with fix {parents: true}.
func (t *Tree) Write(ctx context.Context, req *contract.FsWriteRequest, content io.Reader) (*contract.FsWriteResponse, error) {
	n, display, err := t.t.Write(ctx, req.Path, uint32(req.Mode), req.Parents, content)
	if err != nil {
		return nil, toContract(err)
	}
	return &contract.FsWriteResponse{BytesWritten: uint64(max(n, 0)), Path: display}, nil
}

// Read serves fs::read: the file's metadata and an open file to stream.
func (t *Tree) Read(ctx context.Context, req *contract.FsReadRequest) (*contract.FsReadMeta, io.ReadCloser, error) {
	meta, f, err := t.t.Read(ctx, req.Path)
	if err != nil {
		return nil, nil, toContract(err)
	}
	return &contract.FsReadMeta{Size: uint64(max(meta.Size, 0)), Mode: contract.Mode(meta.Mode), Mtime: meta.Mtime}, f, nil
}

// Rm serves fs::rm: a file or an empty directory, or a whole tree with
// recursive. The sandbox's root itself cannot be removed (S210).
func (t *Tree) Rm(ctx context.Context, req *contract.FsRmRequest) (*contract.FsRmResponse, error) {
	if err := t.t.Rm(ctx, req.Path, req.Recursive); err != nil {
		return nil, toContract(err)
	}
	return &contract.FsRmResponse{Removed: true}, nil
}

// Chmod serves fs::chmod: mode (and owner, when uid or gid is set) on the
// path, or on everything beneath it with recursive. Symbolic links met
// while recursing are left alone; updated counts the paths changed.
func (t *Tree) Chmod(ctx context.Context, req *contract.FsChmodRequest) (*contract.FsChmodResponse, error) {
	uid, gid := -1, -1
	if req.UID != nil {
		uid = int(*req.UID)
	}
	if req.GID != nil {
		gid = int(*req.GID)
	}
	n, err := t.t.Chmod(ctx, req.Path, uint32(req.Mode), uid, gid, req.Recursive)
	if err != nil {
		return nil, toContract(err)
	}
	return &contract.FsChmodResponse{Updated: uint64(max(n, 0))}, nil
}

// Mv serves fs::mv. An existing destination is S213 unless overwrite, and
// with overwrite a file cannot replace a directory nor the reverse (S212);
// a directory cannot move into itself (S210) and the root cannot move
// (S215). Across filesystems the tree is copied, then the source removed.
func (t *Tree) Mv(ctx context.Context, req *contract.FsMvRequest) (*contract.FsMvResponse, error) {
	if err := t.t.Mv(ctx, req.Src, req.Dst, req.Overwrite); err != nil {
		return nil, toContract(err)
	}
	return &contract.FsMvResponse{Moved: true}, nil
}

// Grep serves fs::grep: every line matching the RE2 pattern in the file,
// or in the directory's files (recursively unless recursive is false),
// skipping binary files and symbolic links, filtered by the globs. It
// stops at max_matches and then reports truncated. A "\r" ending a line
// is not part of it.
func (t *Tree) Grep(ctx context.Context, req *contract.FsGrepRequest) (*contract.FsGrepResponse, error) {
	matches, truncated, err := t.t.Grep(ctx, &sandboxfs.GrepRequest{
		Path: req.Path, Pattern: req.Pattern, IgnoreCase: req.IgnoreCase, Recursive: req.Recursive,
		IncludeGlob: req.IncludeGlob, ExcludeGlob: req.ExcludeGlob,
		MaxMatches: req.MaxMatches, MaxLineBytes: req.MaxLineBytes,
	})
	if err != nil {
		return nil, toContract(err)
	}
	out := &contract.FsGrepResponse{Truncated: truncated}
	for _, m := range matches {
		out.Matches = append(out.Matches, contract.GrepMatch{Path: m.Path, Line: m.Line, Content: m.Content})
	}
	return out, nil
}

// Sed serves fs::sed: replace pattern (RE2 with $1-style group references
// in the replacement, or a literal string when regex is false) over each
// file's whole content, so ^ and $ anchor at the file's start and end
// unless the pattern uses (?m). With first_only only each file's first
// match is replaced. Files listed in files are each reported; walking path
// reports only the files it changed or could not change, sorted by path,
// skipping binary files. A changed file is rewritten atomically (a
// temporary file synced and renamed over it) and keeps its mode and, where
// allowed, its owner; an unchanged file is not rewritten.
func (t *Tree) Sed(ctx context.Context, req *contract.FsSedRequest) (*contract.FsSedResponse, error) {
	results, total, err := t.t.Sed(ctx, &sandboxfs.SedRequest{
		Files: req.Files, Path: req.Path, Recursive: req.Recursive,
		IncludeGlob: req.IncludeGlob, ExcludeGlob: req.ExcludeGlob,
		Pattern: req.Pattern, Replacement: req.Replacement, Regex: req.Regex,
		FirstOnly: req.FirstOnly, IgnoreCase: req.IgnoreCase,
	})
	if err != nil {
		return nil, toContract(err)
	}
	out := &contract.FsSedResponse{TotalReplacements: total}
	for _, r := range results {
		sr := contract.SedResult{Path: r.Path, Replacements: r.Replacements, Success: r.Err == nil}
		if r.Err != nil {
			// The S-code prefix, as a sandbox error renders itself.
			sr.Error = fromShared(r.Err).Error()
		}
		out.Results = append(out.Results, sr)
	}
	return out, nil
}
