package images

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/registrytest"
)

// tarEnt is one entry of a layer built by a test.
type tarEnt struct {
	name, body, link string
	typ              byte
	mode             int64
}

func tf(name, body string) tarEnt {
	return tarEnt{name: name, body: body, typ: tar.TypeReg, mode: 0o644}
}
func td(name string) tarEnt { return tarEnt{name: name, typ: tar.TypeDir, mode: 0o755} }
func tsym(name, target string) tarEnt {
	return tarEnt{name: name, link: target, typ: tar.TypeSymlink, mode: 0o777}
}
func thard(name, target string) tarEnt {
	return tarEnt{name: name, link: target, typ: tar.TypeLink, mode: 0o644}
}
func tmode(e tarEnt, mode int64) tarEnt { e.mode = mode; return e }
func tdev(name string, typ byte) tarEnt { return tarEnt{name: name, typ: typ, mode: 0o600} }

// gzLayer builds a gzip'd tar layer.
func gzLayer(t testing.TB, ents ...tarEnt) v1.Layer {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range ents {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Format: tar.FormatPAX}
		if e.typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if e.typ == tar.TypeChar || e.typ == tar.TypeBlock {
			hdr.Devmajor, hdr.Devminor = 1, 5
		}
		assert.NilError(t, tw.WriteHeader(hdr))
		if e.body != "" {
			_, err := tw.Write([]byte(e.body))
			assert.NilError(t, err)
		}
	}
	assert.NilError(t, tw.Close())
	return gzBytesLayer(t, raw.Bytes())
}

func gzBytesLayer(t testing.TB, raw []byte) v1.Layer {
	t.Helper()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, err := zw.Write(raw)
	assert.NilError(t, err)
	assert.NilError(t, zw.Close())
	return static.NewLayer(gz.Bytes(), types.OCILayer)
}

// testImage builds an OCI image for arch (host arch when "") from layers.
func testImage(t testing.TB, arch string, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	if arch == "" {
		arch = runtime.GOARCH
	}
	img, err := mutate.ConfigFile(mutate.MediaType(empty.Image, types.OCIManifestSchema1), &v1.ConfigFile{
		OS: "linux", Architecture: arch, Config: cfg, RootFS: v1.RootFS{Type: "layers"},
	})
	assert.NilError(t, err)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, layers...)
	assert.NilError(t, err)
	return img
}

func startRegistry(t testing.TB, opts registrytest.Options) *registrytest.Registry {
	t.Helper()
	reg, err := registrytest.Start(opts)
	assert.NilError(t, err)
	t.Cleanup(reg.Close)
	return reg
}

// env is a temp dir with a cache root and a sentinel dir beside it.
type env struct {
	base, root, sentinel string
	before               map[string]string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	base := t.TempDir()
	e := &env{base: base, root: filepath.Join(base, "cache"), sentinel: filepath.Join(base, "sentinel")}
	assert.NilError(t, os.MkdirAll(filepath.Join(e.sentinel, "etc"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(e.sentinel, "secret"), []byte("keep"), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(e.sentinel, "etc", "passwd"), []byte("root:x:0:0"), 0o644))
	e.before = e.snapshot(t)
	return e
}

// snapshot records everything in the temp dir outside the cache root.
func (e *env) snapshot(t testing.TB) map[string]string {
	t.Helper()
	out := map[string]string{}
	assert.NilError(t, filepath.WalkDir(e.base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == e.root {
			return filepath.SkipDir
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		v := fi.Mode().String()
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += ":" + string(b)
		}
		out[p] = v
		return nil
	}))
	return out
}

func (e *env) assertUntouched(t testing.TB) {
	t.Helper()
	assert.DeepEqual(t, e.snapshot(t), e.before)
}

func (e *env) store(t testing.TB, mod func(*Options)) *Store {
	t.Helper()
	opts := Options{Root: e.root, Keychain: noKeychain{}}
	if mod != nil {
		mod(&opts)
	}
	s, err := Open(opts)
	assert.NilError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// assertConsistent checks the cache invariants: every installed image is
// complete, every ref points at one, no scratch dir is left.
func assertConsistent(t testing.TB, root string) {
	t.Helper()
	imgs, err := os.ReadDir(filepath.Join(root, "images", "sha256"))
	assert.NilError(t, err)
	for _, d := range imgs {
		for _, f := range []string{"rootfs.erofs", "image.json"} {
			_, err := os.Stat(filepath.Join(root, "images", "sha256", d.Name(), f))
			assert.NilError(t, err, "image %s lacks %s", d.Name(), f)
		}
	}
	refs, err := os.ReadDir(filepath.Join(root, "images", "refs"))
	assert.NilError(t, err)
	for _, r := range refs {
		b, err := os.ReadFile(filepath.Join(root, "images", "refs", r.Name()))
		assert.NilError(t, err)
		var rec refRecord
		assert.NilError(t, jsonUnmarshal(b, &rec))
		_, err = os.Stat(filepath.Join(root, "images", strings.Replace(rec.Digest, ":", "/", 1), "rootfs.erofs"))
		assert.NilError(t, err, "ref %s points at a missing image", rec.Ref)
	}
	tmp, err := os.ReadDir(filepath.Join(root, "images", "tmp"))
	assert.NilError(t, err)
	assert.Equal(t, len(tmp), 0, "scratch dirs left: %v", tmp)
}

func installedCount(t testing.TB, root string) int {
	t.Helper()
	imgs, err := os.ReadDir(filepath.Join(root, "images", "sha256"))
	assert.NilError(t, err)
	return len(imgs)
}

// unpackErofs extracts a block image with fsck.erofs so tests can look
// inside what a VM would mount.
func unpackErofs(t testing.TB, image string) string {
	t.Helper()
	if _, err := exec.LookPath("fsck.erofs"); err != nil {
		t.Skip("fsck.erofs not installed (erofs-utils; scripts/setup-vm.sh installs it)")
	}
	dir := filepath.Join(t.TempDir(), "x")
	out, err := exec.Command("fsck.erofs", "--extract="+dir, image).CombinedOutput()
	assert.NilError(t, err, string(out))
	return dir
}

func listTree(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	assert.NilError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel != "." {
			out = append(out, rel)
		}
		return nil
	}))
	sort.Strings(out)
	return out
}

// progressLog collects reports.
type progressLog struct {
	mu sync.Mutex
	ps []Progress
}

func (l *progressLog) add(p Progress) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ps = append(l.ps, p)
}

func (l *progressLog) phases() []Phase {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Phase
	for _, p := range l.ps {
		if len(out) == 0 || out[len(out)-1] != p.Phase {
			out = append(out, p.Phase)
		}
	}
	return out
}

// failingHook answers matching requests with status until disabled.
type failingHook struct {
	mu      sync.Mutex
	match   func(*http.Request) bool
	respond func(http.ResponseWriter, *http.Request)
	on      bool
}

func (h *failingHook) set(on bool) {
	h.mu.Lock()
	h.on = on
	h.mu.Unlock()
}

func (h *failingHook) hook(w http.ResponseWriter, r *http.Request) bool {
	h.mu.Lock()
	on := h.on
	h.mu.Unlock()
	if on && h.match(r) {
		h.respond(w, r)
		return true
	}
	return false
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return c
}
