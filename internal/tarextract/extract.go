// Package tarextract unpacks OCI image layers (tar streams) into a directory
// without ever touching anything outside it.
//
// Every file operation goes through an *os.Root, so even a bug in the path
// handling here cannot escape the target directory. On top of that, paths are
// resolved with chroot semantics: a symlink met while walking a path is
// followed as if the target directory were "/", so an absolute or
// `../`-laden link written by one layer and used by a later one lands inside
// the root instead of failing or escaping. Whiteouts are applied per the OCI
// image spec, device nodes and fifos are skipped, setuid/setgid bits and
// extended attributes (file capabilities included) are dropped, and the
// total size, per-file size and entry count are capped.
//
// Both the sandbox adapter's image store and Compose's package installer
// unpack untrusted archives with it, so it lives in internal/ rather than
// under one of them (docs/architecture.md, "Layers").
package tarextract

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"sort"
	"strings"
	"syscall"
)

// Stable codes of extraction errors.
const (
	// CodePathEscape: an entry name or hard link leaves the root.
	CodePathEscape = "EXTRACT_PATH_ESCAPE"
	// CodeLimit: a size or count cap was reached.
	CodeLimit = "EXTRACT_LIMIT"
	// CodeBadEntry: an entry that cannot be applied (bad hard link, a file
	// where a directory is needed, a malformed tar).
	CodeBadEntry = "EXTRACT_BAD_ENTRY"
	// CodeIO: the local file system failed.
	CodeIO = "EXTRACT_IO"
)

// Error is an extraction failure. Layer and Entry locate it.
type Error struct {
	Code  string
	Layer int
	Entry string
	Err   error
}

func (e *Error) Error() string {
	if e.Entry == "" {
		return fmt.Sprintf("%s: layer %d: %v", e.Code, e.Layer, e.Err)
	}
	return fmt.Sprintf("%s: layer %d: entry %q: %v", e.Code, e.Layer, e.Entry, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Limits caps what a whole image (all its layers together) may unpack to.
// Zero fields take the defaults of DefaultLimits.
type Limits struct {
	// MaxTotalBytes caps the sum of the sizes of all entries.
	MaxTotalBytes int64
	// MaxFileBytes caps one entry's size.
	MaxFileBytes int64
	// MaxEntries caps the number of tar entries.
	MaxEntries int
}

// DefaultLimits are generous for language runtimes and still stop a bomb
// long before it fills a disk.
func DefaultLimits() Limits {
	return Limits{MaxTotalBytes: 8 << 30, MaxFileBytes: 2 << 30, MaxEntries: 500_000}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxTotalBytes <= 0 {
		l.MaxTotalBytes = d.MaxTotalBytes
	}
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = d.MaxFileBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = d.MaxEntries
	}
	return l
}

// Stats counts what was applied and what was neutralised.
type Stats struct {
	Entries        int   `json:"entries"`
	Files          int   `json:"files"`
	Dirs           int   `json:"dirs"`
	Symlinks       int   `json:"symlinks"`
	Hardlinks      int   `json:"hardlinks"`
	Whiteouts      int   `json:"whiteouts"`
	Bytes          int64 `json:"bytes"`
	SkippedDevices int   `json:"skipped_devices"`
	SkippedOther   int   `json:"skipped_other"`
	StrippedSetID  int   `json:"stripped_setid"`
}

// Options tune an Extractor.
type Options struct {
	Limits Limits
	// Chown applies the uid/gid recorded in the tar. It needs privileges,
	// so callers set it when running as root; otherwise everything belongs
	// to the caller (the block image builder can then mark it all root).
	Chown bool
}

// Extractor applies the layers of one image, in order, to one directory.
// It is not safe for concurrent use.
type Extractor struct {
	root   *os.Root
	opts   Options
	limits Limits
	stats  Stats
	// dirModes holds the mode each directory must end with. Directories stay
	// owner-writable while layers are applied, so a read-only directory
	// from one layer does not stop a later layer (or an unprivileged
	// extraction) from writing into it.
	dirModes map[string]fs.FileMode
	// streamBudget caps the raw tar bytes read, headers and padding
	// included, so entries that carry no file data cannot be used to make
	// the extractor read forever.
	streamBudget int64
	layer        int
	// thisLayer holds the paths the current layer created or used as a
	// parent: whiteouts only hide content from lower layers.
	thisLayer map[string]bool
}

// New opens dir (which must exist) as the root of the extraction.
func New(dir string, opts Options) (*Extractor, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, &Error{Code: CodeIO, Err: err}
	}
	lim := opts.Limits.withDefaults()
	return &Extractor{
		root:         root,
		opts:         opts,
		limits:       lim,
		dirModes:     map[string]fs.FileMode{},
		streamBudget: lim.MaxTotalBytes + int64(lim.MaxEntries)*3*512 + 1<<20,
	}, nil
}

