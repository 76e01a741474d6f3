package selfupdate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/Masterminds/semver/v3"
)

// plan is one binary to replace from one asset.
type plan struct {
	product string // iii, iii-cloud: the file name inside the archive
	path    string // the installed file, replaced in place
	version string // the release version
	target  string
	url     string // where the asset is fetched
	asset   Asset
	// exact: the new binary must report version as its own; otherwise it
	// only has to run.
	exact bool
}

func (p plan) label() string { return p.product + " " + p.version }

// install downloads, verifies, extracts and checks the new binary beside
// the installed one, then renames it over it. Until that rename the
// installed file is not touched; temporary files are removed on every
// path.
func install(ctx context.Context, f *fetcher, p plan) error {
	dir, base := filepath.Dir(p.path), filepath.Base(p.path)
	old, err := os.Stat(p.path)
	if err != nil {
		return newError(CodeReplaceFailed, fmt.Sprintf("cannot read the installed %s at %s: %s; nothing was changed", p.product, p.path, errText(err, "")))
	}
	// The download goes beside the binary, not to $TMPDIR: creating it
	// proves the directory is writable before a byte is fetched, and the
	// staged binary renames over the old one on the same file system.
	dl, err := os.CreateTemp(dir, "."+base+".download-*")
	if err != nil {
		return writeError(dir, p.product, err)
	}
	defer func() {
		dl.Close()
		os.Remove(dl.Name())
	}()
	if err := f.download(ctx, p.url, p.asset, p.label(), p.target, dl); err != nil {
		return err
	}
	if _, err := dl.Seek(0, io.SeekStart); err != nil {
		return newError(CodeReplaceFailed, fmt.Sprintf("read the downloaded archive %s: %v; nothing was changed", dl.Name(), err))
	}
	staged, err := os.CreateTemp(dir, "."+base+".new-*")
	if err != nil {
		return writeError(dir, p.product, err)
	}
	stagedPath := staged.Name()
	renamed := false
	defer func() {
		staged.Close()
		if !renamed {
			os.Remove(stagedPath)
		}
	}()
	if _, err := extractBinary(dl, p.product, staged); err != nil {
		return newError(CodeArchiveInvalid, fmt.Sprintf("the archive of %s (%s) from %s cannot be used: %v; nothing was changed", p.label(), p.target, p.url, err))
	}
	if err := staged.Chmod(old.Mode().Perm()); err != nil {
		return newError(CodeReplaceFailed, fmt.Sprintf("set the mode of %s: %v; nothing was changed", stagedPath, errText(err, "")))
	}
	keepOwner(staged, old)
	// fsync before the rename: after a crash the name points at either
	// the old binary or the complete new one, never at a short file.
	if err := staged.Sync(); err != nil {
		return newError(CodeReplaceFailed, fmt.Sprintf("write %s: %v; nothing was changed", stagedPath, errText(err, "")))
	}
	if err := staged.Close(); err != nil {
		return newError(CodeReplaceFailed, fmt.Sprintf("write %s: %v; nothing was changed", stagedPath, errText(err, "")))
	}
	if err := checkRuns(ctx, stagedPath, p); err != nil {
		return err
	}
	if err := os.Rename(stagedPath, p.path); err != nil {
		return writeError(dir, p.product, err)
	}
	renamed = true
	syncDir(dir)
	return nil
}

// checkRuns runs `<staged> --version` before the staged binary replaces
// anything: a binary that does not start on this host (another
// architecture, a broken build) or, for iii, reports another version than
// its release (which `iii update` would then try to install forever) is
// refused.
func checkRuns(ctx context.Context, staged string, p plan) error {
	got, err := runVersion(ctx, staged)
	if err != nil {
		return newError(CodeBinaryUnusable, fmt.Sprintf("the new %s (%s) does not run on this host: %v; nothing was changed. Check that the release's %s asset is built for %s",
			p.label(), p.target, err, AssetName(p.product, p.target), p.target))
	}
	if p.exact && !sameVersion(got, p.version) {
		shown := got
		if shown == "" {
			shown = "no version"
		}
		return newError(CodeBinaryUnusable, fmt.Sprintf("the new %s reports %s, not %s: the release is mislabelled; nothing was changed", p.product, shown, p.version))
	}
	return nil
}

// runVersion runs `<path> --version` and returns the version it prints
// ("" when its output holds none). An error means it did not run or
// failed.
func runVersion(ctx context.Context, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, VersionTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		out, err := runVersionOnce(ctx, path)
		// A file just written can be "text file busy" for a moment when
		// another goroutine forked while it was open for writing; the
		// child closes the inherited descriptor when it execs.
		if err == nil || !errors.Is(err, syscall.ETXTBSY) || attempt == 5 {
			return out, err
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Duration(attempt) * 20 * time.Millisecond):
		}
	}
}

func runVersionOnce(ctx context.Context, path string) (string, error) {
	cmd := exec.CommandContext(ctx, path, "--version")
	cmd.Env = append(os.Environ(), "III_LOG_LEVEL=error")
	var out, errOut strings.Builder
	cmd.Stdout = &limitedBuilder{b: &out, left: 4096}
	cmd.Stderr = &limitedBuilder{b: &errOut, left: 4096}
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(errOut.String()); msg != "" {
			return "", fmt.Errorf("%w (%s)", err, clip(msg, 200))
		}
		return "", err
	}
	return ParseVersionOutput(out.String()), nil
}

// ParseVersionOutput finds the version in what `--version` printed: the
// first word that reads as a semantic version (iii prints the bare
// version; other tools print "name 1.2.3" or "name v1.2.3").
func ParseVersionOutput(out string) string {
	for _, w := range strings.Fields(out) {
		w = NormalizeVersion(strings.Trim(w, ",;()"))
		if v, err := semver.StrictNewVersion(w); err == nil {
			return v.Original()
		}
	}
	return ""
}

// compareVersions compares two versions; ok is false when either is not a
// semantic version (a development build), which is never up to date.
func compareVersions(a, b string) (cmp int, ok bool) {
	va, err := semver.StrictNewVersion(NormalizeVersion(a))
	if err != nil {
		return 0, false
	}
	vb, err := semver.StrictNewVersion(NormalizeVersion(b))
	if err != nil {
		return 0, false
	}
	return va.Compare(vb), true
}

func sameVersion(a, b string) bool {
	c, ok := compareVersions(a, b)
	return ok && c == 0
}

// writeError classifies a failure to write into the install directory:
// permissions (and read-only file systems) get the fix.
func writeError(dir, product string, err error) error {
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS) {
		return newError(CodeDirNotWritable, fmt.Sprintf(
			"%s is installed in %s, which this user cannot write (%s); nothing was changed. "+
				"Run the update as a user who can (for example `sudo iii update`), "+
				"or install iii in a directory you own, such as ~/.local/bin, and put that directory first on your PATH. "+
				"A copy from a package manager is updated by it (`brew upgrade iii`)",
			product, dir, errText(err, "")))
	}
	return newError(CodeReplaceFailed, fmt.Sprintf("replace %s in %s: %s; nothing was changed", product, dir, errText(unwrapLink(err), "")))
}

func unwrapLink(err error) error {
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// limitedBuilder keeps the first left bytes written and drops the rest
// (a binary that prints without end must not fill memory).
type limitedBuilder struct {
	b    *strings.Builder
	left int
}

func (l *limitedBuilder) Write(p []byte) (int, error) {
	if l.left > 0 {
		n := min(len(p), l.left)
		l.b.Write(p[:n])
		l.left -= n
	}
	return len(p), nil
}
