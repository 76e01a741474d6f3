package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose"
)

const sha = "0000000000000000000000000000000000000000000000000000000000000000"

// testIndex is an index with the versions the resolution table needs.
func testIndex(t *testing.T) *Index {
	t.Helper()
	art := fmt.Sprintf(`{"x86_64-unknown-linux-gnu":{"url":"a.tar.gz","sha256":%q}}`, sha)
	var vs []string
	for _, v := range []string{"0.1.0", "0.2.0", "0.2.9", "0.3.0-rc.1", "0.3.1", "1.0.0"} {
		vs = append(vs, fmt.Sprintf(`%q:{"artifacts":%s}`, v, art))
	}
	data := `{"name":"pkg","kind":"binary","tags":{"latest":"0.3.1","next":"0.3.0-rc.1"},"versions":{` + strings.Join(vs, ",") + `}}`
	idx, err := DecodeIndex([]byte(data), "pkg", "test")
	assert.NilError(t, err)
	return idx
}

// TestResolve is the resolution table: ranges, exact versions and tags,
// prereleases only when asked for, and PACKAGE_NOT_RESOLVED otherwise.
func TestResolve(t *testing.T) {
	idx := testIndex(t)
	tests := []struct {
		sel, want, code string
	}{
		{sel: "^0.2", want: "0.2.9"},
		{sel: "~0.2.0", want: "0.2.9"},
		{sel: "0.2.x", want: "0.2.9"},
		{sel: ">=0.2 <0.3", want: "0.2.9"},
		{sel: "0.2.0", want: "0.2.0"},
		{sel: "=0.1.0", want: "0.1.0"},
		{sel: "^0.3", want: "0.3.1"},
		{sel: "0.3.0-rc.1", want: "0.3.0-rc.1"},
		{sel: "*", want: "1.0.0"},
		{sel: "^1", want: "1.0.0"},
		{sel: "1", want: "1.0.0"},
		{sel: "latest", want: "0.3.1"},
		{sel: "next", want: "0.3.0-rc.1"},
		{sel: "^2", code: compose.CodePackageNotResolved},
		{sel: "0.2.5", code: compose.CodePackageNotResolved},
		{sel: "beta", code: compose.CodePackageNotResolved},
	}
	for _, tc := range tests {
		t.Run(tc.sel, func(t *testing.T) {
			v, ver, err := idx.Resolve(tc.sel, "registry test")
			if tc.code != "" {
				assert.Equal(t, compose.CodeOf(err), tc.code, "%v", err)
				assert.Check(t, is.Contains(err.Error(), "0.1.0, 0.2.0, 0.2.9, 0.3.0-rc.1, 0.3.1, 1.0.0"), "the message lists what is published")
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, v, tc.want)
			assert.Check(t, ver == idx.Versions[tc.want])
		})
	}
}

func TestLatestWithoutTags(t *testing.T) {
	idx := testIndex(t)
	idx.Tags = nil
	assert.Equal(t, idx.Latest(), "1.0.0")
	v, _, err := idx.Resolve("latest", "test")
	assert.NilError(t, err)
	assert.Equal(t, v, "1.0.0")
}

