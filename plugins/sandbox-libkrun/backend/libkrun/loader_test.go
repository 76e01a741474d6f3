//go:build linux || darwin

package libkrun

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func noEnv(string) string { return "" }

func TestCandidatesOrder(t *testing.T) {
	got := candidates(Options{Home: "/home/u", Dirs: []string{"/a", "/b"}}, "linux")
	var labels []string
	for _, c := range got {
		labels = append(labels, c.label)
	}
	loader := "dynamic loader search (LD_LIBRARY_PATH, /etc/ld.so.cache, system directories) for "
	assert.DeepEqual(t, labels, []string{
		"/home/u/.iii/lib/libkrun.so.1", loader + "libkrun.so.1", "/a/libkrun.so.1", "/b/libkrun.so.1",
		"/home/u/.iii/lib/libkrun.so", loader + "libkrun.so", "/a/libkrun.so", "/b/libkrun.so",
	})
	// The loader gets the bare name; files are checked first.
	assert.Equal(t, got[1].path, "libkrun.so.1")
	assert.Assert(t, !got[1].file && got[0].file)

	mac := candidates(Options{Home: "/Users/u", SkipLoader: true}, "darwin")
	assert.Equal(t, mac[0].path, "/Users/u/.iii/lib/libkrun.1.dylib")
	assert.Equal(t, mac[1].path, "/opt/homebrew/lib/libkrun.1.dylib")
	assert.Equal(t, mac[len(mac)-1].path, "/lib/libkrun.dylib")
}

func TestDefaultDirs(t *testing.T) {
	assert.DeepEqual(t, DefaultDirs("linux"), []string{"/usr/local/lib", "/usr/local/lib64", "/usr/lib64", "/usr/lib", "/lib"})
	assert.Equal(t, DefaultDirs("darwin")[0], "/opt/homebrew/lib")
}

func TestOpenNotFound(t *testing.T) {
	home, d1, d2 := t.TempDir(), t.TempDir(), t.TempDir()
	_, err := Open(Options{Getenv: noEnv, Home: home, Dirs: []string{d1, d2}, SkipLoader: true})
	var e *Error
	assert.Assert(t, errors.As(err, &e))
	assert.Equal(t, e.Code, CodeNotFound)
	names := Names(runtime.GOOS)
	var want []string
	for _, n := range names {
		for _, d := range []string{filepath.Join(home, ".iii", "lib"), d1, d2} {
			want = append(want, filepath.Join(d, n)+": no such file")
		}
	}
	var got []string
	got = append(got, e.Tried...)
	assert.Equal(t, len(got), len(want))
	for _, w := range want {
		assert.Check(t, is.Contains(got, w))
	}
	// The message says how to get the library and how to avoid needing it.
	assert.Check(t, is.Contains(err.Error(), "install libkrun"))
	assert.Check(t, is.Contains(err.Error(), EnvPath))
	assert.Check(t, is.Contains(err.Error(), "places searched:"))
	assert.Check(t, errors.Is(err, &Error{Code: CodeNotFound}))
}

func TestOpenNotALibrary(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string
	}{
		{"text", "this is not a shared library\n"},
		{"empty", ""},
		{"elf header only", "\x7fELF\x02\x01\x01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, Names(runtime.GOOS)[0])
			assert.NilError(t, os.WriteFile(p, []byte(tc.content), 0o755))

			// Found by search: a load error, not "not found".
			_, err := Open(Options{Getenv: noEnv, Home: t.TempDir(), Dirs: []string{dir}, SkipLoader: true})
			var e *Error
			assert.Assert(t, errors.As(err, &e))
			assert.Equal(t, e.Code, CodeLoad)
			assert.Check(t, is.Contains(strings.Join(e.Tried, "\n"), p+": "))

			// Given explicitly.
			_, err = Open(Options{Path: p})
			assert.Assert(t, errors.As(err, &e))
			assert.Equal(t, e.Code, CodeLoad)
			assert.Check(t, is.Contains(err.Error(), "libkrun_path points at "+p))
		})
	}
}

