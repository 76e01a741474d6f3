// Package packages installs registry packages into Compose's shared
// package cache (spec §5.7): it downloads an artefact, verifies its
// SHA-256, unpacks it with the safe extractor under tight limits, and
// moves it atomically into <cache>/<name>-<version>-<target>/ with a
// marker that records the artefact's digest and every file's. Before an
// entry is reused its contents are checked against the marker; a
// modified entry is downloaded again.
package packages

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/internal/download"
)

// Limits of what one package may unpack to, and of its download.
const (
	MaxTotalBytes = 64 << 20
	MaxFileBytes  = 32 << 20
	MaxEntries    = 1024
	MaxDepth      = 16
	// MaxArchiveBytes bounds the compressed download: an archive is never
	// much larger than what it unpacks to.
	MaxArchiveBytes = MaxTotalBytes + 8<<20
	// DownloadTimeout bounds one artefact download.
	DownloadTimeout = 300 * time.Second
	// MarkerFile sits in every cache entry; it records what was
	// installed there.
	MarkerFile = ".iii-package.json"
	// ManifestFile must be at the top of a bundle.
	ManifestFile = "iii.worker.yaml"
	// executableDepth is how deep the executable of a binary package may
	// sit (entry/name, entry/bin/name, entry/a/b/name); the engine's
	// plugin host searches as deep.
	executableDepth = 3
)

// EnvStateDir moves Compose's state, and with it the package cache.
const EnvStateDir = "III_COMPOSE_STATE_DIR"

// CacheDir is the shared package cache: $III_COMPOSE_STATE_DIR/packages,
// else ~/.iii/compose/packages.
func CacheDir(getenv func(string) string, home func() (string, error)) (string, error) {
	if d := getenv(EnvStateDir); d != "" {
		abs, err := filepath.Abs(d)
		if err != nil {
			return "", compose.New(compose.CodeStateDirUnavailable, fmt.Sprintf("$%s=%s: %v", EnvStateDir, d, err))
		}
		return filepath.Join(abs, "packages"), nil
	}
	h, err := home()
	if err != nil || h == "" {
		return "", compose.New(compose.CodeStateDirUnavailable, fmt.Sprintf(
			"the package cache lives in ~/.iii/compose/packages, and the home directory is unknown (%v); set $HOME or $%s", err, EnvStateDir))
	}
	return filepath.Join(h, ".iii", "compose", "packages"), nil
}

// EntryName is a cache entry's directory name, the one the engine's
// plugin host looks for.
func EntryName(name, version, target string) string { return name + "-" + version + "-" + target }

// Request is one artefact to install.
type Request struct {
	Name, Version, Kind, Target string
	// URL is absolute: http, https or file.
	URL    string
	SHA256 string
	// Size is the archive's size when the registry says it; 0 otherwise.
	Size int64
}

// Installed is a verified cache entry.
type Installed struct {
	Dir string
	// Executable is the binary package's executable (absolute); "" for a
	// bundle.
	Executable string
	// Reused is true when the entry was already in the cache and checked
	// out intact.
	Reused bool
}

// Installer installs packages into one cache directory.
type Installer struct {
	// Dir is the cache directory; it is created when needed.
	Dir string
	// HTTP downloads http(s) artefacts; nil means a default client.
	HTTP *http.Client
	// Progress is told about downloads; nil tells nobody.
	Progress Progress
}

func (in *Installer) report(ev Event) {
	if in.Progress != nil {
		in.Progress(ev)
	}
}

func (r Request) label() string { return r.Name + " " + r.Version }

func (r Request) check() error {
	for what, v := range map[string]string{"name": r.Name, "version": r.Version, "target": r.Target} {
		if !registry.PathSafe(v) {
			return compose.New(compose.CodeRegistryNameRefused, fmt.Sprintf("package %s %q is not path-safe (letters, digits, ., _ and -); it is not installed", what, clip(v, 80)))
		}
	}
	if !registry.ValidSHA256(r.SHA256) {
		return compose.New(compose.CodePackageDigestMismatch, fmt.Sprintf("%s: the expected sha256 %q is not 64 lower-case hex digits", r.label(), clip(r.SHA256, 80)))
	}
	if r.Kind != registry.KindBinary && r.Kind != registry.KindBundle {
		return compose.New(compose.CodeUnsupportedPackageKind, fmt.Sprintf("%s has kind %q; only binary and bundle packages are installed", r.label(), clip(r.Kind, 40)))
	}
	return nil
}

