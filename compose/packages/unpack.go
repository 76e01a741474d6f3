package packages

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/registry"
	extract "github.com/iii-sandbox/iii/internal/tarextract"
)

// markerVersion is the marker format.
const markerVersion = 1

// marker records what a cache entry holds: the artefact it came from and
// every file in it, so a changed entry is noticed before it runs.
type marker struct {
	Version        int    `json:"version"`
	Name           string `json:"name"`
	PackageVersion string `json:"package_version"`
	Target         string `json:"target"`
	Kind           string `json:"kind"`
	ArtifactSHA256 string `json:"artifact_sha256"`
	// Executable is the binary package's executable, relative (slashes).
	Executable string               `json:"executable,omitempty"`
	Files      map[string]fileEntry `json:"files"`
}

type fileEntry struct {
	Mode   fs.FileMode `json:"mode"`
	SHA256 string      `json:"sha256,omitempty"`
	Link   string      `json:"link,omitempty"`
}

// unpack extracts the archive into dir: a tar stream, gzip- or
// zstd-compressed or not. The stream is checked first (entry count, depth,
// links), then extracted by the safe extractor with the package limits.
func unpack(ctx context.Context, archive, dir string, req Request) error {
	fail := func(err error) error {
		return compose.New(compose.CodePackageDownloadFailed, fmt.Sprintf(
			"the artefact of %s (%s) from %s cannot be unpacked safely: %v; nothing was installed", req.label(), req.Target, req.URL, err))
	}
	if err := withTar(archive, func(r io.Reader) error { return prescan(r) }); err != nil {
		return fail(err)
	}
	err := withTar(archive, func(r io.Reader) error {
		x, err := extract.New(dir, extract.Options{Limits: extract.Limits{MaxTotalBytes: MaxTotalBytes, MaxFileBytes: MaxFileBytes, MaxEntries: MaxEntries}})
		if err != nil {
			return err
		}
		defer x.Close()
		if err := x.Layer(ctx, r); err != nil {
			return err
		}
		return x.Finish()
	})
	if err != nil {
		if ctx.Err() != nil {
			return compose.New(compose.CodePackageDownloadFailed, fmt.Sprintf("unpacking %s was interrupted: %v", req.label(), ctx.Err()))
		}
		return fail(err)
	}
	return nil
}

func withTar(archive string, fn func(io.Reader) error) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := extract.Decompress(f)
	if err != nil {
		return err
	}
	defer r.Close()
	return fn(r)
}

// prescan reads the tar headers and refuses what the extractor would let
// through but a package must not have: more than MaxDepth levels, links
// that point outside the package, and anything over the limits (checked
// here too, so a bomb is refused before a byte is written).
func prescan(r io.Reader) error {
	budget := &limitedReader{r: r, left: MaxTotalBytes + int64(MaxEntries)*3*512 + 1<<20}
	tr := tar.NewReader(budget)
	var entries int
	var total int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if entries == 0 {
				return errors.New("the archive is empty")
			}
			return nil
		}
		if err != nil {
			if budget.left <= 0 {
				return fmt.Errorf("the archive is larger than %d MiB unpacked", MaxTotalBytes>>20)
			}
			return fmt.Errorf("not a tar archive: %v", err)
		}
		entries++
		if entries > MaxEntries {
			return fmt.Errorf("more than %d entries", MaxEntries)
		}
		if hdr.Size > MaxFileBytes {
			return fmt.Errorf("entry %q is larger than %d MiB", clip(hdr.Name, 120), MaxFileBytes>>20)
		}
		total += max(hdr.Size, 0)
		if total > MaxTotalBytes {
			return fmt.Errorf("the archive is larger than %d MiB unpacked", MaxTotalBytes>>20)
		}
		name := path.Clean("/" + hdr.Name)
		for _, c := range strings.Split(hdr.Name, "/") {
			if c == ".." {
				return fmt.Errorf("entry %q climbs out of the package", clip(hdr.Name, 120))
			}
		}
		if depth := strings.Count(name, "/"); depth > MaxDepth {
			return fmt.Errorf("entry %q is nested %d levels deep, more than %d", clip(hdr.Name, 120), depth, MaxDepth)
		}
		if hdr.Typeflag == tar.TypeSymlink {
			if strings.HasPrefix(hdr.Linkname, "/") {
				return fmt.Errorf("symlink %q points at the absolute path %q", clip(hdr.Name, 120), clip(hdr.Linkname, 120))
			}
			if escapes(path.Dir(name), hdr.Linkname) {
				return fmt.Errorf("symlink %q points outside the package (%q)", clip(hdr.Name, 120), clip(hdr.Linkname, 120))
			}
		}
		switch hdr.Typeflag {
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			return fmt.Errorf("entry %q is a device or fifo", clip(hdr.Name, 120))
		}
	}
}

// escapes reports whether following link from dir (both slash paths,
// dir absolute within the package) climbs above the package root at any
// step.
func escapes(dir, link string) bool {
	depth := strings.Count(strings.Trim(dir, "/"), "/") + 1
	if dir == "/" {
		depth = 0
	}
	for _, c := range strings.Split(link, "/") {
		switch c {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return true
			}
		default:
			depth++
		}
	}
	return false
}

