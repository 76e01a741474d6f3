package selfupdate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"

	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/internal/lazyre"
)

// Index is a release source's index.json (docs/update.md).
type Index struct {
	// Latest is the version `iii update` installs without --version; when
	// empty, the highest version that is not a prerelease.
	Latest   string              `json:"latest,omitempty"`
	Releases map[string]*Release `json:"releases"`
}

// Release is one version and its archives.
type Release struct {
	// Assets are keyed by file name, <product>-<target>.tar.gz.
	Assets      map[string]Asset `json:"assets"`
	PublishedAt string           `json:"published_at,omitempty"`
}

// Asset is one downloadable archive.
type Asset struct {
	// URL is absolute, or relative to index.json.
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
	// Size in bytes; 0 when the source does not say.
	Size int64 `json:"size"`
}

// ArchiveSuffix ends every asset name.
const ArchiveSuffix = ".tar.gz"

// AssetName is the archive of product for target, as releases name it
// (iii-x86_64-unknown-linux-gnu.tar.gz).
func AssetName(product, target string) string { return product + "-" + target + ArchiveSuffix }

// assetRE is what an asset name may look like: it becomes part of a
// temporary file name and is printed, so no separators or controls.
var assetRE = lazyre.New(`^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.tar\.gz$`)

// DecodeIndex reads index.json from source (its URL or path, for
// messages). Unknown fields are ignored so a source can add some; what the
// updater uses is checked (RELEASE_INDEX_INVALID says what is wrong).
func DecodeIndex(data []byte, source string) (*Index, error) {
	bad := func(format string, args ...any) error {
		return newError(CodeIndexInvalid, fmt.Sprintf("the release index %s is not usable: %s", source, fmt.Sprintf(format, args...)))
	}
	if len(data) > MaxIndexBytes {
		return nil, bad("it is larger than %d MiB", MaxIndexBytes>>20)
	}
	var idx Index
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&idx); err != nil {
		return nil, bad("not valid JSON: %v", err)
	}
	if len(bytes.TrimSpace(data[dec.InputOffset():])) > 0 {
		return nil, bad("something follows the JSON value")
	}
	if len(idx.Releases) == 0 {
		return nil, bad("it lists no releases")
	}
	for v, rel := range idx.Releases {
		if _, err := semver.StrictNewVersion(v); err != nil || !registry.PathSafe(v) {
			return nil, bad("release %q is not a version (MAJOR.MINOR.PATCH, without a leading v)", clip(v, 40))
		}
		if rel == nil {
			return nil, bad("release %s is null", v)
		}
		for name, a := range rel.Assets {
			if !assetRE.MatchString(name) {
				return nil, bad("release %s: asset name %q is not <product>-<target>%s", v, clip(name, 80), ArchiveSuffix)
			}
			if strings.TrimSpace(a.URL) == "" {
				return nil, bad("release %s: asset %s has no url", v, name)
			}
			if !registry.ValidSHA256(a.SHA256) {
				return nil, bad("release %s: asset %s has sha256 %q, not 64 lower-case hex digits", v, name, clip(a.SHA256, 80))
			}
			if a.Size < 0 {
				return nil, bad("release %s: asset %s has a negative size", v, name)
			}
			if a.Size > MaxArchiveBytes {
				return nil, bad("release %s: asset %s is %d bytes, more than the %d MiB iii update downloads", v, name, a.Size, MaxArchiveBytes>>20)
			}
		}
	}
	if idx.Latest != "" {
		if _, ok := idx.Releases[idx.Latest]; !ok {
			return nil, bad("latest is %q, which is not a listed release", clip(idx.Latest, 40))
		}
	}
	return &idx, nil
}

// Versions lists the releases, highest first.
func (idx *Index) Versions() []string {
	vs := make([]*semver.Version, 0, len(idx.Releases))
	for v := range idx.Releases {
		if sv, err := semver.StrictNewVersion(v); err == nil {
			vs = append(vs, sv)
		}
	}
	slices.SortFunc(vs, func(a, b *semver.Version) int { return b.Compare(a) })
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.Original()
	}
	return out
}

// LatestVersion is latest when the index says it, else the highest
// version that is not a prerelease, else the highest version.
func (idx *Index) LatestVersion() string {
	if idx.Latest != "" {
		return idx.Latest
	}
	all := idx.Versions()
	for _, v := range all {
		if sv, err := semver.StrictNewVersion(v); err == nil && sv.Prerelease() == "" {
			return v
		}
	}
	if len(all) == 0 {
		return ""
	}
	return all[0]
}

// AssetNames lists a release's assets, sorted.
func (r *Release) AssetNames() []string {
	out := make([]string, 0, len(r.Assets))
	for n := range r.Assets {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// NormalizeVersion accepts what people type for --version: 0.26.1 or
// v0.26.1.
func NormalizeVersion(v string) string {
	v = strings.TrimSpace(v)
	if len(v) > 1 && (v[0] == 'v' || v[0] == 'V') && v[1] >= '0' && v[1] <= '9' {
		return v[1:]
	}
	return v
}

// encodeIndex writes the index the way Publish stores it: indented, keys
// sorted (encoding/json sorts map keys), so the same content gives the
// same bytes.
func encodeIndex(idx *Index) ([]byte, error) {
	out, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
