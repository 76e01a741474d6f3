package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"gotest.tools/v3/assert"
)

func TestParseSimulation(t *testing.T) {
	out := []byte(`Reading package lists...
The following NEW packages will be installed:
  libc6 python3-minimal
Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64]) []
Inst zlib1g (1:1.2.13.dfsg-1 Debian:12.15/oldstable [amd64])
Inst libicu72 (72.1-3+deb12u1 Debian:12.15/oldstable, Debian-Security:12/oldstable-security [amd64])
Inst ca-certificates (20250419~deb12u2 Debian-Security:12/oldstable-security [all])
Conf libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64])
`)
	got := parseSimulation(out)
	assert.DeepEqual(t, got, []pkg{
		{Name: "ca-certificates", Version: "20250419~deb12u2", Arch: "all"},
		{Name: "libc6", Version: "2.36-9+deb12u14", Arch: "amd64"},
		{Name: "libicu72", Version: "72.1-3+deb12u1", Arch: "amd64"},
		{Name: "zlib1g", Version: "1:1.2.13.dfsg-1", Arch: "amd64"},
	})
	assert.Equal(t, got[3].debName(), "zlib1g_1%3a1.2.13.dfsg-1_amd64.deb")
	assert.Equal(t, len(parseSimulation([]byte("E: Unable to locate package nope\n"))), 0)
}

func FuzzParseSimulation(f *testing.F) {
	f.Add([]byte("Inst libc6 (2.36-9 Debian:12 [amd64]) []\n"))
	f.Add([]byte("Inst x (1:2 a, b [all])\nConf x (1 [all])\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, p := range parseSimulation(data) {
			if p.Name == "" || p.Version == "" || p.Arch == "" || strings.ContainsAny(p.debName(), "/ \n") {
				t.Fatalf("bad package %+v", p)
			}
		}
	})
}

// TestRootAndLayer builds a root from a fake unpacked package tree and
// checks the layer is complete and byte-for-byte reproducible.
func TestRootAndLayer(t *testing.T) {
	root := t.TempDir()
	for p, body := range map[string]string{
		"bin/dash": "#!", "usr/bin/env": "env", "usr/bin/python3.11": "py",
		"usr/share/doc/x/README": "drop", "usr/share/doc/x/copyright": "keep", "usr/share/man/man1/x.1": "drop",
		"usr/share/ca-certificates/mozilla/A.crt": "-----A-----", "usr/share/ca-certificates/mozilla/B.crt": "-----B-----\n",
	} {
		assert.NilError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(root, p), []byte(body), 0o755))
	}
	assert.NilError(t, os.Symlink("dash", filepath.Join(root, "bin/sh")))
	assert.NilError(t, os.Symlink("python3.11", filepath.Join(root, "usr/bin/python3")))
	assert.NilError(t, os.Link(filepath.Join(root, "usr/bin/python3.11"), filepath.Join(root, "usr/bin/python3.11-hard")))
	old := time.Date(2023, 1, 2, 3, 4, 5, 0, time.UTC)
	assert.NilError(t, filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chtimes(p, old, old)
	}))
	epoch, err := newestFile(root)
	assert.NilError(t, err)
	assert.Equal(t, epoch, old)

	r := recipes()[0]
	assert.NilError(t, finishRoot(root, r))
	bundle, err := os.ReadFile(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt"))
	assert.NilError(t, err)
	assert.Equal(t, string(bundle), "-----A-----\n-----B-----\n")
	target, err := os.Readlink(filepath.Join(root, "usr/bin/python"))
	assert.NilError(t, err)
	assert.Equal(t, target, "python3")
	target, err = os.Readlink(filepath.Join(root, "usr/lib", multiarch(), "libblas.so.3"))
	assert.NilError(t, err)
	assert.Equal(t, target, "blas/libblas.so.3")
	_, err = os.Stat(filepath.Join(root, "usr/share/doc/x/README"))
	assert.Assert(t, os.IsNotExist(err))
	_, err = os.Stat(filepath.Join(root, "usr/share/doc/x/copyright"))
	assert.NilError(t, err)
	fi, err := os.Stat(filepath.Join(root, "tmp"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode()&os.ModeSticky, os.ModeSticky)

	// What a check leaves in /root and /tmp does not reach the layer.
	assert.NilError(t, os.MkdirAll(filepath.Join(root, "root/.cache/matplotlib"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(root, "root/.cache/matplotlib/fontlist.json"), []byte("{}"), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(root, "tmp/x"), nil, 0o644))
	assert.NilError(t, clearCheckLeftovers(root))
	for _, dir := range []string{"root", "tmp"} {
		entries, err := os.ReadDir(filepath.Join(root, dir))
		assert.NilError(t, err)
		assert.Equal(t, len(entries), 0, dir)
	}
	fi, err = os.Stat(filepath.Join(root, "tmp"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode()&os.ModeSticky, os.ModeSticky)

	out1 := filepath.Join(t.TempDir(), "l1.tar.gz")
	out2 := filepath.Join(t.TempDir(), "l2.tar.gz")
	assert.NilError(t, writeLayer(root, out1, epoch))
	assert.NilError(t, writeLayer(root, out2, epoch))
	b1, err := os.ReadFile(out1)
	assert.NilError(t, err)
	b2, err := os.ReadFile(out2)
	assert.NilError(t, err)
	assert.Assert(t, bytes.Equal(b1, b2), "layer is not reproducible")

	zr, err := gzip.NewReader(bytes.NewReader(b1))
	assert.NilError(t, err)
	tr := tar.NewReader(zr)
	seen := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		assert.NilError(t, err)
		seen[h.Name] = h
		assert.Assert(t, !h.ModTime.After(epoch), h.Name)
		assert.Equal(t, h.Uid, 0)
	}
	for _, n := range []string{"bin/sh", "etc/passwd", "etc/group", "tmp/", "root/", "usr/bin/env", "usr/bin/python"} {
		assert.Assert(t, seen[n] != nil, "missing %s", n)
	}
	assert.Equal(t, seen["usr/bin/python3.11-hard"].Typeflag, byte(tar.TypeLink))
	assert.Equal(t, seen["usr/bin/python3.11-hard"].Linkname, "usr/bin/python3.11")

	img, err := ociImage(out1, r, epoch)
	assert.NilError(t, err)
	cf, err := img.ConfigFile()
	assert.NilError(t, err)
	assert.DeepEqual(t, cf.Config.Env, r.Env)
	assert.Equal(t, cf.Config.WorkingDir, "/root")
	assert.Equal(t, len(cf.RootFS.DiffIDs), 1)
}
