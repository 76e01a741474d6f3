package selfupdate

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"

	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/internal/atomicfile"
)

// Publication is one release for one target, to be written into a
// release directory.
type Publication struct {
	Version string
	// Target is the Rust target triple the binaries are built for.
	Target string
	// Binaries each become one asset, <product>-<target>.tar.gz, holding
	// the file under its product name; the product is the file's base
	// name (iii, iii-cloud) unless Product says otherwise.
	Binaries []PublishBinary
	// Latest points the index's latest at this version.
	Latest bool
	// Now stamps published_at of a version published for the first time;
	// a republished version keeps its stamp.
	Now time.Time
}

// PublishBinary is one binary of a release.
type PublishBinary struct {
	Path    string // on disk
	Product string // "" = the base name of Path
}

// Published is one asset Publish wrote.
type Published struct {
	Product string
	Asset   string // its name in the index
	Path    string // the archive on disk
	SHA256  string
	Size    int64
	// Changed is false when the directory already held these bytes.
	Changed bool
}

// Publish writes a release into dir: <dir>/<version>/<product>-<target>.tar.gz
// for each binary (the deterministic archive of registry.Archive, so the
// same binary always gives the same digest) and its entry in
// <dir>/index.json, with a url relative to the index. Other versions,
// targets and products stay as they were.
func Publish(dir string, p Publication) ([]Published, error) {
	if _, err := semver.StrictNewVersion(p.Version); err != nil || !registry.PathSafe(p.Version) {
		return nil, fmt.Errorf("version %q is not MAJOR.MINOR.PATCH", p.Version)
	}
	if !registry.PathSafe(p.Target) {
		return nil, fmt.Errorf("target %q is not a target triple (letters, digits, ., _ and -)", p.Target)
	}
	if len(p.Binaries) == 0 {
		return nil, errors.New("a release needs at least one binary")
	}
	indexPath := filepath.Join(dir, IndexFile)
	idx := &Index{Releases: map[string]*Release{}}
	old, err := os.ReadFile(indexPath)
	switch {
	case err == nil:
		if idx, err = DecodeIndex(old, indexPath); err != nil {
			return nil, fmt.Errorf("the existing index cannot be updated: %w", err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	rel := idx.Releases[p.Version]
	if rel == nil {
		rel = &Release{PublishedAt: p.Now.UTC().Format(time.RFC3339)}
		idx.Releases[p.Version] = rel
	}
	if rel.Assets == nil {
		rel.Assets = map[string]Asset{}
	}
	var out []Published
	seen := map[string]bool{}
	for _, b := range p.Binaries {
		product := b.Product
		if product == "" {
			product = strings.TrimSuffix(filepath.Base(b.Path), ".exe")
		}
		if !registry.PathSafe(product) {
			return nil, fmt.Errorf("product %q is not a name (letters, digits, ., _ and -)", product)
		}
		if seen[product] {
			return nil, fmt.Errorf("two binaries are published as %s", product)
		}
		seen[product] = true
		name := AssetName(product, p.Target)
		if !assetRE.MatchString(name) {
			return nil, fmt.Errorf("asset name %q is too long", name)
		}
		inArchive := product
		if strings.HasSuffix(b.Path, ".exe") {
			inArchive += ".exe"
		}
		data, err := registry.Archive([]registry.PublishFile{{Path: b.Path, ArchiveName: inArchive}})
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(data)
		pub := Published{Product: product, Asset: name, Path: filepath.Join(dir, p.Version, name), SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))}
		if cur, err := os.ReadFile(pub.Path); err != nil || !bytes.Equal(cur, data) {
			if err := writeAtomic(pub.Path, data); err != nil {
				return nil, err
			}
			pub.Changed = true
		}
		rel.Assets[name] = Asset{URL: p.Version + "/" + name, SHA256: pub.SHA256, Size: pub.Size}
		out = append(out, pub)
	}
	if p.Latest {
		idx.Latest = p.Version
	}
	enc, err := encodeIndex(idx)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(old, enc) {
		if err := writeAtomic(indexPath, enc); err != nil {
			return nil, err
		}
		for i := range out {
			out[i].Changed = true
		}
	}
	return out, nil
}

// writeAtomic writes a published file (mode 0644) so that readers see the
// old content or the new, never a part, creating its directory.
func writeAtomic(p string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(p, data, 0o644)
}
