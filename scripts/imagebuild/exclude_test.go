package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func TestParseControl(t *testing.T) {
	data := []byte(`Package: python3-scipy
Source: scipy
Version: 1.10.1-2
Architecture: amd64
Depends: python3-decorator, python3-numpy (>= 1:1.22.0),
 python3-pythran
Multi-Arch: foreign
Description: scientific tools for Python 3
 SciPy supplements the popular NumPy module.
 .
 More text.

Package: libblas3
Version: 3.11.0-2
Architecture: amd64
Multi-Arch: same
Provides: libblas.so.3, libblas3-x (= 1:2.0)
`)
	got, err := parseControl(data)
	assert.NilError(t, err)
	assert.DeepEqual(t, got, []control{
		{Package: "python3-scipy", Version: "1.10.1-2", Arch: "amd64", MultiArch: "foreign"},
		{Package: "libblas3", Version: "3.11.0-2", Arch: "amd64", MultiArch: "same", Provides: "libblas.so.3, libblas3-x (= 1:2.0)"},
	})
	assert.Equal(t, statusEntry(got[1]), "Package: libblas3\nStatus: install ok installed\nVersion: 3.11.0-2\nArchitecture: amd64\n"+
		"Multi-Arch: same\nProvides: libblas.so.3, libblas3-x (= 1:2.0)\n\n")
	assert.Equal(t, statusEntry(got[0]), "Package: python3-scipy\nStatus: install ok installed\nVersion: 1.10.1-2\nArchitecture: amd64\nMulti-Arch: foreign\n\n")

	for _, tc := range []struct{ name, data, err string }{
		{"no package", "Version: 1\nArchitecture: all\n", "bad or missing Package"},
		{"bad name", "Package: A/b\nVersion: 1\nArchitecture: all\n", "bad or missing Package"},
		{"no version", "Package: a\nArchitecture: all\n", "bad or missing Version"},
		{"newline in status", "Package: a\nVersion: 1\nArchitecture: all\nProvides: b\n Status: x\n", "bad Provides"},
		{"bad multi-arch", "Package: a\nVersion: 1\nArchitecture: all\nMulti-Arch: any\n", "bad Multi-Arch"},
		{"leading continuation", " x\n", "continuation line with no field"},
		{"not a field", "Package a\n", "not a field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseControl([]byte(tc.data))
			assert.ErrorContains(t, err, tc.err)
		})
	}
}

func FuzzParseControl(f *testing.F) {
	f.Add([]byte("Package: a\nVersion: 1:2.0-1\nArchitecture: amd64\nProvides: b (= 1), c\n\nPackage: d\nVersion: 1\nArchitecture: all\n"))
	f.Add([]byte("Package: a\n x\n\n\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cs, err := parseControl(data)
		if err != nil {
			return
		}
		for _, c := range cs {
			// A status entry is one stanza: one blank line, at its end.
			e := statusEntry(c)
			if strings.Count(e, "\n\n") != 1 || !strings.HasSuffix(e, "\n\n") || strings.ContainsRune(e, '\r') {
				t.Fatalf("status entry %q of %+v is not one stanza", e, c)
			}
			again, err := parseControl([]byte(e))
			if err != nil || len(again) != 1 || again[0] != c {
				t.Fatalf("status entry %q reads back as %+v, %v", e, again, err)
			}
		}
	})
}

// TestResolveExclude resolves real closures from this host's apt lists:
// excluding python3-scipy from matplotlib's closure drops the compilers
// scipy's python3-pythran pulled in, and keeps what matplotlib itself
// needs.
func TestResolveExclude(t *testing.T) {
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skip("no apt-get: not a Debian host")
	}
	if m, _ := filepath.Glob("/var/lib/apt/lists/*_Packages*"); len(m) == 0 {
		t.Skip("no apt package lists (run apt-get update)")
	}
	a, err := newApt(t.TempDir())
	assert.NilError(t, err)
	ctx := context.Background()
	roots := []string{"python3-matplotlib"}
	full, dropped, err := a.resolve(ctx, roots, nil)
	if err != nil {
		t.Skipf("python3-matplotlib does not resolve from this host's lists: %v", err)
	}
	assert.Equal(t, len(dropped), 0)
	has := func(ps []pkg, name string) bool {
		return slices.ContainsFunc(ps, func(p pkg) bool { return p.Name == name })
	}
	for _, n := range []string{"python3-scipy", "python3-pythran", "g++", "python3-fonttools"} {
		assert.Assert(t, has(full, n), "the full closure lacks %s", n)
	}

	slim, dropped, err := a.resolve(ctx, roots, []string{"python3-scipy"})
	assert.NilError(t, err)
	for _, n := range []string{"python3-scipy", "python3-pythran", "g++", "gcc", "libboost-dev"} {
		assert.Assert(t, !has(slim, n), "the slim closure still has %s", n)
		assert.Assert(t, has(dropped, n), "%s is not listed as dropped", n)
	}
	for _, n := range []string{"python3-matplotlib", "python3-numpy", "python3-fonttools", "libc6"} {
		assert.Assert(t, has(slim, n), "the slim closure lacks %s", n)
	}
	assert.Assert(t, len(slim) < len(full)-len(dropped)/2, "slim %d, full %d, dropped %d", len(slim), len(full), len(dropped))
	// The private status stays empty: a resolve with no excludes sees none.
	st, err := os.ReadFile(a.status)
	assert.NilError(t, err)
	assert.Equal(t, len(st), 0)

	_, _, err = a.resolve(ctx, roots, []string{"python3-matplotlib"})
	assert.ErrorContains(t, err, "one of the roots")
	_, _, err = a.resolve(ctx, roots, []string{"nodejs"})
	assert.ErrorContains(t, err, "not in the closure")
}
