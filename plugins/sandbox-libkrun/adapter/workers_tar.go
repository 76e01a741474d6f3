package adapter

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
	"syscall"
)

// WorkspaceExcludes are the names the copy of a worker's host directory
// into its VM leaves out, at any depth: what the guest's own install step
// makes (dependencies, build output, caches), version control, and .iii,
// where Compose keeps a project's state, the project token among it, which
// must never be readable inside a VM, whatever the worker's directory is
// (path://. included). The guest keeps its own copies of these names when
// it prunes the workspace.
func WorkspaceExcludes() []string {
	return []string{"node_modules", ".venv", "target", "dist", "__pycache__", ".pytest_cache", ".next", ".git", ".iii"}
}

// tarStats counts what a workspace archive holds.
type tarStats struct {
	Files, Dirs, Symlinks, Skipped, Bytes int64
}

// writeWorkspaceTar writes the tree under root to w as a tar stream, names
// relative to root. It never follows a symbolic link (links travel as
// links), skips device files, sockets and FIFOs, leaves out
// WorkspaceExcludes at any depth and every path in exclude (and below),
// and records permission bits and modification times only (the guest owns
// the files).
func writeWorkspaceTar(ctx context.Context, w io.Writer, root string, exclude []string) (tarStats, error) {
	var st tarStats
	tw := tar.NewWriter(w)
	excl := WorkspaceExcludes()
	var walk func(dir, rel string) error
	walk = func(dir, rel string) error {
		des, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("read %s: %w", dir, err)
		}
		for _, de := range des {
			if err := ctx.Err(); err != nil {
				return err
			}
			name := de.Name()
			if slices.Contains(excl, name) {
				continue
			}
			full := filepath.Join(dir, name)
			if underAny(full, exclude) {
				continue
			}
			r := path.Join(rel, name)
			fi, err := os.Lstat(full)
			if errors.Is(err, fs.ErrNotExist) {
				continue // removed while we walked
			}
			if err != nil {
				return err
			}
			switch {
			case fi.IsDir():
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: r + "/", Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime(), Format: tar.FormatPAX}); err != nil {
					return err
				}
				st.Dirs++
				if err := walk(full, r); err != nil {
					return err
				}
			case fi.Mode()&fs.ModeSymlink != 0:
				target, err := os.Readlink(full)
				if err != nil {
					return fmt.Errorf("read link %s: %w", full, err)
				}
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: r, Linkname: target, Mode: 0o777, ModTime: fi.ModTime(), Format: tar.FormatPAX}); err != nil {
					return err
				}
				st.Symlinks++
			case fi.Mode().IsRegular():
				n, err := tarFile(tw, full, r)
				if err != nil {
					return err
				}
				st.Files++
				st.Bytes += n
			default:
				st.Skipped++
			}
		}
		return nil
	}
	if err := walk(root, ""); err != nil {
		return st, err
	}
	return st, tw.Close()
}

// tarFile adds one regular file. It is opened without following links and
// checked again once open, so a file swapped for a link or a FIFO between
// the walk and the open is refused rather than read through.
func tarFile(tw *tar.Writer, full, rel string) (int64, error) {
	f, err := os.OpenFile(full, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", full, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("%s changed into a %s while it was copied; start the worker again", full, fi.Mode().Type())
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Size: fi.Size(), Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime(), Format: tar.FormatPAX}); err != nil {
		return 0, err
	}
	n, err := io.CopyN(tw, f, fi.Size())
	if err != nil {
		return n, fmt.Errorf("copy %s (it may have changed while it was copied; start the worker again): %w", full, err)
	}
	return n, nil
}

// underAny reports whether p is one of dirs or below one.
func underAny(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

// pathUnder reports whether p (clean, absolute) is root or below it.
func pathUnder(p, root string) bool {
	if root == string(filepath.Separator) {
		return true
	}
	return underAny(p, []string{root})
}