func TestDecodeIndexRefuses(t *testing.T) {
	ok := fmt.Sprintf(`{"x86_64-unknown-linux-gnu":{"url":"a.tar.gz","sha256":%q}}`, sha)
	tests := []struct {
		name, data, code, msg string
	}{
		{"not json", `{`, compose.CodePackageNotResolved, "not valid JSON"},
		{"two values", `{} {}`, compose.CodePackageNotResolved, "more than one"},
		{"another package", `{"name":"other","kind":"binary","versions":{"1.0.0":{"artifacts":` + ok + `}}}`, compose.CodePackageNotResolved, `describes package "other"`},
		{"unsafe name", `{"name":"../x","kind":"binary","versions":{}}`, compose.CodeRegistryNameRefused, "package name"},
		{"unsafe version", `{"name":"pkg","kind":"binary","versions":{"1.0.0+a/b":{"artifacts":` + ok + `}}}`, compose.CodeRegistryNameRefused, "version"},
		{"unsafe target", `{"name":"pkg","kind":"binary","versions":{"1.0.0":{"artifacts":{"../x":{"url":"a","sha256":"` + sha + `"}}}}}`, compose.CodeRegistryNameRefused, "target triple"},
		{"unsafe dependency", `{"name":"pkg","kind":"binary","versions":{"1.0.0":{"artifacts":` + ok + `,"dependencies":{"a/b":"1"}}}}`, compose.CodeRegistryNameRefused, "dependency"},
		{"not semver", `{"name":"pkg","kind":"binary","versions":{"1.0":{"artifacts":` + ok + `}}}`, compose.CodePackageNotResolved, "not a semantic version"},
		{"bad kind", `{"name":"pkg","kind":"wasm","versions":{"1.0.0":{}}}`, compose.CodePackageNotResolved, "kind"},
		{"bad version kind", `{"name":"pkg","kind":"binary","versions":{"1.0.0":{"kind":"x"}}}`, compose.CodePackageNotResolved, "kind"},
		{"no versions", `{"name":"pkg","kind":"binary","versions":{}}`, compose.CodePackageNotResolved, "no versions"},
		{"null version", `{"name":"pkg","kind":"binary","versions":{"1.0.0":null}}`, compose.CodePackageNotResolved, "null"},
		{"bad digest", `{"name":"pkg","kind":"binary","versions":{"1.0.0":{"artifacts":{"t":{"url":"a","sha256":"ABC"}}}}}`, compose.CodePackageNotResolved, "sha256"},
		{"no url", `{"name":"pkg","kind":"binary","versions":{"1.0.0":{"artifacts":{"t":{"url":"","sha256":"` + sha + `"}}}}}`, compose.CodePackageNotResolved, "no url"},
		{"negative size", `{"name":"pkg","kind":"binary","versions":{"1.0.0":{"artifacts":{"t":{"url":"a","sha256":"` + sha + `","size":-1}}}}}`, compose.CodePackageNotResolved, "negative"},
		{"dangling tag", `{"name":"pkg","kind":"binary","tags":{"latest":"2.0.0"},"versions":{"1.0.0":{"artifacts":` + ok + `}}}`, compose.CodePackageNotResolved, "not a listed version"},
		{"bad dependency selector", `{"name":"pkg","kind":"binary","versions":{"1.0.0":{"artifacts":` + ok + `,"dependencies":{"dep":"^^"}}}}`, compose.CodePackageNotResolved, "dependency dep"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeIndex([]byte(tc.data), "pkg", "idx.json")
			assert.Equal(t, compose.CodeOf(err), tc.code, "%v", err)
			assert.Check(t, is.Contains(err.Error(), tc.msg))
		})
	}
}

// A registry may add fields; a version without a kind takes the
// package's; default_config defaults to null.
func TestDecodeIndexDefaults(t *testing.T) {
	data := `{"name":"pkg","kind":"bundle","homepage":"x","versions":{"1.0.0":{"artifacts":{},"extra":1}}}`
	idx, err := DecodeIndex([]byte(data), "pkg", "idx")
	assert.NilError(t, err)
	assert.Equal(t, idx.Versions["1.0.0"].Kind, KindBundle)
	assert.Equal(t, string(idx.Versions["1.0.0"].DefaultConfig), "null")
}

func TestPlatformTarget(t *testing.T) {
	tests := []struct {
		p    Platform
		want string
	}{
		{Platform{GOOS: "linux", GOARCH: "amd64"}, "x86_64-unknown-linux-gnu"},
		{Platform{GOOS: "linux", GOARCH: "arm64"}, "aarch64-unknown-linux-gnu"},
		{Platform{GOOS: "linux", GOARCH: "amd64", Musl: true}, "x86_64-unknown-linux-musl"},
		{Platform{GOOS: "linux", GOARCH: "arm64", Musl: true}, "aarch64-unknown-linux-musl"},
		{Platform{GOOS: "darwin", GOARCH: "arm64"}, "aarch64-apple-darwin"},
		{Platform{GOOS: "darwin", GOARCH: "amd64"}, "x86_64-apple-darwin"},
		{Platform{GOOS: "windows", GOARCH: "amd64"}, "x86_64-pc-windows-msvc"},
		{Platform{GOOS: "plan9", GOARCH: "mips"}, "mips-unknown-plan9"},
	}
	for _, tc := range tests {
		assert.Check(t, is.Equal(tc.p.Target(), tc.want), "%+v", tc.p)
	}
}