// Close releases the root. It does not apply directory modes: call Finish.
func (x *Extractor) Close() error { return x.root.Close() }

// Stats returns the counts so far.
func (x *Extractor) Stats() Stats { return x.stats }

// Layer applies one uncompressed tar stream. Layers must be applied lowest
// first. On error the directory is left partly written; callers extract
// into a scratch directory and throw it away.
func (x *Extractor) Layer(ctx context.Context, r io.Reader) error {
	x.layer++
	x.thisLayer = map[string]bool{}
	budget := &budgetReader{r: r, left: x.streamBudget}
	tr := tar.NewReader(budget)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if budget.exhausted {
				return x.errf(CodeLimit, "", "layer stream exceeds the size cap")
			}
			return x.errf(CodeBadEntry, "", "read tar: %v", err)
		}
		if err := x.entry(hdr, tr); err != nil {
			if budget.exhausted {
				return x.errf(CodeLimit, hdr.Name, "layer stream exceeds the size cap")
			}
			return err
		}
	}
	x.streamBudget = budget.left
	return nil
}

// Finish gives every directory its recorded mode, deepest first so a
// read-only parent is set last.
func (x *Extractor) Finish() error {
	dirs := make([]string, 0, len(x.dirModes))
	for d := range x.dirModes {
		dirs = append(dirs, d)
	}
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	for _, d := range dirs {
		fi, err := x.root.Lstat(d)
		if err != nil || !fi.IsDir() {
			continue // removed or replaced by a later layer
		}
		if err := x.chmodDir(d, x.dirModes[d]); err != nil {
			return &Error{Code: CodeIO, Layer: x.layer, Entry: d, Err: err}
		}
	}
	return nil
}

func (x *Extractor) errf(code, entry, format string, args ...any) error {
	return &Error{Code: code, Layer: x.layer, Entry: entry, Err: fmt.Errorf(format, args...)}
}

const whiteoutPrefix = ".wh."
const opaqueWhiteout = ".wh..wh..opq"

func (x *Extractor) entry(hdr *tar.Header, body io.Reader) error {
	x.stats.Entries++
	if x.stats.Entries > x.limits.MaxEntries {
		return x.errf(CodeLimit, hdr.Name, "more than %d entries", x.limits.MaxEntries)
	}
	if hdr.Size < 0 {
		return x.errf(CodeBadEntry, hdr.Name, "negative size")
	}
	if hdr.Size > x.limits.MaxFileBytes {
		return x.errf(CodeLimit, hdr.Name, "entry size %d exceeds the per-file cap %d", hdr.Size, x.limits.MaxFileBytes)
	}
	if x.stats.Bytes+hdr.Size > x.limits.MaxTotalBytes {
		return x.errf(CodeLimit, hdr.Name, "image exceeds the total size cap %d", x.limits.MaxTotalBytes)
	}
	x.stats.Bytes += hdr.Size

	rel, err := cleanName(hdr.Name)
	if err != nil {
		return x.errf(CodePathEscape, hdr.Name, "%v", err)
	}
	if rel == "." {
		// The root itself: only its mode is meaningful.
		if hdr.Typeflag == tar.TypeDir {
			x.dirModes["."] = safeMode(hdr.FileInfo().Mode().Perm() | modeBits(hdr))
		}
		return nil
	}
	base := path.Base(rel)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return x.whiteout(hdr.Name, rel, base)
	}

	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		x.stats.SkippedDevices++
		return nil
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink:
	default:
		// Sparse files arrive as TypeReg from archive/tar; anything else
		// (contiguous files, GNU volume headers, unknown types) is skipped.
		if hdr.Typeflag != tar.TypeGNUSparse && hdr.Typeflag != tar.TypeCont {
			x.stats.SkippedOther++
			return nil
		}
	}

	dir, err := x.resolveParent(rel)
	if err != nil {
		return x.errf(CodeBadEntry, hdr.Name, "%v", err)
	}
	if err := x.mkdirAll(dir); err != nil {
		return x.errf(CodeIO, hdr.Name, "%v", err)
	}
	target := path.Join(dir, base)

	switch hdr.Typeflag {
	case tar.TypeDir:
		err = x.dir(target, hdr)
	case tar.TypeSymlink:
		err = x.symlink(target, hdr)
	case tar.TypeLink:
		err = x.hardlink(target, hdr)
	default:
		err = x.file(target, hdr, body)
	}
	if err != nil {
		var xe *Error
		if errors.As(err, &xe) {
			return err
		}
		return x.errf(CodeIO, hdr.Name, "%v", err)
	}
	x.thisLayer[target] = true
	return nil
}

