package registry

import (
	"archive/tar"
	"bytes"
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
	"slices"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/klauspost/compress/gzip"

	"github.com/iii-sandbox/iii/internal/atomicfile"
)

// Publication is one version of one package for one target, to be written
// into a directory registry.
type Publication struct {
	Name        string
	Description string
	Kind        string // binary or bundle
	Version     string
	Target      string // Rust target triple
	// Files go into the artefact, side by side, under their base names
	// (or ArchiveName when set).
	Files         []PublishFile
	DefaultConfig json.RawMessage // nil or JSON null: none
	Dependencies  map[string]string
	// Tags are pointed at this version (e.g. latest).
	Tags []string
	// Now stamps published_at for a version published for the first
	// time; a republished version keeps its stamp.
	Now time.Time
}

// PublishFile is a file of an artefact.
type PublishFile struct {
	Path        string // on disk
	ArchiveName string // in the archive; "" = the base name of Path
}

// PublishResult says what Publish wrote.
type PublishResult struct {
	IndexPath    string
	ArtifactPath string
	SHA256       string
	Size         int64
	// Changed is false when the registry already held exactly this.
	Changed bool
}

// archiveEpoch is the modification time of every archive entry, so the
// same files always make the same bytes.
var archiveEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Publish writes a version into the directory registry dir:
// packages/<name>/<version>/<name>-<version>-<target>.tar.gz (a
// deterministic gzip'd tar of the files) and its entry in
// packages/<name>/index.json (the URL relative to the index). Publishing
// the same files again changes nothing; other versions and targets stay.
func Publish(dir string, p Publication) (*PublishResult, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	pkgDir := filepath.Join(dir, "packages", p.Name)
	file := p.Name + "-" + p.Version + "-" + p.Target + ".tar.gz"
	rel := p.Version + "/" + file
	art := filepath.Join(pkgDir, p.Version, file)
	data, err := Archive(p.Files)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	res := &PublishResult{IndexPath: filepath.Join(pkgDir, "index.json"), ArtifactPath: art, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))}

	idx := &Index{Name: p.Name, Tags: map[string]string{}, Versions: map[string]*Version{}}
	old, err := os.ReadFile(res.IndexPath)
	switch {
	case err == nil:
		if idx, err = DecodeIndex(old, p.Name, res.IndexPath); err != nil {
			return nil, fmt.Errorf("the existing index cannot be updated: %w", err)
		}
		if idx.Tags == nil {
			idx.Tags = map[string]string{}
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	idx.Kind = p.Kind
	if p.Description != "" {
		idx.Description = p.Description
	}
	cfg, err := canonicalJSON(p.DefaultConfig)
	if err != nil {
		return nil, fmt.Errorf("default config: %w", err)
	}
	v := idx.Versions[p.Version]
	if v == nil {
		v = &Version{Artifacts: map[string]Artifact{}, PublishedAt: p.Now.UTC().Format(time.RFC3339)}
		idx.Versions[p.Version] = v
	}
	if v.Artifacts == nil {
		v.Artifacts = map[string]Artifact{}
	}
	v.Kind = p.Kind
	v.DefaultConfig = cfg
	v.Dependencies = p.Dependencies
	if len(v.Dependencies) == 0 {
		v.Dependencies = nil
	}
	v.Artifacts[p.Target] = Artifact{URL: rel, SHA256: res.SHA256, Size: res.Size}
	for _, t := range p.Tags {
		idx.Tags[t] = p.Version
	}
	out, err := encodeIndex(idx)
	if err != nil {
		return nil, err
	}
	if cur, err := os.ReadFile(art); err != nil || !bytes.Equal(cur, data) {
		if err := writeAtomic(art, data); err != nil {
			return nil, err
		}
		res.Changed = true
	}
	if !bytes.Equal(old, out) {
		if err := writeAtomic(res.IndexPath, out); err != nil {
			return nil, err
		}
		res.Changed = true
	}
	return res, nil
}

func (p *Publication) check() error {
	for what, v := range map[string]string{"name": p.Name, "version": p.Version, "target": p.Target} {
		if !PathSafe(v) {
			return fmt.Errorf("%s %q is not path-safe (letters, digits, ., _ and -)", what, v)
		}
	}
	if _, err := semver.StrictNewVersion(p.Version); err != nil {
		return fmt.Errorf("version %q is not MAJOR.MINOR.PATCH", p.Version)
	}
	if p.Kind != KindBinary && p.Kind != KindBundle {
		return fmt.Errorf("kind %q: only binary and bundle packages have artefacts", p.Kind)
	}
	if len(p.Files) == 0 {
		return errors.New("an artefact needs at least one file")
	}
	for _, t := range p.Tags {
		if !tagRE.MatchString(t) || looksLikeVersion(t) {
			return fmt.Errorf("tag %q is not a tag name", t)
		}
	}
	for dep, sel := range p.Dependencies {
		if !PathSafe(dep) {
			return fmt.Errorf("dependency %q is not a package name", dep)
		}
		if err := CheckSelector(sel); err != nil {
			return fmt.Errorf("dependency %s: %w", dep, err)
		}
	}
	return nil
}

// Archive is the deterministic .tar.gz of files, side by side: entries in
// name order, owned by 0:0, mode 0755 for executables and 0644 otherwise,
// one fixed modification time, no gzip name or time.
func Archive(files []PublishFile) ([]byte, error) {
	type item struct {
		name string
		path string
	}
	var items []item
	seen := map[string]bool{}
	for _, f := range files {
		name := f.ArchiveName
		if name == "" {
			name = filepath.Base(f.Path)
		}
		name = path.Clean(filepath.ToSlash(name))
		if name == "." || strings.HasPrefix(name, "../") || strings.HasPrefix(name, "/") || name == ".." {
			return nil, fmt.Errorf("archive name %q must be a relative path inside the archive", name)
		}
		if seen[name] {
			return nil, fmt.Errorf("two files are named %s in the archive", name)
		}
		seen[name] = true
		items = append(items, item{name, f.Path})
	}
	slices.SortFunc(items, func(a, b item) int { return strings.Compare(a.name, b.name) })
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	dirs := map[string]bool{}
	for _, it := range items {
		// Parent directories get their own entries, once, before their
		// first file.
		for d := path.Dir(it.name); d != "."; d = path.Dir(d) {
			if dirs[d] {
				break
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: archiveEpoch, Format: tar.FormatUSTAR}); err != nil {
				return nil, err
			}
		}
		st, err := os.Stat(it.path)
		if err != nil {
			return nil, err
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("%s is not a regular file", it.path)
		}
		mode := int64(0o644)
		if st.Mode().Perm()&0o111 != 0 {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: it.name, Size: st.Size(), Mode: mode, ModTime: archiveEpoch, Format: tar.FormatUSTAR}); err != nil {
			return nil, err
		}
		f, err := os.Open(it.path)
		if err != nil {
			return nil, err
		}
		n, err := io.Copy(tw, f)
		f.Close()
		if err != nil {
			return nil, err
		}
		if n != st.Size() {
			return nil, fmt.Errorf("%s changed while it was archived", it.path)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// canonicalJSON re-encodes a JSON value with sorted keys (null when
// empty).
func canonicalJSON(raw json.RawMessage) (json.RawMessage, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return json.RawMessage("null"), nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value")
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func encodeIndex(idx *Index) ([]byte, error) {
	out, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// writeAtomic writes a published file (mode 0644) so that readers see the
// old content or the new, never a part, creating its directory.
func writeAtomic(p string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(p, data, 0o644)
}