type limitedReader struct {
	r    io.Reader
	left int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, errors.New("size cap reached")
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// seal checks the unpacked tree holds something to run (an executable
// for a binary, iii.worker.yaml for a bundle: PACKAGE_ARTIFACT_EMPTY
// otherwise), takes write permission from group and others, and writes
// the marker.
func seal(dir string, req Request) (*marker, error) {
	m := &marker{Version: markerVersion, Name: req.Name, PackageVersion: req.Version, Target: req.Target, Kind: req.Kind, ArtifactSHA256: req.SHA256}
	switch req.Kind {
	case registry.KindBinary:
		m.Executable = findExecutable(dir, req.Name)
		if m.Executable == "" {
			return nil, compose.New(compose.CodePackageArtifactEmpty, fmt.Sprintf(
				"the artefact of %s (%s) from %s holds no executable (looked for %s, or any executable file, up to %d levels deep); nothing was installed",
				req.label(), req.Target, req.URL, req.Name, executableDepth))
		}
	case registry.KindBundle:
		if st, err := os.Lstat(filepath.Join(dir, ManifestFile)); err != nil || !st.Mode().IsRegular() {
			return nil, compose.New(compose.CodePackageArtifactEmpty, fmt.Sprintf(
				"the artefact of %s (%s) from %s is a bundle without %s at its top; nothing was installed", req.label(), req.Target, req.URL, ManifestFile))
		}
	}
	files, err := scan(dir, true)
	if err != nil {
		return nil, compose.New(compose.CodeIOError, fmt.Sprintf("install %s: %v", req.label(), err))
	}
	m.Files = files
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, compose.New(compose.CodeIOError, fmt.Sprintf("install %s: %v", req.label(), err))
	}
	if err := os.WriteFile(filepath.Join(dir, MarkerFile), append(data, '\n'), 0o644); err != nil {
		return nil, compose.New(compose.CodeIOError, fmt.Sprintf("install %s: %v", req.label(), unwrapPath(err)))
	}
	return m, nil
}

// scan hashes every file and link under dir (the marker excluded). With
// tighten, files and directories lose group and other write permission
// first: the cache is shared, its entries must not be writable by others.
func scan(dir string, tighten bool) (map[string]fileEntry, error) {
	out := map[string]fileEntry{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, rerr := filepath.Rel(dir, p)
		if rerr != nil {
			return rerr
		}
		rel = filepath.ToSlash(rel)
		if rel == "." || rel == MarkerFile {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := info.Mode()
		switch {
		case mode.IsDir():
			if tighten && mode.Perm()&0o022 != 0 {
				if err := os.Chmod(p, mode.Perm()&^0o022); err != nil {
					return err
				}
			}
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = fileEntry{Mode: fs.ModeSymlink, Link: target}
		case mode.IsRegular():
			perm := mode.Perm()
			if tighten && perm&0o022 != 0 {
				perm &^= 0o022
				if err := os.Chmod(p, perm); err != nil {
					return err
				}
			}
			sum, err := hashFile(p)
			if err != nil {
				return err
			}
			out[rel] = fileEntry{Mode: perm, SHA256: sum}
		default:
			return fmt.Errorf("%s is neither a file, a directory nor a symlink", rel)
		}
		return nil
	})
	return out, err
}

func hashFile(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, MaxFileBytes+1)); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// verifyEntry checks a cache entry against its marker and the request:
// the same artefact digest, and every file as it was installed (no file
// changed, added or removed). It returns the entry, or why it is not
// usable.
func verifyEntry(entry string, req Request) (*Installed, string) {
	data, err := os.ReadFile(filepath.Join(entry, MarkerFile))
	if err != nil {
		return nil, "it has no install marker"
	}
	var m marker
	if err := json.Unmarshal(data, &m); err != nil || m.Version != markerVersion {
		return nil, "its install marker is unreadable"
	}
	if m.ArtifactSHA256 != req.SHA256 || m.Name != req.Name || m.PackageVersion != req.Version || m.Target != req.Target || m.Kind != req.Kind {
		return nil, "it was installed from another artefact (sha256 " + clip(m.ArtifactSHA256, 64) + ")"
	}
	files, err := scan(entry, false)
	if err != nil {
		return nil, "it cannot be read: " + err.Error()
	}
	var changed []string
	for rel, want := range m.Files {
		got, ok := files[rel]
		switch {
		case !ok:
			changed = append(changed, rel+" is missing")
		case got != want:
			changed = append(changed, rel+" changed")
		}
	}
	for rel := range files {
		if _, ok := m.Files[rel]; !ok {
			changed = append(changed, rel+" was added")
		}
	}
	if len(changed) > 0 {
		sort.Strings(changed)
		if len(changed) > 3 {
			changed = append(changed[:3], fmt.Sprintf("and %d more", len(changed)-3))
		}
		return nil, "its contents were modified (" + strings.Join(changed, ", ") + ")"
	}
	got := &Installed{Dir: entry}
	if m.Executable != "" {
		got.Executable = filepath.Join(entry, filepath.FromSlash(m.Executable))
		if !isExecutable(got.Executable) {
			return nil, "its executable " + m.Executable + " is not executable"
		}
	}
	return got, ""
}
