package catalog

import (
	"errors"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string // substring; "" means valid
	}{
		{name: "empty config is valid (and denies everything)", cfg: Config{}},
		{name: "registry sample", cfg: Config{ImageAllowlist: []string{"python", "node"}}},
		{name: "custom image allowlisted", cfg: Config{
			ImageAllowlist: []string{"python", "ruby"},
			CustomImages:   map[string]string{"ruby": "docker.io/library/ruby:3.3-slim"},
		}},
		{name: "custom image by digest", cfg: Config{CustomImages: map[string]string{
			"pinned": "127.0.0.1:5000/x/y@sha256:" + sixtyFour("a"),
		}}},
		{name: "preset name as custom", cfg: Config{CustomImages: map[string]string{"python": "x/y:1"}},
			wantErr: `custom_images.python: "python" is a reserved image name`},
		{name: "bash is reserved", cfg: Config{CustomImages: map[string]string{"bash": "x/bash:1"}},
			wantErr: `custom_images.bash: "bash" is a reserved`},
		{name: "alpine is reserved", cfg: Config{CustomImages: map[string]string{"alpine": "alpine:3"}},
			wantErr: `custom_images.alpine: "alpine" is a reserved`},
		{name: "bad custom ref", cfg: Config{CustomImages: map[string]string{"x": "UPPER/Case:tag"}},
			wantErr: "custom_images.x: invalid OCI reference"},
		{name: "empty custom ref", cfg: Config{CustomImages: map[string]string{"x": ""}},
			wantErr: "custom_images.x: OCI reference"},
		{name: "bad custom name", cfg: Config{CustomImages: map[string]string{"a b": "x/y:1"}},
			wantErr: "custom_images.a b: image names must"},
		{name: "unknown allowlist entry", cfg: Config{ImageAllowlist: []string{"python", "pyhton"}},
			wantErr: `image_allowlist[1]: "pyhton" is neither a preset`},
		{name: "OCI ref in allowlist", cfg: Config{ImageAllowlist: []string{"docker.io/iiidev/python:latest"}},
			wantErr: "image_allowlist[0]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.cfg)
			if tc.wantErr == "" {
				assert.NilError(t, err)
				_, err = New(tc.cfg)
				assert.NilError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
			assert.ErrorContains(t, err, CodeInvalidConfig)
			var ce *ConfigError
			assert.Assert(t, errors.As(err, &ce))
			_, err = New(tc.cfg)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	err := Validate(Config{
		ImageAllowlist: []string{"nope"},
		CustomImages:   map[string]string{"node": "x/y:1", "ok": "::bad::"},
	})
	assert.ErrorContains(t, err, "custom_images.node")
	assert.ErrorContains(t, err, "custom_images.ok")
	assert.ErrorContains(t, err, "image_allowlist[0]")
}

func TestResolve(t *testing.T) {
	cat, err := New(Config{
		ImageAllowlist: []string{"python", "zed"},
		CustomImages: map[string]string{
			"zed":   "127.0.0.1:5000/tools/zed:2",
			"alpha": "127.0.0.1:5000/tools/alpha:1",
		},
	})
	assert.NilError(t, err)
	tests := []struct {
		image    string
		wantRef  string
		wantKind Kind
		wantErr  string
		known    bool
	}{
		{image: "python", wantRef: "docker.io/iiidev/python:latest", wantKind: KindPreset},
		{image: "zed", wantRef: "127.0.0.1:5000/tools/zed:2", wantKind: KindCustom},
		{image: "node", known: true, wantErr: `image "node" is not on image_allowlist; allowed images: python, zed`},
		{image: "alpha", known: true, wantErr: `image "alpha" is not on image_allowlist; allowed images: python, zed`},
		{image: "ruby", wantErr: `image "ruby" is not in the catalog`},
		{image: "docker.io/iiidev/python:latest", wantErr: "not an OCI reference"},
		{image: "", wantErr: `image "" is not in the catalog`},
		{image: "bash", wantErr: `image "bash" is not in the catalog`},
	}
	for _, tc := range tests {
		t.Run(tc.image, func(t *testing.T) {
			ref, kind, err := cat.Resolve(tc.image)
			if tc.wantErr == "" {
				assert.NilError(t, err)
				assert.Equal(t, ref, tc.wantRef)
				assert.Equal(t, kind, tc.wantKind)
				return
			}
			assert.ErrorContains(t, err, tc.wantErr)
			var na *NotAllowedError
			assert.Assert(t, errors.As(err, &na))
			assert.Equal(t, na.Code(), "S100")
			assert.Equal(t, na.Known, tc.known)
			assert.DeepEqual(t, na.Allowed, []string{"python", "zed"})
		})
	}
}

func TestEmptyAllowlistDeniesAll(t *testing.T) {
	cat, err := New(Config{CustomImages: map[string]string{"x": "x/y:1"}})
	assert.NilError(t, err)
	for _, n := range []string{"python", "node", "x"} {
		_, _, err := cat.Resolve(n)
		assert.ErrorContains(t, err, "allowed images: none (image_allowlist is empty)")
	}
}

func TestList(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []Entry
	}{
		{name: "presets only, fixed order", cfg: Config{}, want: []Entry{
			{Name: "python", OCIRef: "docker.io/iiidev/python:latest", Kind: KindPreset},
			{Name: "node", OCIRef: "docker.io/iiidev/node:latest", Kind: KindPreset},
		}},
		{name: "custom sorted after presets", cfg: Config{CustomImages: map[string]string{
			"zz": "r/zz:1", "aa": "r/aa:1", "Mm": "r/mm:1",
		}}, want: []Entry{
			{Name: "python", OCIRef: "docker.io/iiidev/python:latest", Kind: KindPreset},
			{Name: "node", OCIRef: "docker.io/iiidev/node:latest", Kind: KindPreset},
			{Name: "Mm", OCIRef: "r/mm:1", Kind: KindCustom},
			{Name: "aa", OCIRef: "r/aa:1", Kind: KindCustom},
			{Name: "zz", OCIRef: "r/zz:1", Kind: KindCustom},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cat, err := New(tc.cfg)
			assert.NilError(t, err)
			got := cat.List()
			assert.DeepEqual(t, got, tc.want)
			// The returned slice is a copy: changing it does not change the catalog.
			got[0].Name = "changed"
			assert.Check(t, is.Equal(cat.List()[0].Name, "python"))
		})
	}
}

func sixtyFour(c string) string {
	s := ""
	for range 64 {
		s += c
	}
	return s
}

// FuzzCatalog feeds arbitrary names and references through Validate, New and
// Resolve: none may panic, and a name that resolves must be allowlisted.
func FuzzCatalog(f *testing.F) {
	f.Add("ruby", "docker.io/library/ruby:3", "ruby")
	f.Add("python", "x/y:1", "python")
	f.Add("a", "127.0.0.1:5000/a@sha256:"+sixtyFour("0"), "a")
	f.Add("", "", "")
	f.Fuzz(func(t *testing.T, custom, ref, allow string) {
		cfg := Config{ImageAllowlist: []string{allow}, CustomImages: map[string]string{custom: ref}}
		cat, err := New(cfg)
		if err != nil {
			return
		}
		got, _, err := cat.Resolve(allow)
		if err != nil {
			t.Fatalf("allowlisted %q did not resolve: %v", allow, err)
		}
		if got == "" {
			t.Fatalf("empty reference for %q", allow)
		}
	})
}
