package initramfs

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

func TestCpioRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	assert.NilError(t, w.Mkdir("dev", 0o755))
	assert.NilError(t, w.CharDev("dev/console", 0o600, 5, 1))
	assert.NilError(t, w.WriteFile("init", 0o755, 5, strings.NewReader("agent")))
	assert.NilError(t, w.WriteFile("/a/b/c.txt", 0o644, 3, strings.NewReader("odd"))) // parents implied
	assert.NilError(t, w.Symlink("bin/sh", "busybox"))
	assert.NilError(t, w.WriteFile("empty", 0o600, 0, nil))
	assert.NilError(t, w.Mkdir("a", 0o755)) // already implied: no duplicate
	assert.NilError(t, w.Close())
	assert.Equal(t, buf.Len()%4, 0)

	entries, err := ReadAll(bytes.NewReader(buf.Bytes()), 1<<20)
	assert.NilError(t, err)
	got := map[string]Entry{}
	var names []string
	for _, e := range entries {
		got[e.Name] = e
		names = append(names, e.Name)
	}
	assert.DeepEqual(t, names, []string{"dev", "dev/console", "init", "a", "a/b", "a/b/c.txt", "bin", "bin/sh", "empty"})
	assert.Equal(t, got["dev/console"].Mode, uint32(ModeCharDev|0o600))
	assert.Equal(t, got["dev/console"].RDevMajor, uint32(5))
	assert.Equal(t, got["dev/console"].RDevMinor, uint32(1))
	assert.Equal(t, string(got["init"].Data), "agent")
	assert.Equal(t, got["init"].Mode, uint32(ModeRegular|0o755))
	assert.Equal(t, string(got["a/b/c.txt"].Data), "odd")
	assert.Equal(t, got["a/b"].Mode, uint32(ModeDir|0o755))
	assert.Equal(t, string(got["bin/sh"].Data), "busybox")
	assert.Equal(t, got["bin/sh"].Mode&modeType, uint32(ModeSymlink))

	// GNU cpio reads it too, when it is installed.
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Log("cpio not installed; checked with our own reader only")
		return
	}
	cmd := exec.Command("cpio", "-it", "--quiet")
	cmd.Stdin = bytes.NewReader(buf.Bytes())
	out, err := cmd.Output()
	assert.NilError(t, err)
	assert.DeepEqual(t, strings.Fields(string(out)), names)
	dir := t.TempDir()
	cmd = exec.Command("cpio", "-id", "--quiet", "--no-absolute-filenames")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(buf.Bytes())
	out, err = cmd.CombinedOutput()
	assert.NilError(t, err, string(out))
	b, err := os.ReadFile(filepath.Join(dir, "a/b/c.txt"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "odd")
	fi, err := os.Stat(filepath.Join(dir, "init"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o755))
}

func TestCpioWriterRejects(t *testing.T) {
	tests := []struct {
		name string
		fn   func(w *Writer) error
		want string
	}{
		{"dot dot", func(w *Writer) error { return w.Mkdir("../x", 0o755) }, "bad entry name"},
		{"inner dot dot", func(w *Writer) error { return w.Mkdir("a/../../x", 0o755) }, "bad entry name"},
		{"empty", func(w *Writer) error { return w.Mkdir("", 0o755) }, "bad entry name"},
		{"nul", func(w *Writer) error { return w.Mkdir("a\x00b", 0o755) }, "bad entry name"},
		{"duplicate", func(w *Writer) error {
			_ = w.WriteFile("f", 0o644, 0, nil)
			return w.WriteFile("f", 0o644, 0, nil)
		}, "duplicate"},
		{"short data", func(w *Writer) error { return w.WriteFile("f", 0o644, 10, strings.NewReader("abc")) }, "wrote 3 of 10"},
		{"symlink without target", func(w *Writer) error { return w.Symlink("l", "") }, "no target"},
		{"after close", func(w *Writer) error { _ = w.Close(); return w.Mkdir("x", 0o755) }, "after close"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorContains(t, tc.fn(NewWriter(&bytes.Buffer{})), tc.want)
		})
	}
}