func TestOpenExplicitMissing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nope.so")
	_, err := Open(Options{Getenv: func(k string) string {
		if k == EnvPath {
			return p
		}
		return ""
	}})
	var e *Error
	assert.Assert(t, errors.As(err, &e))
	assert.Equal(t, e.Code, CodeNotFound)
	assert.DeepEqual(t, e.Tried, []string{p + " (from " + EnvPath + "): no such file"})
}

func TestOpenSearchFindsFake(t *testing.T) {
	p := buildFake(t, Names(runtime.GOOS)[1]) // the unversioned name
	dir := filepath.Dir(p)
	lib, err := Open(Options{Getenv: noEnv, Home: t.TempDir(), Dirs: []string{t.TempDir(), dir}, SkipLoader: true})
	assert.NilError(t, err)
	defer lib.Close()
	assert.Equal(t, lib.Path(), p)

	// The environment variable wins over the search.
	lib2, err := Open(Options{Getenv: func(string) string { return p }, Dirs: []string{}, SkipLoader: true})
	assert.NilError(t, err)
	assert.Equal(t, lib2.Path(), p)
	assert.NilError(t, lib2.Close())
}

func TestOpenRequiredSymbolMissing(t *testing.T) {
	p := buildFake(t, "libkrun.so.1", "krun_start_enter")
	_, err := Open(Options{Path: p})
	var e *Error
	assert.Assert(t, errors.As(err, &e))
	assert.Equal(t, e.Code, CodeSymbol)
	assert.Check(t, is.Contains(err.Error(), "krun_start_enter"))

	// Found by search, it is skipped and reported.
	_, err = Open(Options{Getenv: noEnv, Home: t.TempDir(), Dirs: []string{filepath.Dir(p)}, SkipLoader: true})
	assert.Assert(t, errors.As(err, &e))
	assert.Equal(t, e.Code, CodeSymbol)
}

func TestOptionalSymbolsMissing(t *testing.T) {
	// Like a 1.16 library built without BLK: no named ports, no explicit
	// vsock control, no krun_has_feature, no disks.
	omit := []string{"krun_add_console_port_inout", "krun_add_virtio_console_multiport", "krun_disable_implicit_vsock",
		"krun_has_feature", "krun_add_disk", "krun_add_disk2"}
	p := buildFake(t, "libkrun.so.1", omit...)
	lib, err := Open(Options{Path: p})
	assert.NilError(t, err)
	defer lib.Close()

	want := append([]string(nil), omit...)
	sort.Strings(want)
	assert.DeepEqual(t, lib.Missing(), want)
	for _, s := range omit {
		assert.Check(t, !lib.Has(s), s)
	}
	v, ok := lib.MinVersion()
	assert.Assert(t, ok)
	assert.Equal(t, v.String(), "1.16.0")

	facts := lib.Facts()
	assert.Equal(t, facts["libkrun_min_version"], "1.16.0")
	assert.DeepEqual(t, facts["symbols_missing"], want)
	assert.DeepEqual(t, facts["features"], []string{"net"})
	assert.Equal(t, facts["features_source"], "symbols")
	assert.Equal(t, facts["boot_ready"], false)
	assert.DeepEqual(t, facts["boot_missing"], []string{"krun_add_console_port_inout", "krun_add_disk2",
		"krun_add_virtio_console_multiport", "krun_disable_implicit_vsock"})

	err = lib.CheckBoot(true, false)
	var e *Error
	assert.Assert(t, errors.As(err, &e))
	assert.Equal(t, e.Code, CodeTooOld)
	assert.Check(t, is.Contains(err.Error(), "krun_add_console_port_inout (added in libkrun 1.17.0)"))
	assert.Check(t, is.Contains(err.Error(), "krun_add_disk2 (libkrun built without BLK=1"))
}

func TestFactsFullLibrary(t *testing.T) {
	f := openFake(t, -22, false)
	facts := f.lib.Facts()
	assert.Equal(t, facts["libkrun_path"], f.lib.Path())
	assert.Equal(t, facts["libkrun_min_version"], "1.17.3")
	assert.DeepEqual(t, facts["symbols_missing"], []string{})
	assert.DeepEqual(t, facts["features"], []string{"net", "blk"})
	assert.Equal(t, facts["features_source"], "krun_has_feature")
	assert.Equal(t, facts["max_vcpus"], 16)
	assert.Equal(t, facts["nested_virt"], false)
	assert.Equal(t, facts["boot_ready"], true)
	_, has := facts["boot_missing"]
	assert.Assert(t, !has)
	assert.NilError(t, f.lib.CheckBoot(true, true))
}

