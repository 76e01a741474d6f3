package workervm

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// copySkips are the names the copy of a worker's host directory into its
// VM leaves out by default, each with the reason the copy reports. They
// apply at the top of the directory only, where a project keeps what its
// install step and its builds make: never below it, so vendored
// dependencies (node_modules/iii-sdk/dist, vendor/x/target, a
// site-packages tree) arrive whole. worker::start's include (Compose:
// copy.include in iii.worker.yaml) copies any of them all the same.
var copySkips = []struct{ name, why string }{
	{"node_modules", "dependencies: the worker's install step makes them in the guest"},
	{".venv", "a virtual environment built for the host: the install step makes the guest's"},
	{"target", "build output"},
	{"dist", "build output"},
	{".next", "build output"},
	{"__pycache__", "bytecode cache"},
	{".pytest_cache", "test cache"},
	{".git", "version control"},
}

// StateDirName is where Compose keeps a project's state, the project token
// among it. The copy leaves it out at any depth, whatever the worker's
// directory is (path://. included), and nothing includes it: the token
// must never be readable inside a VM.
const StateDirName = ".iii"

const stateDirWhy = "Compose's state (the project token among it): never copied into a VM"

// WorkspaceExcludes are the names the copy leaves out of the top of a
// worker's directory by default (and .iii, left out at any depth).
func WorkspaceExcludes() []string {
	out := make([]string, 0, len(copySkips)+1)
	for _, s := range copySkips {
		out = append(out, s.name)
	}
	return append(out, StateDirName)
}

// copyRule decides what the copy of a worker's directory leaves out.
type copyRule struct {
	// include are default-skipped top-level names to copy all the same.
	include []string
	// exclude are further absolute host paths to leave out (and below).
	exclude []string
}

// skip reports whether the entry at rel (a slash path relative to the
// worker's directory) whose host path is full is left out, and why.
func (r copyRule) skip(rel, full string) (string, bool) {
	name := path.Base(rel)
	if name == StateDirName {
		return stateDirWhy, true
	}
	if underAny(full, r.exclude) {
		return "listed in exclude", true
	}
	if strings.Contains(rel, "/") || slices.Contains(r.include, name) {
		return "", false
	}
	for _, s := range copySkips {
		if s.name == name {
			return s.why, true
		}
	}
	return "", false
}

// keepTop are the top-level names the guest keeps when it prunes the
// workspace: those the copy left out by default, which the guest's own
// install step may have made there (node_modules survives the next copy).
func (r copyRule) keepTop() []string {
	var out []string
	for _, s := range copySkips {
		if !slices.Contains(r.include, s.name) {
			out = append(out, s.name)
		}
	}
	return out
}

// skippedEntry is one entry the copy left out.
type skippedEntry struct {
	Path string // relative to the worker's directory, "/" after a directory
	Why  string
}

// maxSkippedListed bounds the entries a copy records by name; the count
// goes on.
const maxSkippedListed = 50

// tarStats counts what a workspace archive holds and names what it left out.
type tarStats struct {
	Files, Dirs, Symlinks, Skipped, Bytes int64
	// Left are the entries left out, in walk order (at most
	// maxSkippedListed; Skipped counts them all).
	Left []skippedEntry
	// Manifests are the install step's manifests the copy carried
	// (isInstallManifest): file name → hex sha256 of the bytes sent.
	Manifests map[string]string
}

func (st *tarStats) leave(rel string, dir bool, why string) {
	st.Skipped++
	if len(st.Left) < maxSkippedListed {
		if dir {
			rel += "/"
		}
		st.Left = append(st.Left, skippedEntry{Path: rel, Why: why})
	}
}

// writeWorkspaceTar writes the tree under root to w as a tar stream, names
// relative to root. It never follows a symbolic link (links travel as
// links), skips device files, sockets and FIFOs, leaves out what rule
// says, names every entry it left out in the stats, and records
// permission bits and modification times only (the guest owns the files).
func writeWorkspaceTar(ctx context.Context, w io.Writer, root string, rule copyRule) (tarStats, error) {
	var st tarStats
	tw := tar.NewWriter(w)
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
			full := filepath.Join(dir, name)
			r := path.Join(rel, name)
			if why, skip := rule.skip(r, full); skip {
				st.leave(r, de.IsDir(), why)
				continue
			}
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
				// A manifest is hashed as it is sent, so the install's
				// key is what the guest got, not a second read.
				var sum hash.Hash
				if isInstallManifest(r) {
					sum = sha256.New()
				}
				n, err := tarFile(tw, full, r, sum)
				if err != nil {
					return err
				}
				if sum != nil {
					if st.Manifests == nil {
						st.Manifests = map[string]string{}
					}
					st.Manifests[r] = hex.EncodeToString(sum.Sum(nil))
				}
				st.Files++
				st.Bytes += n
			default:
				st.leave(r, false, "a "+fileKind(fi.Mode())+", which a copy cannot carry")
			}
		}
		return nil
	}
	if err := walk(root, ""); err != nil {
		return st, err
	}
	return st, tw.Close()
}

// fileKind names a non-regular file's type.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

// copyReport is the worker log's account of what the copy left out and how
// to copy it; "" when nothing was left out. install is the worker's
// install step: dependencies left out with no install step to make them
// are called out, since the worker then cannot find them.
func copyReport(st tarStats, install string) string {
	if st.Skipped == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "workspace: left out %d entr%s:", st.Skipped, plural(st.Skipped, "y", "ies"))
	for i, e := range st.Left {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s (%s)", e.Path, e.Why)
	}
	if more := st.Skipped - int64(len(st.Left)); more > 0 {
		fmt.Fprintf(&b, "; and %d more", more)
	}
	var byDefault, deps []string
	for _, e := range st.Left {
		name := strings.TrimSuffix(e.Path, "/")
		for _, s := range copySkips {
			if s.name == name {
				byDefault = append(byDefault, name)
				if name == "node_modules" || name == ".venv" {
					deps = append(deps, name)
				}
			}
		}
	}
	if len(byDefault) > 0 {
		fmt.Fprintf(&b, ". To copy %s all the same (vendored dependencies, a prebuilt build), list %s under copy.include in iii.worker.yaml (worker::start's include)",
			strings.Join(byDefault, ", "), oneOrThem(len(byDefault)))
	}
	if len(deps) > 0 && strings.TrimSpace(install) == "" {
		fmt.Fprintf(&b, ". The worker has no install step, so nothing makes %s in the guest: set scripts.install in iii.worker.yaml to install the dependencies there, or copy them with copy.include: [%s]",
			strings.Join(deps, " or "), strings.Join(deps, ", "))
	}
	return b.String()
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func oneOrThem(n int) string {
	if n == 1 {
		return "it"
	}
	return "them"
}

// tarFile adds one regular file. It is opened without following links and
// checked again once open, so a file swapped for a link or a FIFO between
// the walk and the open is refused rather than read through. sum, when
// not nil, also gets the bytes written.
func tarFile(tw *tar.Writer, full, rel string, sum hash.Hash) (int64, error) {
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
	var dst io.Writer = tw
	if sum != nil {
		dst = io.MultiWriter(tw, sum)
	}
	n, err := io.CopyN(dst, f, fi.Size())
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