// cleanName turns a tar entry name into a clean relative path. Absolute
// names are taken as relative to the root (that is what they mean inside
// an image); names that climb above the root are refused.
func cleanName(name string) (string, error) {
	if name == "" {
		return "", errors.New("empty entry name")
	}
	if strings.ContainsRune(name, 0) {
		return "", errors.New("entry name contains NUL")
	}
	p := path.Clean("/" + name)
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", errors.New("entry name contains '..'")
		}
	}
	if p == "/" {
		return ".", nil
	}
	return strings.TrimPrefix(p, "/"), nil
}

// maxSymlinkHops bounds symlink resolution like the kernel's ELOOP limit.
const maxSymlinkHops = 40

// resolveParent resolves the directory part of rel with chroot semantics
// and returns a path with no symlinks in it (the last component of rel is
// never followed: entries replace what is there). Components that do not
// exist yet are kept as they are; mkdirAll creates them.
func (x *Extractor) resolveParent(rel string) (string, error) {
	d := path.Dir(rel)
	if d == "." {
		return ".", nil
	}
	return x.resolve(strings.Split(d, "/"))
}

func (x *Extractor) resolve(pending []string) (string, error) {
	var done []string
	hops := 0
	missing := false
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			// Clamped at the root, as in a chroot.
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		cand := strings.Join(append(slices.Clone(done), c), "/")
		if missing {
			done = append(done, c)
			continue
		}
		fi, err := x.root.Lstat(cand)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			missing = true
			done = append(done, c)
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink != 0:
			hops++
			if hops > maxSymlinkHops {
				return "", fmt.Errorf("too many levels of symbolic links at %q", cand)
			}
			target, err := x.root.Readlink(cand)
			if err != nil {
				return "", err
			}
			if strings.HasPrefix(target, "/") {
				done = nil
			}
			pending = append(strings.Split(target, "/"), pending...)
		case fi.IsDir():
			done = append(done, c)
		default:
			return "", fmt.Errorf("%q is not a directory", cand)
		}
	}
	if len(done) == 0 {
		return ".", nil
	}
	return strings.Join(done, "/"), nil
}

