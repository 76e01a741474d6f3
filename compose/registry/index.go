// Package registry is the package registry client of Compose: the index
// format (docs/packages.md), registries as HTTP(S) endpoints or local
// directories, the host's target triple, and resolving a version selector
// (an exact version, a semver range or a tag) to one published version.
// Every error a user sees is a *compose.Error with a package code of spec
// §5.11.
package registry

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/internal/lazyre"
)

// Package kinds (spec §5.2 "Worker kinds").
const (
	KindBinary = "binary"
	KindBundle = "bundle"
	KindEngine = "engine"
	KindImage  = "image"
)

// MaxIndexSize bounds one index.json: an index lists versions and digests,
// a few hundred KiB at most for a long-lived package.
const MaxIndexSize = 4 << 20

// safeRE is what a name, version or target triple the registry returns may
// look like: it becomes a cache directory name, so letters, digits, `.`,
// `_` and `-` only, starting with a letter or digit (so never `.` or `..`).
var safeRE = lazyre.New(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

var sha256RE = lazyre.New(`^[0-9a-f]{64}$`)

// PathSafe reports whether s may name a cache directory component.
func PathSafe(s string) bool { return safeRE.MatchString(s) }

// ValidSHA256 reports whether s is a lower-case hex SHA-256 digest.
func ValidSHA256(s string) bool { return sha256RE.MatchString(s) }

// Index is one package's index.json.
type Index struct {
	Name        string              `json:"name"`
	Description string              `json:"description"`
	Kind        string              `json:"kind"`
	Tags        map[string]string   `json:"tags"`
	Versions    map[string]*Version `json:"versions"`
}

// Version is one published version of a package.
type Version struct {
	// Kind is the version's kind; "" in the file means the package's.
	Kind string `json:"kind"`
	// Artifacts are keyed by Rust target triple.
	Artifacts map[string]Artifact `json:"artifacts"`
	// Dependencies map a package name (in the same registry) to a
	// selector.
	Dependencies map[string]string `json:"dependencies,omitempty"`
	// DefaultConfig is any JSON value; JSON null (or absent) is no
	// default configuration.
	DefaultConfig json.RawMessage `json:"default_config"`
	PublishedAt   string          `json:"published_at"`
}

// Artifact is one downloadable archive of a version for one target.
type Artifact struct {
	// URL is absolute, or relative to the index.json it is listed in.
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
	// Size is the archive's size in bytes; 0 when the registry does not
	// say.
	Size int64 `json:"size"`
}

// DecodeIndex reads an index.json for the package name (the name asked
// for) from source (its URL or path, for messages). Unknown fields are
// ignored, so a registry may add fields without breaking older clients;
// what Compose uses is checked: names, versions and target triples must be
// path-safe (REGISTRY_NAME_REFUSED), kinds known, digests well formed
// (PACKAGE_NOT_RESOLVED names what is wrong with the index).
func DecodeIndex(data []byte, name, source string) (*Index, error) {
	if len(data) > MaxIndexSize {
		return nil, compose.New(compose.CodePackageNotResolved, fmt.Sprintf("the registry index %s is larger than %d MiB", source, MaxIndexSize>>20))
	}
	var idx Index
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&idx); err != nil {
		return nil, badIndex(source, "not valid JSON: %v", err)
	}
	if dec.More() {
		return nil, badIndex(source, "more than one JSON value")
	}
	if !PathSafe(idx.Name) {
		return nil, refused(source, "package name", idx.Name)
	}
	if idx.Name != name {
		return nil, badIndex(source, "it describes package %q, not %q", clip(idx.Name, 80), name)
	}
	switch idx.Kind {
	case KindBinary, KindBundle, KindEngine, KindImage:
	default:
		return nil, badIndex(source, "kind %q is not binary, bundle, engine or image", clip(idx.Kind, 40))
	}
	if len(idx.Versions) == 0 {
		return nil, badIndex(source, "it lists no versions")
	}
	for v, ver := range idx.Versions {
		if !PathSafe(v) {
			return nil, refused(source, "version", v)
		}
		if _, err := semver.StrictNewVersion(v); err != nil {
			return nil, badIndex(source, "version %q is not a semantic version (MAJOR.MINOR.PATCH)", v)
		}
		if ver == nil {
			return nil, badIndex(source, "version %s is null", v)
		}
		if ver.Kind == "" {
			ver.Kind = idx.Kind
		}
		switch ver.Kind {
		case KindBinary, KindBundle, KindEngine, KindImage:
		default:
			return nil, badIndex(source, "version %s: kind %q is not binary, bundle, engine or image", v, clip(ver.Kind, 40))
		}
		for target, a := range ver.Artifacts {
			if !PathSafe(target) {
				return nil, refused(source, "target triple of version "+v, target)
			}
			if strings.TrimSpace(a.URL) == "" {
				return nil, badIndex(source, "version %s: the %s artefact has no url", v, target)
			}
			if !ValidSHA256(a.SHA256) {
				return nil, badIndex(source, "version %s: the %s artefact's sha256 %q is not 64 lower-case hex digits", v, target, clip(a.SHA256, 80))
			}
			if a.Size < 0 {
				return nil, badIndex(source, "version %s: the %s artefact has a negative size", v, target)
			}
		}
		for dep, sel := range ver.Dependencies {
			if !PathSafe(dep) {
				return nil, refused(source, "dependency of version "+v, dep)
			}
			if err := CheckSelector(sel); err != nil {
				return nil, badIndex(source, "version %s: dependency %s: %v", v, dep, err)
			}
		}
		if len(bytes.TrimSpace(ver.DefaultConfig)) == 0 {
			ver.DefaultConfig = json.RawMessage("null")
		}
	}
	for tag, v := range idx.Tags {
		if !tagRE.MatchString(tag) {
			return nil, badIndex(source, "tag %q is not a tag name (a letter, then letters, digits, ., _ or -)", clip(tag, 40))
		}
		if _, ok := idx.Versions[v]; !ok {
			return nil, badIndex(source, "tag %s points at %q, which is not a listed version", tag, clip(v, 40))
		}
	}
	return &idx, nil
}

