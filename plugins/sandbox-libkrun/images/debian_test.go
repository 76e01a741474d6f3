package images

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/catalog"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/ocilayout"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/registrytest"
)

// presetLayout is where scripts/build-images.sh installs the presets.
func presetLayout(t *testing.T) string {
	t.Helper()
	root, err := DefaultRoot()
	assert.NilError(t, err)
	return filepath.Join(root, "oci")
}

// tarXZF packs a file with tar czf and unpacks it with tar xzf, as an
// install step unpacking a vendored archive does, then prints it: 4.
var tarXZF = []string{"/bin/sh", "-c", "cd /tmp && mkdir -p t/in/a && echo 4 > t/in/a/f && tar czf t/a.tgz -C t/in a && " +
	"gzip --version >/dev/null && mkdir t/out && tar xzf t/a.tgz -C t/out && cat t/out/a/f"}

// pythonPlot draws with numpy, pandas and matplotlib headless (the image's
// MPLBACKEND=Agg) and saves a PNG: what the python preset promises a code
// interpreter, with no compiler in the image.
var pythonPlot = []string{"/usr/bin/env", "python3", "-c", `
import os, shutil, numpy, pandas, matplotlib
import matplotlib.pyplot as plt
assert matplotlib.get_backend().lower() == "agg", matplotlib.get_backend()
assert shutil.which("gcc") is None and shutil.which("g++") is None, "a compiler in the image"
df = pandas.DataFrame({"x": numpy.arange(4)})
plt.plot(df["x"], df["x"] ** 2)
plt.savefig("/tmp/plot.png")
with open("/tmp/plot.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
os.remove("/tmp/plot.png")
print(int(df["x"].sum()) - 2)
`}

// pythonVenv makes a virtual environment (with its own pip, from the
// wheels python3-venv ships) and runs pip in it.
var pythonVenv = []string{"/bin/sh", "-c", "python3 -m venv /tmp/v && /tmp/v/bin/python -m pip --version >/dev/null && " +
	"/tmp/v/bin/python -c 'import sys; assert sys.prefix == \"/tmp/v\"; print(4)' && rm -rf /tmp/v"}

// TestDebianPresetImages pulls the Debian-built presets through the real
// registry protocol (in-process registry standing in for docker.io via
// registry_mirrors), installs them into a temp cache, and runs the real
// interpreters from the resulting erofs image, and `tar xzf` (gzip) in
// each: a VM worker's install step unpacks vendored archives with it.
func TestDebianPresetImages(t *testing.T) {
	layout := presetLayout(t)
	checks := map[string][][]string{
		"python": {{"/usr/bin/env", "python3", "-c", "print(2+2)"}, tarXZF, pythonPlot, pythonVenv},
		"node":   {{"/usr/bin/env", "node", "-e", "console.log(2+2)"}, tarXZF},
	}
	for _, p := range catalog.Presets() {
		t.Run(p.Name, func(t *testing.T) {
			if testing.Short() && p.Name == "node" {
				t.Skip("-short: the python preset covers the path")
			}
			entry, err := ocilayout.Find(layout, p.OCIRef)
			assert.NilError(t, err)
			if entry == nil {
				t.Skipf("%s is not in %s: run scripts/build-images.sh first (make setup-test does)", p.OCIRef, layout)
			}
			e := newEnv(t)
			reg := startRegistry(t, registrytest.Options{})
			pushed, err := reg.PushLayout(ctx(t), layout, p.OCIRef)
			assert.NilError(t, err)
			assert.Assert(t, strings.HasPrefix(pushed, reg.Host()+"/iiidev/"))

			// No local layout in this store: everything comes over HTTP.
			s := e.store(t, func(o *Options) {
				o.LocalLayouts = []string{}
				o.Mirrors = map[string]string{"docker.io": reg.URL()}
			})
			var log progressLog
			img, err := s.Ensure(ctx(t), p.OCIRef, EnsureOptions{AutoInstall: true, Progress: log.add})
			assert.NilError(t, err)
			assert.Equal(t, img.Config.Source, "registry")
			assert.Equal(t, img.Digest, entry.Descriptor.Digest.String())
			assert.DeepEqual(t, log.phases(), []Phase{PhaseResolving, PhasePulling, PhaseUnpacking, PhaseBuilding})
			assert.Assert(t, len(img.Config.Env) > 0 && strings.HasPrefix(img.Config.Env[0], "PATH="))

			tree := unpackErofs(t, img.RootfsPath)
			for _, f := range []string{"bin/sh", "usr/bin/env", "etc/passwd", "etc/group", "etc/ssl/certs/ca-certificates.crt"} {
				_, err := os.Stat(filepath.Join(tree, f))
				assert.NilError(t, err, f)
			}
			fi, err := os.Stat(filepath.Join(tree, "tmp"))
			assert.NilError(t, err)
			assert.Equal(t, fi.Mode()&os.ModeSticky, os.ModeSticky)
			if os.Geteuid() != 0 {
				t.Log("not root: skipping the chroot run of the interpreter")
				return
			}
			for _, check := range checks[p.Name] {
				cmd := exec.Command("chroot", append([]string{tree}, check...)...)
				cmd.Env = img.Config.Env
				out, err := cmd.CombinedOutput()
				assert.NilError(t, err, "%v: %s", check, out)
				assert.Equal(t, string(out), "4\n", "%v", check)
			}
			assertConsistent(t, e.root)
		})
	}
}

// TestLocalPresetInstall installs the python preset straight from the local
// layout with auto_install off, as an air-gapped adapter would.
func TestLocalPresetInstall(t *testing.T) {
	layout := presetLayout(t)
	ref := catalog.Presets()[0].OCIRef
	entry, err := ocilayout.Find(layout, ref)
	assert.NilError(t, err)
	if entry == nil {
		t.Skipf("%s is not in %s: run scripts/build-images.sh first (make setup-test does)", ref, layout)
	}
	e := newEnv(t)
	s := e.store(t, func(o *Options) { o.LocalLayouts = []string{layout}; o.Compression = CompressionLZ4HC })
	img, err := s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: false})
	assert.NilError(t, err)
	assert.Equal(t, img.Config.Source, "local")
	assert.Equal(t, img.Config.Compression, CompressionLZ4HC)
	assert.Equal(t, img.Digest, entry.Descriptor.Digest.String())
	tree := unpackErofs(t, img.RootfsPath)
	_, err = os.Stat(filepath.Join(tree, "usr/bin/python3"))
	assert.NilError(t, err)
}