// mkdirAll creates dir and its missing parents (dir has no symlinks, see
// resolve) and marks them as used by this layer.
func (x *Extractor) mkdirAll(dir string) error {
	if dir == "." {
		return nil
	}
	parts := strings.Split(dir, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		x.thisLayer[p] = true
		fi, err := x.root.Lstat(p)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("%q is not a directory", p)
			}
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := x.root.Mkdir(p, 0o755); err != nil {
			return err
		}
		if err := x.chmodDir(p, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// removeExisting clears the way for a new entry at p. An existing
// directory survives only when the new entry is a directory too (tar
// semantics: directories merge, everything else replaces).
func (x *Extractor) removeExisting(p string, keepDir bool) (exists bool, err error) {
	fi, err := x.root.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fi.IsDir() {
		if keepDir {
			return true, nil
		}
		x.forgetDirs(p)
		return false, x.root.RemoveAll(p)
	}
	return false, x.root.Remove(p)
}

func (x *Extractor) forgetDirs(p string) {
	for d := range x.dirModes {
		if d == p || strings.HasPrefix(d, p+"/") {
			delete(x.dirModes, d)
		}
	}
}

func (x *Extractor) dir(p string, hdr *tar.Header) error {
	exists, err := x.removeExisting(p, true)
	if err != nil {
		return err
	}
	if !exists {
		if err := x.root.Mkdir(p, 0o700); err != nil {
			return err
		}
	}
	mode := x.stripSetID(hdr)
	x.dirModes[p] = mode
	// Owner-writable until Finish, see dirModes.
	if err := x.chmodDir(p, mode.Perm()|0o700); err != nil {
		return err
	}
	if x.opts.Chown {
		if err := x.root.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	x.stats.Dirs++
	return nil
}

func (x *Extractor) chmodDir(p string, mode fs.FileMode) error {
	// Through an open descriptor: a chmod by name would follow a symlink
	// swapped in at the last moment.
	f, err := x.root.OpenFile(p, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Chmod(mode)
}

func (x *Extractor) file(p string, hdr *tar.Header, body io.Reader) error {
	if _, err := x.removeExisting(p, false); err != nil {
		return err
	}
	f, err := x.root.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	// The tar reader yields exactly hdr.Size bytes (checked against the
	// caps above); the LimitReader is a second guard that does not depend on
	// that contract.
	n, err := io.Copy(f, io.LimitReader(body, hdr.Size))
	if err == nil && n != hdr.Size {
		err = fmt.Errorf("short file: %d of %d bytes", n, hdr.Size)
	}
	if err == nil {
		err = f.Chmod(x.stripSetID(hdr))
	}
	if err == nil && x.opts.Chown {
		err = f.Chown(hdr.Uid, hdr.Gid)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if !hdr.ModTime.IsZero() {
		if err := x.root.Chtimes(p, hdr.ModTime, hdr.ModTime); err != nil {
			return err
		}
	}
	x.stats.Files++
	return nil
}

func (x *Extractor) symlink(p string, hdr *tar.Header) error {
	if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
		return x.errf(CodeBadEntry, hdr.Name, "symlink with an empty or invalid target")
	}
	if _, err := x.removeExisting(p, false); err != nil {
		return err
	}
	// The target is stored as it is: it is only ever followed inside the
	// guest, or here through resolve, both confined to the root.
	if err := x.root.Symlink(hdr.Linkname, p); err != nil {
		return err
	}
	if x.opts.Chown {
		if err := x.root.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	x.stats.Symlinks++
	return nil
}

func (x *Extractor) hardlink(p string, hdr *tar.Header) error {
	ln, err := cleanName(hdr.Linkname)
	if err != nil || ln == "." {
		return x.errf(CodePathEscape, hdr.Name, "hard link target %q leaves the root", hdr.Linkname)
	}
	dir, err := x.resolveParent(ln)
	if err != nil {
		return x.errf(CodeBadEntry, hdr.Name, "hard link target %q: %v", hdr.Linkname, err)
	}
	src := path.Join(dir, path.Base(ln))
	fi, err := x.root.Lstat(src)
	if err != nil {
		return x.errf(CodeBadEntry, hdr.Name, "hard link target %q: %v", hdr.Linkname, err)
	}
	if !fi.Mode().IsRegular() && fi.Mode()&fs.ModeSymlink == 0 {
		return x.errf(CodeBadEntry, hdr.Name, "hard link target %q is not a file", hdr.Linkname)
	}
	if src == p {
		return nil
	}
	if _, err := x.removeExisting(p, false); err != nil {
		return err
	}
	if err := x.root.Link(src, p); err != nil {
		return err
	}
	x.stats.Hardlinks++
	return nil
}

func (x *Extractor) whiteout(name, rel, base string) error {
	x.stats.Whiteouts++
	dir, err := x.resolveParent(rel)
	if err != nil {
		return x.errf(CodeBadEntry, name, "%v", err)
	}
	if fi, err := x.root.Lstat(dir); err != nil || !fi.IsDir() {
		return nil // nothing below to hide
	}
	if base == opaqueWhiteout {
		return x.hideBelow(dir, name)
	}
	victim := strings.TrimPrefix(base, whiteoutPrefix)
	if victim == "" || victim == "." || victim == ".." || strings.HasPrefix(victim, whiteoutPrefix) {
		// ".wh..wh.*" names other than the opaque marker are AUFS
		// bookkeeping; they carry nothing to apply.
		return nil
	}
	p := path.Join(dir, victim)
	if x.thisLayer[p] {
		return nil
	}
	x.forgetDirs(p)
	if err := x.root.RemoveAll(p); err != nil {
		return x.errf(CodeIO, name, "%v", err)
	}
	return nil
}

// hideBelow empties dir of everything lower layers put there, keeping what
// this layer wrote.
func (x *Extractor) hideBelow(dir, name string) error {
	f, err := x.root.Open(dir)
	if err != nil {
		return x.errf(CodeIO, name, "%v", err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return x.errf(CodeIO, name, "%v", err)
	}
	for _, n := range names {
		p := path.Join(dir, n)
		if !x.thisLayer[p] {
			x.forgetDirs(p)
			if err := x.root.RemoveAll(p); err != nil {
				return x.errf(CodeIO, name, "%v", err)
			}
			continue
		}
		if fi, err := x.root.Lstat(p); err == nil && fi.IsDir() {
			if err := x.hideBelow(p, name); err != nil {
				return err
			}
		}
	}
	return nil
}

// stripSetID returns the entry's permission bits (plus sticky) without
// setuid/setgid, counting each stripped entry.
func (x *Extractor) stripSetID(hdr *tar.Header) fs.FileMode {
	if hdr.Mode&(cISUID|cISGID) != 0 {
		x.stats.StrippedSetID++
	}
	return safeMode(fs.FileMode(hdr.Mode).Perm() | modeBits(hdr))
}

const (
	cISUID = 0o4000
	cISGID = 0o2000
	cISVTX = 0o1000
)

func modeBits(hdr *tar.Header) fs.FileMode {
	if hdr.Mode&cISVTX != 0 {
		return fs.ModeSticky
	}
	return 0
}

func safeMode(m fs.FileMode) fs.FileMode { return m & (fs.ModePerm | fs.ModeSticky) }

// budgetReader fails once more than left bytes were read.
type budgetReader struct {
	r         io.Reader
	left      int64
	exhausted bool
}

var errBudget = errors.New("stream size cap reached")

func (b *budgetReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		b.exhausted = true
		return 0, errBudget
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}