var tagRE = lazyre.New(`^[A-Za-z][A-Za-z0-9._-]{0,63}$`)

// IsTag reports whether a selector is written like a registry tag (latest,
// next) rather than a version or a range.
func IsTag(sel string) bool { return tagRE.MatchString(sel) && !looksLikeVersion(sel) }

// looksLikeVersion catches selectors such as v1.2.3 or x that also match
// the tag pattern but are versions or wildcards to semver.
func looksLikeVersion(sel string) bool {
	if sel == "x" || sel == "X" {
		return true
	}
	if len(sel) > 1 && (sel[0] == 'v' || sel[0] == 'V') && sel[1] >= '0' && sel[1] <= '9' {
		return true
	}
	return false
}

// CheckSelector checks that sel is a tag, an exact version or a range.
func CheckSelector(sel string) error {
	if sel == "" {
		return fmt.Errorf("the selector is empty")
	}
	if sel != strings.TrimSpace(sel) {
		return fmt.Errorf("selector %q has spaces around it", clip(sel, 40))
	}
	if IsTag(sel) {
		return nil
	}
	if _, err := semver.NewConstraint(sel); err != nil {
		return fmt.Errorf("%q is not a version, a range or a tag", clip(sel, 40))
	}
	return nil
}

// SortedVersions returns the index's versions, lowest first.
func (idx *Index) SortedVersions() []*semver.Version {
	out := make([]*semver.Version, 0, len(idx.Versions))
	for v := range idx.Versions {
		if sv, err := semver.StrictNewVersion(v); err == nil {
			out = append(out, sv)
		}
	}
	slices.SortFunc(out, func(a, b *semver.Version) int { return a.Compare(b) })
	return out
}

// TagLatest is the tag every package has: tagged by the registry, or else
// its highest release.
const TagLatest = "latest"

// Latest is the version the tag latest points at, else the highest
// version that is not a prerelease, else the highest version.
func (idx *Index) Latest() string {
	if v, ok := idx.Tags[TagLatest]; ok {
		return v
	}
	all := idx.SortedVersions()
	for i := len(all) - 1; i >= 0; i-- {
		if all[i].Prerelease() == "" {
			return all[i].Original()
		}
	}
	if len(all) == 0 {
		return ""
	}
	return all[len(all)-1].Original()
}

// Resolve picks the version a selector means: a tag the index lists, else
// the highest version the exact version or range admits (prereleases only
// when the selector names one, as semver ranges do). source names the
// registry in messages. PACKAGE_NOT_RESOLVED lists what is published.
func (idx *Index) Resolve(sel, source string) (string, *Version, error) {
	if v, ok := idx.Tags[sel]; ok {
		return v, idx.Versions[v], nil
	}
	if sel == TagLatest {
		// A registry that tags nothing still has a latest version.
		v := idx.Latest()
		return v, idx.Versions[v], nil
	}
	if IsTag(sel) {
		return "", nil, compose.New(compose.CodePackageNotResolved, fmt.Sprintf(
			"%s has no tag %q for package %s; its tags are %s and its versions %s",
			source, sel, idx.Name, idx.tagList(), idx.versionList()))
	}
	c, err := semver.NewConstraint(sel)
	if err != nil {
		return "", nil, compose.New(compose.CodePackageNotResolved, fmt.Sprintf(
			"%q is not a version, a range or a tag for package %s", clip(sel, 80), idx.Name))
	}
	all := idx.SortedVersions()
	for i := len(all) - 1; i >= 0; i-- {
		if c.Check(all[i]) {
			v := all[i].Original()
			return v, idx.Versions[v], nil
		}
	}
	return "", nil, compose.New(compose.CodePackageNotResolved, fmt.Sprintf(
		"no version of %s in %s matches %q; published: %s (tags: %s)",
		idx.Name, source, sel, idx.versionList(), idx.tagList()))
}

func (idx *Index) versionList() string {
	vs := idx.SortedVersions()
	if len(vs) == 0 {
		return "none"
	}
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.Original()
	}
	return strings.Join(out, ", ")
}

func (idx *Index) tagList() string {
	if len(idx.Tags) == 0 {
		return "none"
	}
	var out []string
	for t, v := range idx.Tags {
		out = append(out, t+" → "+v)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// Targets lists the target triples a version ships, sorted.
func (v *Version) Targets() []string {
	out := make([]string, 0, len(v.Artifacts))
	for t := range v.Artifacts {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

func badIndex(source, format string, args ...any) error {
	return compose.New(compose.CodePackageNotResolved, fmt.Sprintf("the registry index %s is not usable: %s", source, fmt.Sprintf(format, args...)))
}

func refused(source, what, value string) error {
	return compose.New(compose.CodeRegistryNameRefused, fmt.Sprintf(
		"the registry index %s returned the %s %q, which is not path-safe (only letters, digits, ., _ and -, starting with a letter or digit); Compose refuses it",
		source, what, clip(value, 80)))
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
