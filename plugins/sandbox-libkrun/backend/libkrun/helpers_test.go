//go:build linux || darwin

package libkrun

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ebitengine/purego"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// buildFake compiles testdata/fakekrun.c into a shared library in a fresh
// directory, leaving out the named symbols, and returns its path. Each
// test gets its own file, so its own copy of the fake's state.
func buildFake(t *testing.T, name string, omit ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not installed: the fake libkrun cannot be built")
	}
	dir := t.TempDir()
	out := filepath.Join(dir, name)
	args := []string{"-shared", "-fPIC", "-Wall", "-Werror", "-o", out, filepath.Join("testdata", "fakekrun.c")}
	for _, s := range omit {
		args = append(args, "-DOMIT_"+s)
	}
	b, err := exec.Command(gcc, args...).CombinedOutput()
	assert.NilError(t, err, string(b))
	return out
}

// fake is a loaded fake libkrun and the file its calls are written to.
type fake struct {
	lib *Lib
	log string
	dir string
}

// openFake builds, loads and sets up a fake library: krun_start_enter will
// return startRet; eventfdMode makes krun_get_shutdown_eventfd return a
// real eventfd that krun_start_enter waits on.
func openFake(t *testing.T, startRet int32, eventfdMode bool, omit ...string) *fake {
	t.Helper()
	p := buildFake(t, "libkrun.so.1", omit...)
	lib, err := Open(Options{Path: p})
	assert.NilError(t, err)
	t.Cleanup(func() { _ = lib.Close() })
	f := &fake{lib: lib, dir: t.TempDir()}
	f.log = filepath.Join(f.dir, "calls.log")
	assert.NilError(t, os.WriteFile(f.log, nil, 0o600))
	addr, err := purego.Dlsym(lib.handle, "fakekrun_setup")
	assert.NilError(t, err)
	var setup func(path string, ret int32, mode int32)
	purego.RegisterFunc(&setup, addr)
	mode := int32(0)
	if eventfdMode {
		mode = 1
	}
	setup(f.log, startRet, mode)
	return f
}

// calls returns the fake's call log with temporary paths replaced by
// stable names.
func (f *fake) calls(t *testing.T, replace ...string) string {
	t.Helper()
	b, err := os.ReadFile(f.log)
	assert.NilError(t, err)
	s := string(b)
	r := strings.NewReplacer(replace...)
	return r.Replace(s)
}