func TestDetectMusl(t *testing.T) {
	has := func(present ...string) func(string) bool {
		return func(pattern string) bool {
			for _, p := range present {
				if ok, _ := filepath.Match(pattern, p); ok {
					return true
				}
			}
			return false
		}
	}
	assert.Check(t, detectMusl(has("/lib/ld-musl-x86_64.so.1")), "alpine")
	assert.Check(t, !detectMusl(has("/lib64/ld-linux-x86-64.so.2")), "glibc")
	assert.Check(t, !detectMusl(has("/lib/ld-musl-x86_64.so.1", "/lib64/ld-linux-x86-64.so.2")), "glibc with musl beside it")
	assert.Check(t, !detectMusl(has("/lib/ld-musl-aarch64.so.1", "/lib/ld-linux-aarch64.so.1")))
}

// Installable: kinds that cannot be installed, bundles on Windows or when
// disabled, and a host target the version does not ship — each with its
// code and a message that lists what would work.
func TestInstallable(t *testing.T) {
	shipped := []string{"aarch64-apple-darwin", "aarch64-unknown-linux-gnu", "x86_64-unknown-linux-gnu"}
	linux := Platform{GOOS: "linux", GOARCH: "amd64"}
	tests := []struct {
		name     string
		kind     string
		p        Platform
		disabled bool
		code     string
		msg      string
	}{
		{"binary on linux", KindBinary, linux, false, "", ""},
		{"engine", KindEngine, linux, false, compose.CodeEngineWorkerIsBuiltin, "built into the engine"},
		{"image", KindImage, linux, false, compose.CodeUnsupportedPackageKind, "OCI runtime"},
		{"musl", KindBinary, Platform{GOOS: "linux", GOARCH: "amd64", Musl: true}, false, compose.CodeUnsupportedPlatform,
			"(x86_64-unknown-linux-musl); it ships aarch64-apple-darwin, aarch64-unknown-linux-gnu, x86_64-unknown-linux-gnu"},
		{"intel mac", KindBinary, Platform{GOOS: "darwin", GOARCH: "amd64"}, false, compose.CodeUnsupportedPlatform, "(x86_64-apple-darwin); it ships"},
		{"bundle on windows", KindBundle, Platform{GOOS: "windows", GOARCH: "amd64"}, false, compose.CodeBundleNeedsAVM, "WSL"},
		{"bundles disabled", KindBundle, linux, true, compose.CodeBundleNeedsAVM, EnvBundlesDisabled},
		{"binary on windows", KindBinary, Platform{GOOS: "windows", GOARCH: "amd64"}, false, compose.CodeUnsupportedPlatform, "x86_64-pc-windows-msvc"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			target, err := Installable("sandbox-libkrun", "0.3.1", tc.kind, shipped, tc.p, tc.disabled)
			if tc.code == "" {
				assert.NilError(t, err)
				assert.Equal(t, target, tc.p.Target())
				return
			}
			assert.Equal(t, compose.CodeOf(err), tc.code, "%v", err)
			assert.Check(t, is.Contains(err.Error(), tc.msg))
		})
	}
}