func TestCpioReaderRejects(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	assert.NilError(t, w.WriteFile("big", 0o644, 100, bytes.NewReader(make([]byte, 100))))
	assert.NilError(t, w.Close())
	_, err := ReadAll(bytes.NewReader(buf.Bytes()), 50)
	assert.ErrorContains(t, err, "more than 50 bytes")
	_, err = ReadAll(bytes.NewReader(buf.Bytes()[:150]), 1<<20)
	assert.ErrorContains(t, err, "data")
	_, err = ReadAll(strings.NewReader("070707"+strings.Repeat("0", 200)), 1<<20)
	assert.ErrorContains(t, err, "bad magic")
	_, err = ReadAll(strings.NewReader(""), 1<<20)
	assert.ErrorContains(t, err, "header")
}

func loadFixtureDB(t *testing.T) *ModuleDB {
	t.Helper()
	db, err := LoadModuleDB("testdata")
	assert.NilError(t, err)
	return db
}

func TestResolveOrder(t *testing.T) {
	db := loadFixtureDB(t)
	got, err := db.Resolve(DefaultModules())
	assert.NilError(t, err)
	// The recipe's measured load order (spec/vm-recipe.md Q1).
	assert.DeepEqual(t, got, []string{
		"kernel/drivers/virtio/virtio_ring.ko",
		"kernel/drivers/virtio/virtio.ko",
		"kernel/drivers/virtio/virtio_mmio.ko",
		"kernel/drivers/char/virtio_console.ko",
		"kernel/drivers/block/virtio_blk.ko",
		"kernel/net/core/failover.ko",
		"kernel/drivers/net/net_failover.ko",
		"kernel/drivers/net/virtio_net.ko",
		"kernel/fs/overlayfs/overlay.ko",
		"kernel/lib/libcrc32c.ko",
		"kernel/fs/erofs/erofs.ko",
	})

	got, err = db.Resolve([]string{"virtio-rng", "ext4", "virtio_pci"})
	assert.NilError(t, err)
	assert.DeepEqual(t, got, []string{
		"kernel/drivers/virtio/virtio_ring.ko",
		"kernel/drivers/virtio/virtio.ko",
		"kernel/drivers/char/hw_random/virtio-rng.ko",
		"kernel/drivers/virtio/virtio_pci_modern_dev.ko",
		"kernel/drivers/virtio/virtio_pci_legacy_dev.ko",
		"kernel/drivers/virtio/virtio_pci.ko",
	})

	_, err = db.Resolve([]string{"nvidia"})
	assert.ErrorContains(t, err, "neither in testdata/modules.dep nor built in")
}

func TestResolveErrors(t *testing.T) {
	dep, err := ParseModulesDep(strings.NewReader("a.ko: b.ko\nb.ko: a.ko\nc.ko: missing.ko\n"))
	assert.NilError(t, err)
	db, err := NewModuleDB("x", dep, nil)
	assert.NilError(t, err)
	_, err = db.Resolve([]string{"a"})
	assert.ErrorContains(t, err, "cycle a → b → a")
	_, err = db.Resolve([]string{"c"})
	assert.ErrorContains(t, err, "missing (needed by c)")

	for _, bad := range []string{"no colon here\n", ": dep.ko\n", "a.ko:\na.ko:\n", "a b.ko: c.ko\n"} {
		_, err := ParseModulesDep(strings.NewReader(bad))
		assert.Assert(t, err != nil, "%q", bad)
	}
	dep, err = ParseModulesDep(strings.NewReader("x/a.ko:\ny/a.ko.xz:\n"))
	assert.NilError(t, err)
	_, err = NewModuleDB("x", dep, nil)
	assert.ErrorContains(t, err, "both")
}

func TestModuleName(t *testing.T) {
	for in, want := range map[string]string{
		"kernel/drivers/char/hw_random/virtio-rng.ko": "virtio_rng",
		"virtio_net.ko.xz":                            "virtio_net", "erofs.ko.zst": "erofs", "a.ko.gz": "a", "overlay": "overlay",
	} {
		assert.Equal(t, ModuleName(in), want)
	}
}

// fakeModules writes a module tree: plain, xz- and zstd-compressed files.
func fakeModules(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	dep := "kernel/a.ko: kernel/b.ko.xz\nkernel/b.ko.xz: kernel/c.ko.zst\nkernel/c.ko.zst:\n"
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644))
	assert.NilError(t, os.MkdirAll(filepath.Join(dir, "kernel"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "kernel/a.ko"), []byte("module a"), 0o644))
	var xb bytes.Buffer
	xw, err := xz.NewWriter(&xb)
	assert.NilError(t, err)
	_, _ = xw.Write([]byte("module b"))
	assert.NilError(t, xw.Close())
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "kernel/b.ko.xz"), xb.Bytes(), 0o644))
	zw, err := zstd.NewWriter(nil)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "kernel/c.ko.zst"), zw.EncodeAll([]byte("module c"), nil), 0o644))
	assert.NilError(t, zw.Close())
	return dir
}