// Install makes sure the artefact is in the cache, intact, and returns
// its entry. Nothing is moved into the cache before the download's digest
// matched and the archive unpacked within the limits.
func (in *Installer) Install(ctx context.Context, req Request) (*Installed, error) {
	if err := req.check(); err != nil {
		return nil, err
	}
	entry := filepath.Join(in.Dir, EntryName(req.Name, req.Version, req.Target))
	if _, err := os.Lstat(entry); err == nil {
		got, why := verifyEntry(entry, req)
		if got != nil {
			got.Reused = true
			in.report(Event{Phase: PhaseReused, Package: req.label(), Target: req.Target, Dir: entry})
			return got, nil
		}
		in.report(Event{Phase: PhaseStale, Package: req.label(), Target: req.Target, Dir: entry, Detail: why})
	}
	if err := os.MkdirAll(in.Dir, 0o755); err != nil {
		return nil, compose.New(compose.CodeIOError, fmt.Sprintf("create the package cache %s: %v", in.Dir, unwrapPath(err)))
	}
	archive, err := in.fetch(ctx, req)
	if err != nil {
		return nil, err
	}
	defer os.Remove(archive)
	tmp, err := os.MkdirTemp(in.Dir, ".unpack-"+EntryName(req.Name, req.Version, req.Target)+"-")
	if err != nil {
		return nil, compose.New(compose.CodeIOError, fmt.Sprintf("unpack %s: %v", req.label(), unwrapPath(err)))
	}
	defer os.RemoveAll(tmp)
	if err := unpack(ctx, archive, tmp, req); err != nil {
		return nil, err
	}
	m, err := seal(tmp, req)
	if err != nil {
		return nil, err
	}
	if err := in.place(tmp, entry, req); err != nil {
		return nil, err
	}
	got := &Installed{Dir: entry}
	if m.Executable != "" {
		got.Executable = filepath.Join(entry, filepath.FromSlash(m.Executable))
	}
	in.report(Event{Phase: PhaseInstalled, Package: req.label(), Target: req.Target, Dir: entry})
	return got, nil
}

// place moves the unpacked tree to entry. Whatever is there (a stale
// entry, or one another Compose installed meanwhile) is kept when it
// checks out and moved aside otherwise.
func (in *Installer) place(tmp, entry string, req Request) error {
	for attempt := 0; attempt < 3; attempt++ {
		err := os.Rename(tmp, entry)
		if err == nil {
			syncDir(in.Dir)
			return nil
		}
		if _, serr := os.Lstat(entry); serr != nil {
			return compose.New(compose.CodeIOError, fmt.Sprintf("install %s into %s: %v", req.label(), entry, unwrapLink(err)))
		}
		if got, _ := verifyEntry(entry, req); got != nil {
			return nil
		}
		trash, terr := os.MkdirTemp(in.Dir, ".trash-")
		if terr != nil {
			return compose.New(compose.CodeIOError, fmt.Sprintf("replace %s: %v", entry, unwrapPath(terr)))
		}
		moved := filepath.Join(trash, "old")
		if err := os.Rename(entry, moved); err != nil && !errors.Is(err, fs.ErrNotExist) {
			_ = os.RemoveAll(trash)
			return compose.New(compose.CodeIOError, fmt.Sprintf("replace %s: %v", entry, unwrapLink(err)))
		}
		_ = makeWritable(trash)
		_ = os.RemoveAll(trash)
	}
	return compose.New(compose.CodeIOError, fmt.Sprintf("install %s: %s keeps changing under Compose", req.label(), entry))
}