// TestBindingsPassArguments calls the bound functions directly and reads
// back what the C side received.
func TestBindingsPassArguments(t *testing.T) {
	f := openFake(t, -22, false)
	a := &arena{}
	fn := f.lib.fn
	assert.Equal(t, fn.createCtx(), int32(7))
	assert.Equal(t, fn.setKernel(7, a.str("/k"), uint32(KernelELF), a.strOrNil(""), a.str("")), int32(0))
	assert.Equal(t, fn.setKernel(7, a.str(`we"ird\path`), 5, a.strOrNil("/i"), a.str("a=b c")), int32(0))
	assert.Equal(t, fn.setEnv(7, a.strv(nil)), int32(0))
	assert.Equal(t, fn.setEnv(7, a.strv([]string{"A=1", "", "B=two words"})), int32(0))
	assert.Equal(t, fn.setEnv(7, nil), int32(0))
	assert.Equal(t, fn.initLog(-1, 5, 2, 1), int32(0))
	assert.Equal(t, fn.setVMConfig(7, 255, 1<<31), int32(0))
	assert.Equal(t, fn.setVMConfig(7, 1, 4242), -int32(12)) // -ENOMEM back through int32
	assert.Equal(t, fn.addDisk2(7, a.str("vda"), a.str("/img"), 0, true), int32(0))
	assert.Equal(t, fn.addDisk(7, a.str("vdb"), a.str("/img2"), false), int32(0))
	assert.Equal(t, fn.addSerialConsole(7, -1, -5), int32(0))
	assert.Equal(t, fn.hasFeature(1<<40), int32(1)) // a 64-bit argument arrives whole
	assert.Equal(t, fn.hasFeature(2), int32(0))
	assert.Equal(t, fn.hasFeature(99), -int32(22))
	mac := a.bytes([]byte{0x5a, 0x94, 0xef, 0x00, 0x01, 0xff})
	assert.Equal(t, fn.addNetUnixstream(7, nil, -1, mac, 3, 1), int32(0))
	assert.Equal(t, fn.addNetUnixstream(7, a.str("/run/nic.sock"), -1, mac, 0, 0), int32(0))
	assert.Equal(t, fn.getShutdownEventfd(7), -int32(22))
	assert.Equal(t, fn.freeCtx(4294967295), int32(0))

	assert.Equal(t, f.calls(t), `krun_create_ctx() = 7
krun_set_kernel(7, "/k", 1, NULL, "")
krun_set_kernel(7, "we\"ird\\path", 5, "/i", "a=b c")
krun_set_env(7, [])
krun_set_env(7, ["A=1" "" "B=two words"])
krun_set_env(7, NULL)
krun_init_log(-1, 5, 2, 1)
krun_set_vm_config(7, 255, 2147483648)
krun_set_vm_config(7, 1, 4242)
krun_add_disk2(7, "vda", "/img", 0, true)
krun_add_disk(7, "vdb", "/img2", false)
krun_add_serial_console_default(7, -1, -5)
krun_add_net_unixstream(7, NULL, -1, 5a:94:ef:00:01:ff, 3, 1)
krun_add_net_unixstream(7, "/run/nic.sock", -1, 5a:94:ef:00:01:ff, 0, 0)
krun_get_shutdown_eventfd(7)
krun_free_ctx(4294967295)
`)
}

func TestCloseForgetsBindings(t *testing.T) {
	p := buildFake(t, "libkrun.so.1")
	lib, err := Open(Options{Path: p})
	assert.NilError(t, err)
	assert.NilError(t, lib.Close())
	assert.NilError(t, lib.Close())
	assert.Assert(t, !lib.Has("krun_create_ctx"))
	assert.Assert(t, lib.fn.createCtx == nil)
	var e *Error
	assert.Assert(t, errors.As(lib.CheckBoot(false, false), &e))
	assert.Equal(t, e.Code, CodeTooOld)
}