func TestLocations(t *testing.T) {
	l, err := HostLocation("127.0.0.1:8080")
	assert.NilError(t, err)
	assert.Equal(t, l.String(), "http://127.0.0.1:8080/")
	l, err = HostLocation("localhost:1")
	assert.NilError(t, err)
	assert.Equal(t, l.String(), "http://localhost:1/")
	l, err = HostLocation("registry.example")
	assert.NilError(t, err)
	assert.Equal(t, l.String(), "https://registry.example/")

	l, err = ParseLocation("https://r.example/base")
	assert.NilError(t, err)
	u, err := l.ArtifactURL("pkg", "1.0.0/pkg.tar.gz")
	assert.NilError(t, err)
	assert.Equal(t, u, "https://r.example/base/packages/pkg/1.0.0/pkg.tar.gz")
	u, err = l.ArtifactURL("pkg", "https://cdn.example/x.tar.gz")
	assert.NilError(t, err)
	assert.Equal(t, u, "https://cdn.example/x.tar.gz")
	_, err = l.ArtifactURL("pkg", "file:///etc/passwd")
	assert.Equal(t, compose.CodeOf(err), compose.CodePackageDownloadFailed)
	_, err = l.ArtifactURL("pkg", "ftp://x/y")
	assert.Equal(t, compose.CodeOf(err), compose.CodePackageDownloadFailed)

	dir := t.TempDir()
	l, err = ParseLocation(dir)
	assert.NilError(t, err)
	u, err = l.ArtifactURL("pkg", "1.0.0/pkg.tar.gz")
	assert.NilError(t, err)
	assert.Equal(t, u, "file://"+filepath.ToSlash(filepath.Join(dir, "packages", "pkg", "1.0.0", "pkg.tar.gz")))
	_, err = l.ArtifactURL("pkg", "../../../outside.tar.gz")
	assert.Equal(t, compose.CodeOf(err), compose.CodePackageDownloadFailed)
	_, err = l.ArtifactURL("pkg", "file:///etc/passwd")
	assert.Equal(t, compose.CodeOf(err), compose.CodePackageDownloadFailed)

	_, err = ParseLocation("ftp://x")
	assert.Equal(t, compose.CodeOf(err), compose.CodeRegistryUnreachable)

	// The default: $III_REGISTRY, else registry/ beside the executable.
	env := map[string]string{EnvRegistry: "http://127.0.0.1:9/r"}
	l, err = DefaultLocation(func(k string) string { return env[k] }, nil)
	assert.NilError(t, err)
	assert.Equal(t, l.String(), "http://127.0.0.1:9/r/")
	l, err = DefaultLocation(func(string) string { return "" }, func() (string, error) { return filepath.Join(dir, "iii"), nil })
	assert.NilError(t, err)
	assert.Equal(t, l.String(), filepath.Join(dir, EmbeddedDir))
}

// publishTo publishes a one-file package into a directory registry.
func publishTo(t *testing.T, dir, name, version string, cfg string) *PublishResult {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	assert.NilError(t, os.WriteFile(bin, []byte("#!/bin/sh\necho "+name+" "+version+"\n"), 0o755))
	res, err := Publish(dir, Publication{Name: name, Kind: KindBinary, Version: version, Target: "x86_64-unknown-linux-gnu",
		Files: []PublishFile{{Path: bin}}, DefaultConfig: json.RawMessage(cfg), Tags: []string{TagLatest}, Now: time.Unix(1700000000, 0)})
	assert.NilError(t, err)
	return res
}

