// Package catalog maps the image names callers use in sandbox::create and
// sandbox::run (python, node, or an operator's custom_images key) to OCI
// references, and enforces the fail-closed image_allowlist.
package catalog

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// Kind tells a preset apart from an operator-defined image; it is the `kind`
// field of sandbox::catalog::list.
type Kind string

const (
	KindPreset Kind = "preset"
	KindCustom Kind = "custom"
)

// Stable codes carried by the errors of this package.
const (
	// CodeImageNotAllowed is the sandbox S-code for an image that is not in
	// the catalog or not on the allowlist.
	CodeImageNotAllowed = "S100"
	// CodeInvalidConfig is the code of every configuration error; the
	// adapter refuses to start with it (fail-closed).
	CodeInvalidConfig = "INVALID_IMAGE_CONFIG"
)

// Entry is one row of sandbox::catalog::list.
type Entry struct {
	Name   string `json:"name"`
	OCIRef string `json:"oci_ref"`
	Kind   Kind   `json:"kind"`
}

// Presets are the images every adapter offers, in the fixed order
// sandbox::catalog::list reports them. A function, not a variable, so no
// caller can change the table for everyone.
func Presets() []Entry {
	return []Entry{
		{Name: "python", OCIRef: "docker.io/iiidev/python:latest", Kind: KindPreset},
		{Name: "node", OCIRef: "docker.io/iiidev/node:latest", Kind: KindPreset},
	}
}

// reservedNames may never be custom image names: the presets, plus two names
// upstream keeps for future presets, so a config written today keeps meaning
// the same thing when they arrive.
func reservedNames() []string { return []string{"python", "node", "bash", "alpine"} }

// Config is the image part of the adapter configuration (spec §7.3).
type Config struct {
	// ImageAllowlist lists the names callers may use. Empty denies all.
	ImageAllowlist []string `json:"image_allowlist" yaml:"image_allowlist"`
	// CustomImages maps an extra catalog name to an OCI reference.
	CustomImages map[string]string `json:"custom_images" yaml:"custom_images"`
}

// ConfigError is a configuration mistake found by Validate. Field names the
// offending key so the operator can find it.
type ConfigError struct {
	Field   string
	Message string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%s: %s: %s", CodeInvalidConfig, e.Field, e.Message)
}

// Code returns the stable error code.
func (e *ConfigError) Code() string { return CodeInvalidConfig }

// NotAllowedError is returned by Resolve for a name that is unknown or not
// allowlisted. The adapter turns it into S100; Allowed is what the message
// offers instead.
type NotAllowedError struct {
	Name string
	// Known is true when the name is in the catalog but not on the allowlist.
	Known   bool
	Allowed []string
}

func (e *NotAllowedError) Error() string {
	allowed := "none (image_allowlist is empty)"
	if len(e.Allowed) > 0 {
		allowed = strings.Join(e.Allowed, ", ")
	}
	if e.Known {
		return fmt.Sprintf("image %q is not on image_allowlist; allowed images: %s", e.Name, allowed)
	}
	return fmt.Sprintf("image %q is not in the catalog (use a preset name or a custom_images key, not an OCI reference); allowed images: %s", e.Name, allowed)
}

// Code returns the sandbox S-code.
func (e *NotAllowedError) Code() string { return CodeImageNotAllowed }

// imageName keeps catalog names to plain identifiers: they appear in
// messages, logs and YAML keys, so whitespace and separators would only hurt.
var imageName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// Validate checks a configuration the way the adapter loads it: any problem
// is an error, there is no fallback.
func Validate(c Config) error {
	var errs []error
	names := make([]string, 0, len(c.CustomImages))
	for n := range c.CustomImages {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ref := c.CustomImages[n]
		field := "custom_images." + n
		switch {
		case slices.Contains(reservedNames(), n):
			errs = append(errs, &ConfigError{Field: field, Message: fmt.Sprintf("%q is a reserved image name (reserved: %s); choose another name", n, strings.Join(reservedNames(), ", "))})
			continue
		case !imageName.MatchString(n):
			errs = append(errs, &ConfigError{Field: field, Message: "image names must start with a letter or digit and contain only letters, digits, '.', '_' or '-' (at most 64)"})
			continue
		}
		if _, err := ParseRef(ref); err != nil {
			errs = append(errs, &ConfigError{Field: field, Message: err.Error()})
		}
	}
	for i, n := range c.ImageAllowlist {
		if !isPreset(n) && !hasKey(c.CustomImages, n) {
			errs = append(errs, &ConfigError{Field: fmt.Sprintf("image_allowlist[%d]", i), Message: fmt.Sprintf("%q is neither a preset (%s) nor a custom_images key", n, strings.Join(presetNames(), ", "))})
		}
	}
	return errors.Join(errs...)
}

// ParseRef checks that ref is a usable OCI reference (registry/repo:tag or
// @digest) and returns it parsed.
func ParseRef(ref string) (name.Reference, error) {
	if strings.TrimSpace(ref) != ref || ref == "" {
		return nil, fmt.Errorf("OCI reference %q is empty or has surrounding spaces", ref)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("invalid OCI reference %q: %v", ref, err)
	}
	return r, nil
}

// Catalog answers image questions for one validated configuration. It is
// immutable and safe for concurrent use.
type Catalog struct {
	entries []Entry
	allowed map[string]bool
}

// New validates c and builds its catalog.
func New(c Config) (*Catalog, error) {
	if err := Validate(c); err != nil {
		return nil, err
	}
	cat := &Catalog{entries: Presets(), allowed: make(map[string]bool, len(c.ImageAllowlist))}
	custom := make([]Entry, 0, len(c.CustomImages))
	for n, ref := range c.CustomImages {
		custom = append(custom, Entry{Name: n, OCIRef: ref, Kind: KindCustom})
	}
	sort.Slice(custom, func(i, j int) bool { return custom[i].Name < custom[j].Name })
	cat.entries = append(cat.entries, custom...)
	for _, n := range c.ImageAllowlist {
		cat.allowed[n] = true
	}
	return cat, nil
}

// List returns every catalog entry, presets first in their fixed order, then
// custom images sorted by name. Allowlisting does not hide entries: the
// listing tells callers what exists, Resolve tells them what they may use.
func (c *Catalog) List() []Entry { return slices.Clone(c.entries) }

// Allowed returns the allowlisted names in catalog order.
func (c *Catalog) Allowed() []string {
	var out []string
	for _, e := range c.entries {
		if c.allowed[e.Name] {
			out = append(out, e.Name)
		}
	}
	return out
}

// Resolve maps a catalog name to its OCI reference and kind. It fails with a
// *NotAllowedError when the name is unknown or not allowlisted.
func (c *Catalog) Resolve(imageName string) (string, Kind, error) {
	for _, e := range c.entries {
		if e.Name != imageName {
			continue
		}
		if !c.allowed[e.Name] {
			return "", "", &NotAllowedError{Name: imageName, Known: true, Allowed: c.Allowed()}
		}
		return e.OCIRef, e.Kind, nil
	}
	return "", "", &NotAllowedError{Name: imageName, Allowed: c.Allowed()}
}

func isPreset(n string) bool { return slices.Contains(presetNames(), n) }

func presetNames() []string {
	var out []string
	for _, p := range Presets() {
		out = append(out, p.Name)
	}
	return out
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}
