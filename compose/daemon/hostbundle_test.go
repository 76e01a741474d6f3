package daemon

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose/registry"
)

// A registry bundle with runtime: host runs on the host (spec iii-0.26
// §5.2): from a private, owner-only copy of the installed bundle in
// host/<container>/workspace/, scripts.install from its manifest once
// (only when that copy is stale), then the compose file's scripts.run;
// it starts and stops with the project.
func TestHostBundle(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	assert.NilError(t, err)
	reg := t.TempDir()
	src := t.TempDir()
	writeFile(t, src, ManifestFile, "name: hb\nscripts:\n  install: echo installed >> installs.txt\n  start: 'false'\n")
	writeFile(t, src, "data.txt", "data\n")
	writeFile(t, src, "tool.sh", "#!/bin/sh\necho tool\n")
	assert.NilError(t, os.Chmod(filepath.Join(src, "tool.sh"), 0o755))
	var files []registry.PublishFile
	for _, name := range []string{ManifestFile, "data.txt", "tool.sh"} {
		files = append(files, registry.PublishFile{Path: filepath.Join(src, name)})
	}
	_, err = registry.Publish(reg, registry.Publication{Name: "hb", Kind: registry.KindBundle, Version: "1.0.0", Target: testTarget(),
		Files: files, Tags: []string{registry.TagLatest}, Now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)})
	assert.NilError(t, err)

	eng := startEngine(t, "")
	c := eng.caller(t)
	body := "namespace: hbn\ncontainers:\n  hb:\n    worker: package://hb\n    version: '1.0.0'\n    runtime: host\n    scripts:\n      run: \"'" + exe + "' " + goWorkerCommand + "\"\n"
	dir := newProject(t, body)
	cache := t.TempDir()
	startDaemon(t, eng.attach(Options{Cwd: dir, Packages: PackageOptions{Registry: reg, Cache: cache}}))

	var up opResult
	assert.NilError(t, call(t, c, "hbn", "compose::up", nil, &up))
	assert.Equal(t, up.Status, "ok", "%+v", up)
	status := func() (string, int) {
		var st statusReply
		assert.NilError(t, call(t, c, "hbn", "compose::status", nil, &st))
		s, pid, _ := st.of("hb")
		return s, pid
	}
	state, pid := status()
	assert.Equal(t, state, "ready")
	assert.Assert(t, pid > 0)

	ws := filepath.Join(dir, ".iii", "compose", "hbn", "host", "hb", "workspace")
	mode := func(p string) os.FileMode {
		st, err := os.Stat(p)
		assert.NilError(t, err)
		return st.Mode().Perm()
	}
	assert.Equal(t, mode(ws), os.FileMode(0o700))
	assert.Equal(t, mode(filepath.Join(ws, "data.txt")), os.FileMode(0o600))
	assert.Equal(t, mode(filepath.Join(ws, "tool.sh")), os.FileMode(0o700))
	cwd, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "cwd"))
	if err == nil {
		assert.Equal(t, cwd, ws, "it runs in its workspace")
	}
	assert.Equal(t, readText(t, filepath.Join(ws, "installs.txt")), "installed\n")
	entries, err := filepath.Glob(filepath.Join(cache, "hb-1.0.0-*", "installs.txt"))
	assert.NilError(t, err)
	assert.Check(t, is.Len(entries, 0), "the cache entry is never written to")

	// A restart reuses the prepared workspace: no second install.
	var res opResult
	assert.NilError(t, call(t, c, "hbn", "compose::restart", map[string]any{"worker": "hb"}, &res))
	assert.Equal(t, res.Status, "ok", "%+v", res)
	state, pid2 := status()
	assert.Equal(t, state, "ready")
	assert.Check(t, pid2 != pid)
	assert.Equal(t, readText(t, filepath.Join(ws, "installs.txt")), "installed\n")
	// A stale workspace (here: its mark removed) is prepared again.
	assert.NilError(t, os.Remove(filepath.Join(filepath.Dir(ws), hostBundleStamp)))
	assert.NilError(t, call(t, c, "hbn", "compose::restart", map[string]any{"worker": "hb"}, &res))
	assert.Equal(t, res.Status, "ok", "%+v", res)
	assert.Equal(t, readText(t, filepath.Join(ws, "installs.txt")), "installed\n", "a fresh copy, installed once")

	// It stops with the project.
	_, pid = status()
	assert.NilError(t, call(t, c, "hbn", "compose::down", nil, nil))
	state, _ = status()
	assert.Check(t, strings.Contains("stopped exited", state), "state %q", state)
	waitUntil(t, "the worker process is gone", func() bool { return syscall.Kill(pid, 0) != nil })
}
