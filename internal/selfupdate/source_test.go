package selfupdate

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestParseSource(t *testing.T) {
	wd, err := os.Getwd()
	assert.NilError(t, err)
	tests := []struct {
		in, str, index string
		dir            bool
		wantErr        string
	}{
		{in: "https://releases.test/iii", str: "https://releases.test/iii", index: "https://releases.test/iii/index.json"},
		{in: "https://releases.test/iii/", str: "https://releases.test/iii", index: "https://releases.test/iii/index.json"},
		{in: "HTTP://127.0.0.1:8080?x=1#f", str: "http://127.0.0.1:8080", index: "http://127.0.0.1:8080/index.json"},
		{in: "file:///srv/releases", str: "/srv/releases", index: "/srv/releases/index.json", dir: true},
		{in: "file://localhost/srv/releases", str: "/srv/releases", index: "/srv/releases/index.json", dir: true},
		{in: "/srv/releases/", str: "/srv/releases", index: "/srv/releases/index.json", dir: true},
		{in: "rel", str: filepath.Join(wd, "rel"), index: filepath.Join(wd, "rel", "index.json"), dir: true},
		{in: "  ", wantErr: "it is empty"},
		{in: "ftp://x/y", wantErr: "only http, https and file URLs"},
		{in: "https:///nohost", wantErr: "no host"},
		{in: "https://user:pw@host/", wantErr: "credentials"},
		{in: "file://otherhost/x", wantErr: "a directory on this machine"},
		{in: "file://", wantErr: "no path"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			s, err := ParseSource(tc.in)
			if tc.wantErr != "" {
				assert.Equal(t, CodeOf(err), CodeInvalidSource, "%v", err)
				assert.Check(t, is.Contains(err.Error(), tc.wantErr))
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, s.String(), tc.str)
			assert.Equal(t, s.IndexLocation(), tc.index)
			assert.Equal(t, s.IsDir(), tc.dir)
		})
	}
}

// TestResolveSource: --source beats $III_RELEASE_SOURCE beats the default.
func TestResolveSource(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == EnvSource {
				return v
			}
			return ""
		}
	}
	s, err := ResolveSource("/flag", env("/env"))
	assert.NilError(t, err)
	assert.Equal(t, s.String(), "/flag")
	assert.Equal(t, s.Origin(), "--source")
	s, err = ResolveSource("", env("/env"))
	assert.NilError(t, err)
	assert.Equal(t, s.String(), "/env")
	assert.Equal(t, s.Origin(), "$"+EnvSource)
	s, err = ResolveSource("", env(""))
	assert.NilError(t, err)
	assert.Equal(t, s.String(), DefaultSource)
	assert.Check(t, !s.IsDir() && !s.Insecure(), "the default is HTTPS")
	_, err = ResolveSource("", env("gopher://x"))
	assert.Equal(t, CodeOf(err), CodeInvalidSource)
}

func TestInsecure(t *testing.T) {
	for in, want := range map[string]bool{
		"http://releases.test/":  true,
		"https://releases.test/": false,
		"http://127.0.0.1:9/":    false,
		"http://localhost/":      false,
		"http://[::1]:80/":       false,
		"/srv/releases":          false,
	} {
		s, err := ParseSource(in)
		assert.NilError(t, err)
		assert.Equal(t, s.Insecure(), want, in)
	}
}

// TestAssetURL: relative urls resolve against index.json and stay inside
// a directory source; an HTTP source never reaches local files.
func TestAssetURL(t *testing.T) {
	web, err := ParseSource("https://releases.test/iii/")
	assert.NilError(t, err)
	dir, err := ParseSource("/srv/rel")
	assert.NilError(t, err)
	tests := []struct {
		src     Source
		ref     string
		want    string
		wantErr string
	}{
		{src: web, ref: "0.26.1/iii-x.tar.gz", want: "https://releases.test/iii/0.26.1/iii-x.tar.gz"},
		{src: web, ref: "../other/iii.tar.gz", want: "https://releases.test/other/iii.tar.gz"},
		{src: web, ref: "https://cdn.test/a/iii.tar.gz", want: "https://cdn.test/a/iii.tar.gz"},
		{src: web, ref: "file:///etc/passwd", wantErr: "may not point at local files"},
		{src: web, ref: "/abs/iii.tar.gz", wantErr: "relative to index.json"},
		{src: web, ref: "//host/iii.tar.gz", wantErr: "relative to index.json"},
		{src: web, ref: "ftp://x/iii.tar.gz", wantErr: "only http, https"},
		{src: web, ref: "https:///x", wantErr: "no host"},
		{src: web, ref: "%zz", wantErr: "not a URL"},
		{src: dir, ref: "0.26.1/iii-x.tar.gz", want: "file:///srv/rel/0.26.1/iii-x.tar.gz"},
		{src: dir, ref: "file:///srv/rel/0.26.1/iii-x.tar.gz", want: "file:///srv/rel/0.26.1/iii-x.tar.gz"},
		{src: dir, ref: "https://cdn.test/iii.tar.gz", want: "https://cdn.test/iii.tar.gz"},
		{src: dir, ref: "../etc/passwd", wantErr: "outside the source directory"},
		{src: dir, ref: "a/../../x", wantErr: "outside the source directory"},
		{src: dir, ref: "file:///srv/other/x.tar.gz", wantErr: "outside the source directory"},
		{src: dir, ref: "file:///srv/rel", wantErr: "outside the source directory"},
		{src: dir, ref: ".", wantErr: "outside the source directory"},
	}
	for _, tc := range tests {
		t.Run(tc.src.String()+" "+tc.ref, func(t *testing.T) {
			got, err := tc.src.AssetURL(tc.ref)
			if tc.wantErr != "" {
				assert.Equal(t, CodeOf(err), CodeIndexInvalid, "%v", err)
				assert.Check(t, is.Contains(err.Error(), tc.wantErr))
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
		})
	}
}

// FuzzSource: any source string and asset url: no panic, and a directory
// source only ever resolves to files inside its directory (or to
// http(s) URLs).
func FuzzSource(f *testing.F) {
	for _, s := range [][2]string{
		{"/srv/rel", "0.26.1/iii.tar.gz"},
		{"/srv/rel", "../x"},
		{"file:///srv/rel", "file:///srv/rel/a/../../x"},
		{"https://r.test/x", "../y"},
		{"http://127.0.0.1:1/", "https://cdn.test/a"},
		{"", "%"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, source, ref string) {
		s, err := ParseSource(source)
		if err != nil {
			if CodeOf(err) != CodeInvalidSource {
				t.Fatalf("uncoded error %v", err)
			}
			return
		}
		_ = s.IndexLocation()
		_ = s.Insecure()
		u, err := s.AssetURL(ref)
		if err != nil {
			return
		}
		parsed, perr := url.Parse(u)
		if perr != nil {
			t.Fatalf("AssetURL returned %q, not a URL: %v", u, perr)
		}
		switch parsed.Scheme {
		case "http", "https":
		case "file":
			if !s.IsDir() {
				t.Fatalf("an HTTP source resolved %q to a local file %q", ref, u)
			}
			rel, err := filepath.Rel(s.dir, filepath.Clean(filepath.FromSlash(parsed.Path)))
			if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				t.Fatalf("%q resolved outside %s: %q", ref, s.dir, u)
			}
		default:
			t.Fatalf("AssetURL returned the scheme %q (%q)", parsed.Scheme, u)
		}
	})
}