func readArchive(t *testing.T, p string) map[string]Entry {
	t.Helper()
	f, err := os.Open(p)
	assert.NilError(t, err)
	defer f.Close()
	entries, err := ReadAll(f, 64<<20)
	assert.NilError(t, err)
	m := map[string]Entry{}
	for _, e := range entries {
		m[e.Name] = e
	}
	return m
}

func TestBuild(t *testing.T) {
	ctx := context.Background()
	mods := fakeModules(t)
	agent := filepath.Join(t.TempDir(), "agent")
	assert.NilError(t, os.WriteFile(agent, []byte("\x7fELF agent"), 0o755))
	noDecompress := filepath.Join(t.TempDir(), "config")
	assert.NilError(t, os.WriteFile(noDecompress, []byte("CONFIG_MODULE_COMPRESS_NONE=y\n"), 0o644))
	cache := t.TempDir()

	opts := Options{AgentPath: agent, ModulesDir: mods, Modules: []string{"a"}, KernelConfig: noDecompress, CacheDir: cache,
		Extra: []File{{Path: "/etc/marker", Mode: 0o644, Data: []byte("m")}, {Path: "/bin/sh", Symlink: "busybox"}}}
	p, err := Build(ctx, opts)
	assert.NilError(t, err)
	arc := readArchive(t, p)
	assert.Equal(t, string(arc["init"].Data), "\x7fELF agent")
	assert.Equal(t, arc["init"].Mode, uint32(ModeRegular|0o755))
	assert.Equal(t, arc["dev/console"].Mode, uint32(ModeCharDev|0o600))
	assert.Equal(t, string(arc["etc/marker"].Data), "m")
	assert.Equal(t, string(arc["bin/sh"].Data), "busybox")
	// Decompressed here, because this kernel cannot.
	assert.Equal(t, string(arc["iii/modules/b.ko"].Data), "module b")
	assert.Equal(t, string(arc["iii/modules/c.ko"].Data), "module c")
	manifest, err := agentproto.ParseModuleManifest(string(arc[strings.TrimPrefix(agentproto.ModuleManifestPath, "/")].Data))
	assert.NilError(t, err)
	assert.DeepEqual(t, manifest, []string{"/iii/modules/c.ko", "/iii/modules/b.ko", "/iii/modules/a.ko"})

	// Same inputs: the cached archive, untouched.
	fi1, err := os.Stat(p)
	assert.NilError(t, err)
	p2, err := Build(ctx, opts)
	assert.NilError(t, err)
	assert.Equal(t, p2, p)
	fi2, err := os.Stat(p2)
	assert.NilError(t, err)
	assert.Equal(t, fi1.ModTime(), fi2.ModTime())

	// A kernel that decompresses xz itself gets the xz file as is.
	xzKernel := filepath.Join(t.TempDir(), "config")
	assert.NilError(t, os.WriteFile(xzKernel, []byte("CONFIG_MODULE_COMPRESS_XZ=y\nCONFIG_MODULE_DECOMPRESS=y\n"), 0o644))
	opts.KernelConfig = xzKernel
	p3, err := Build(ctx, opts)
	assert.NilError(t, err)
	assert.Assert(t, p3 != p)
	arc = readArchive(t, p3)
	_, kept := arc["iii/modules/b.ko.xz"]
	assert.Assert(t, kept)
	assert.Equal(t, string(arc["iii/modules/c.ko"].Data), "module c")

	// A changed agent is a different archive.
	assert.NilError(t, os.WriteFile(agent, []byte("\x7fELF agent v2"), 0o755))
	p4, err := Build(ctx, opts)
	assert.NilError(t, err)
	assert.Assert(t, p4 != p3)

	entries, err := os.ReadDir(cache)
	assert.NilError(t, err)
	assert.Check(t, is.Len(entries, 3), "no temporary files left")

	_, err = Build(ctx, Options{AgentPath: agent, ModulesDir: mods, Modules: []string{"zzz"}, CacheDir: cache})
	assert.ErrorContains(t, err, "zzz")
	_, err = Build(ctx, Options{AgentPath: agent})
	assert.ErrorContains(t, err, "required")
}