// A real HTTP registry (the directory registry served over httptest):
// indexes over HTTP, a missing package, a failing registry (its error
// body in the message), and one that cannot be reached.
func TestHTTPRegistry(t *testing.T) {
	dir := t.TempDir()
	publishTo(t, dir, "pkg", "1.0.0", `{"b":1,"a":[1,2]}`)
	files := http.FileServer(http.Dir(dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "broken") {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":{"message":"maintenance","fix":"try later"}}`))
			return
		}
		files.ServeHTTP(w, r)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	loc, err := HostLocation(host)
	assert.NilError(t, err)
	c := &Client{HTTP: srv.Client()}
	idx, err := c.Index(context.Background(), loc, "pkg")
	assert.NilError(t, err)
	assert.Equal(t, idx.Tags["latest"], "1.0.0")
	var compact bytes.Buffer
	assert.NilError(t, json.Compact(&compact, idx.Versions["1.0.0"].DefaultConfig))
	assert.Equal(t, compact.String(), `{"a":[1,2],"b":1}`)

	_, err = c.Index(context.Background(), loc, "nope")
	assert.Equal(t, compose.CodeOf(err), compose.CodePackageNotResolved)
	assert.Check(t, is.Contains(err.Error(), `has no package "nope"`))

	_, err = c.Index(context.Background(), loc, "broken")
	assert.Equal(t, compose.CodeOf(err), compose.CodeRegistryUnreachable)
	assert.Check(t, is.Contains(err.Error(), "503 Service Unavailable"))
	assert.Check(t, is.Contains(err.Error(), "maintenance (try later)"))

	srv.Close()
	_, err = c.Index(context.Background(), loc, "pkg")
	assert.Equal(t, compose.CodeOf(err), compose.CodeRegistryUnreachable)

	// A directory registry that is not there.
	missing, err := ParseLocation(filepath.Join(dir, "missing"))
	assert.NilError(t, err)
	_, err = c.Index(context.Background(), missing, "pkg")
	assert.Equal(t, compose.CodeOf(err), compose.CodeRegistryUnreachable)
	assert.Check(t, is.Contains(err.Error(), EnvRegistry))
}

// Publishing is idempotent and deterministic: the same files make the
// same archive in any registry, publishing them again changes nothing,
// other versions stay and a republished version keeps its stamp.
func TestPublish(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	ra := publishTo(t, a, "pkg", "1.0.0", `null`)
	rb := publishTo(t, b, "pkg", "1.0.0", `null`)
	assert.Equal(t, ra.SHA256, rb.SHA256)
	da, err := os.ReadFile(ra.ArtifactPath)
	assert.NilError(t, err)
	db, err := os.ReadFile(rb.ArtifactPath)
	assert.NilError(t, err)
	assert.Check(t, bytes.Equal(da, db))
	assert.Check(t, ra.Changed)

	indexBefore, err := os.ReadFile(ra.IndexPath)
	assert.NilError(t, err)
	again := publishTo(t, a, "pkg", "1.0.0", `null`)
	assert.Check(t, !again.Changed)
	indexAfter, err := os.ReadFile(ra.IndexPath)
	assert.NilError(t, err)
	assert.Equal(t, string(indexAfter), string(indexBefore))

	publishTo(t, a, "pkg", "1.1.0", `{"k":"v"}`)
	data, err := os.ReadFile(ra.IndexPath)
	assert.NilError(t, err)
	idx, err := DecodeIndex(data, "pkg", ra.IndexPath)
	assert.NilError(t, err)
	assert.Equal(t, len(idx.Versions), 2)
	assert.Equal(t, idx.Tags["latest"], "1.1.0")
	assert.Equal(t, idx.Versions["1.0.0"].PublishedAt, "2023-11-14T22:13:20Z")
	assert.Equal(t, idx.Versions["1.0.0"].Artifacts["x86_64-unknown-linux-gnu"].URL, "1.0.0/pkg-1.0.0-x86_64-unknown-linux-gnu.tar.gz")

	_, err = Publish(a, Publication{Name: "../x", Kind: KindBinary, Version: "1.0.0", Target: "t", Files: []PublishFile{{Path: ra.ArtifactPath}}})
	assert.ErrorContains(t, err, "path-safe")
	_, err = Publish(a, Publication{Name: "x", Kind: KindEngine, Version: "1.0.0", Target: "t", Files: []PublishFile{{Path: ra.ArtifactPath}}})
	assert.ErrorContains(t, err, "only binary and bundle")
}

func FuzzDecodeIndex(f *testing.F) {
	f.Add([]byte(`{"name":"pkg","kind":"binary","tags":{"latest":"1.0.0"},"versions":{"1.0.0":{"artifacts":{"x86_64-unknown-linux-gnu":{"url":"a","sha256":"` + sha + `","size":3}},"dependencies":{"d":"^1"},"default_config":{"a":1}}}}`))
	f.Add([]byte(`{"name":"pkg","kind":"engine","versions":{"0.1.0":{}}}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"name":"pkg","versions":{"1.0.0":null}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		idx, err := DecodeIndex(data, "pkg", "fuzz")
		if err != nil {
			if compose.CodeOf(err) == "" {
				t.Fatalf("uncoded error %v", err)
			}
			return
		}
		for v, ver := range idx.Versions {
			if !PathSafe(v) {
				t.Fatalf("unsafe version %q accepted", v)
			}
			for target := range ver.Artifacts {
				if !PathSafe(target) {
					t.Fatalf("unsafe target %q accepted", target)
				}
			}
		}
		for _, sel := range []string{"latest", "^0.1", "*", "next"} {
			if v, _, err := idx.Resolve(sel, "fuzz"); err == nil {
				if _, ok := idx.Versions[v]; !ok {
					t.Fatalf("resolved %q to unlisted %q", sel, v)
				}
			} else if compose.CodeOf(err) == "" {
				t.Fatalf("uncoded resolve error %v", err)
			}
		}
	})
}