// makeWritable lets RemoveAll delete a tree whose directories an archive
// made read-only.
func makeWritable(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// fetch downloads the artefact into a temporary file in the cache
// directory and returns its path once its digest matched.
func (in *Installer) fetch(ctx context.Context, req Request) (path string, err error) {
	f, err := os.CreateTemp(in.Dir, ".download-"+EntryName(req.Name, req.Version, req.Target)+"-")
	if err != nil {
		return "", compose.New(compose.CodeIOError, fmt.Sprintf("download %s: %v", req.label(), unwrapPath(err)))
	}
	defer func() {
		cerr := f.Close()
		if err == nil && cerr != nil {
			err = compose.New(compose.CodeIOError, fmt.Sprintf("download %s: %v", req.label(), cerr))
		}
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	body, total, err := in.open(ctx, req)
	if err != nil {
		return "", err
	}
	defer body.Close()
	if req.Size > 0 {
		total = req.Size
	}
	in.report(Event{Phase: PhaseDownload, Package: req.label(), Target: req.Target, URL: req.URL, Total: total})
	limit := int64(MaxArchiveBytes)
	if req.Size > 0 && req.Size < limit {
		limit = req.Size
	}
	meter := &download.Meter{Total: total, Steps: progressSteps, Report: func(n int64) {
		in.report(Event{Phase: PhaseProgress, Package: req.label(), Target: req.Target, Bytes: n, Total: total})
	}}
	n, sum, err := download.Copy(f, body, limit, meter)
	if err != nil {
		if ctx.Err() != nil {
			return "", compose.New(compose.CodePackageDownloadFailed, fmt.Sprintf("download of %s from %s was interrupted: %v", req.label(), req.URL, ctx.Err()))
		}
		return "", compose.New(compose.CodePackageDownloadFailed, fmt.Sprintf("download of %s from %s failed after %d bytes: %v", req.label(), req.URL, n, unwrapLink(err)))
	}
	if n > limit {
		if req.Size > 0 {
			return "", digestMismatch(req, fmt.Sprintf("it is larger than the %d bytes the registry lists", req.Size))
		}
		return "", compose.New(compose.CodePackageDownloadFailed, fmt.Sprintf("the artefact of %s at %s is larger than %d MiB; Compose refuses it", req.label(), req.URL, MaxArchiveBytes>>20))
	}
	if req.Size > 0 && n != req.Size {
		return "", digestMismatch(req, fmt.Sprintf("it has %d bytes, not the %d the registry lists", n, req.Size))
	}
	if sum != req.SHA256 {
		return "", digestMismatch(req, "its sha256 is "+sum)
	}
	if err := f.Sync(); err != nil {
		return "", compose.New(compose.CodeIOError, fmt.Sprintf("download %s: %v", req.label(), err))
	}
	in.report(Event{Phase: PhaseVerified, Package: req.label(), Target: req.Target, Bytes: n, Total: n})
	return f.Name(), nil
}

func digestMismatch(req Request, why string) error {
	return compose.New(compose.CodePackageDigestMismatch, fmt.Sprintf(
		"the artefact of %s (%s) from %s does not match: %s, and sha256 %s is expected; nothing was installed. The artefact changed since it was published or locked, or the download was altered",
		req.label(), req.Target, req.URL, why, req.SHA256))
}

// open starts reading an artefact URL; total is its length when known.
func (in *Installer) open(ctx context.Context, req Request) (io.ReadCloser, int64, error) {
	body, total, err := download.Open(ctx, in.HTTP, req.URL, DownloadTimeout)
	if err != nil {
		return nil, 0, compose.New(compose.CodePackageDownloadFailed, fmt.Sprintf("download of %s from %s failed: %v", req.label(), req.URL, err))
	}
	return body, total, nil
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func unwrapLink(err error) error {
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return unwrapPath(err)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// isExecutable reports a regular file someone may execute.
func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}

// findExecutable is the executable a binary package runs: one named like
// the package, shallowest first; else the first executable file, in name
// order, at most executableDepth levels down. "" when there is none.
func findExecutable(dir, name string) string {
	level := []string{"."}
	var first string
	for range executableDepth {
		var next []string
		for _, d := range level {
			if p := filepath.Join(dir, d, name); isExecutable(p) {
				return filepath.ToSlash(filepath.Join(d, name))
			}
			entries, err := os.ReadDir(filepath.Join(dir, d))
			if err != nil {
				continue
			}
			for _, e := range entries {
				rel := filepath.Join(d, e.Name())
				switch {
				case e.IsDir():
					next = append(next, rel)
				case first == "" && e.Type().IsRegular() && e.Name() != MarkerFile && isExecutable(filepath.Join(dir, rel)):
					first = filepath.ToSlash(rel)
				}
			}
		}
		level = next
	}
	return strings.TrimPrefix(first, "./")
}