func TestKernelConfig(t *testing.T) {
	kc := ParseKernelConfig("# comment\nCONFIG_MODULE_DECOMPRESS=y\nCONFIG_MODULE_COMPRESS_ZSTD=y\n# CONFIG_MODULE_COMPRESS_XZ is not set\n")
	assert.Assert(t, kc.CanDecompress("zst"))
	assert.Assert(t, !kc.CanDecompress("xz"))
	assert.Assert(t, !kc.CanDecompress("lz4"))
	assert.Assert(t, !ParseKernelConfig("CONFIG_MODULE_COMPRESS_ZSTD=y").CanDecompress("zst"))
}

// TestBuildRealKernel packs the installed kernel's modules when present.
func TestBuildRealKernel(t *testing.T) {
	dirs, _ := filepath.Glob("/lib/modules/*/modules.dep")
	if len(dirs) == 0 {
		t.Skip("no kernel modules installed (scripts/setup-vm.sh installs them)")
	}
	modDir := filepath.Dir(dirs[len(dirs)-1])
	agent := filepath.Join(t.TempDir(), "agent")
	assert.NilError(t, os.WriteFile(agent, []byte("agent"), 0o755))
	p, err := Build(context.Background(), Options{AgentPath: agent, ModulesDir: modDir, CacheDir: t.TempDir()})
	assert.NilError(t, err)
	arc := readArchive(t, p)
	manifest, err := agentproto.ParseModuleManifest(string(arc["iii/modules.list"].Data))
	assert.NilError(t, err)
	for _, m := range manifest {
		_, ok := arc[strings.TrimPrefix(m, "/")]
		assert.Assert(t, ok, "manifest names %s, not in the archive", m)
	}
	names := make([]string, 0, len(manifest))
	for _, m := range manifest {
		names = append(names, ModuleName(m))
	}
	for _, want := range DefaultModules() {
		db, err := LoadModuleDB(modDir)
		assert.NilError(t, err)
		if _, ok := db.Path(want); ok {
			assert.Assert(t, slices.Contains(names, want), "%s missing from %v", want, names)
		}
	}
}

func FuzzModulesDep(f *testing.F) {
	b, err := os.ReadFile("testdata/modules.dep")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(b), "virtio_net")
	f.Add("a.ko: b.ko\nb.ko: a.ko\n", "a")
	f.Fuzz(func(t *testing.T, dep, want string) {
		parsed, err := ParseModulesDep(strings.NewReader(dep))
		if err != nil {
			return
		}
		db, err := NewModuleDB("d", parsed, []string{"builtin.ko"})
		if err != nil {
			return
		}
		order, err := db.Resolve([]string{want})
		if err != nil {
			return
		}
		// Every module comes after all of its dependencies, once.
		pos := map[string]int{}
		for i, p := range order {
			if _, dup := pos[ModuleName(p)]; dup {
				t.Fatalf("%s twice in %v", p, order)
			}
			pos[ModuleName(p)] = i
		}
		for i, p := range order {
			for _, d := range db.deps[ModuleName(p)] {
				if j, ok := pos[d]; ok && j > i {
					t.Fatalf("%s before its dependency %s", p, d)
				}
			}
		}
	})
}

func FuzzReadCPIO(f *testing.F) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	_ = w.WriteFile("a/b", 0o644, 3, strings.NewReader("abc"))
	_ = w.Symlink("l", "a/b")
	_ = w.Close()
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := ReadAll(bytes.NewReader(data), 1<<20)
		if err != nil {
			return
		}
		// What reads back writes again (names the writer accepts).
		var out bytes.Buffer
		w := NewWriter(&out)
		for _, e := range entries {
			if e.Mode&modeType == ModeRegular {
				_ = w.WriteFile(e.Name, e.Mode, e.Size, bytes.NewReader(e.Data))
			}
		}
		_ = w.Close()
	})
}

func FuzzParseKernelConfig(f *testing.F) {
	f.Add("CONFIG_MODULE_DECOMPRESS=y\nCONFIG_MODULE_COMPRESS_XZ=y\n")
	f.Fuzz(func(t *testing.T, s string) {
		kc := ParseKernelConfig(s)
		for _, fm := range []string{"gz", "xz", "zst"} {
			_ = kc.CanDecompress(fm)
		}
	})
}
