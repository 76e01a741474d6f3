package daemon

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose/lockfile"
	"github.com/iii-sandbox/iii/compose/packages"
	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/compose/vmworkers"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
)

// vmBundleName is the bundle package the test publishes; the container
// that runs it has the same key, so the worker registers under it.
const vmBundleName = "vmbundle"

// publishNodeBundle publishes vmBundleName 1.0.0, kind bundle, into reg:
// a Node iii-sdk worker whose manifest names no image (runtime.kind
// javascript implies the adapter's node preset), with the pinned SDK packed
// in (a bundle's node_modules never reaches the VM: the copy leaves it out)
// and laid out by the install step.
func publishNodeBundle(t *testing.T, reg, sdk string) {
	t.Helper()
	src := t.TempDir()
	writeFile(t, src, ManifestFile, "name: "+vmBundleName+"\nruntime:\n  kind: javascript\nscripts:\n  install: node "+nodesdk.Unpacker+"\n  start: node worker.mjs\n")
	b, err := os.ReadFile(filepath.Join("testdata", "vmworker", "worker.mjs"))
	assert.NilError(t, err)
	writeFile(t, src, "worker.mjs", string(b))
	assert.NilError(t, nodesdk.WriteWorkerFiles(src, sdk))
	var files []registry.PublishFile
	for _, name := range []string{ManifestFile, "worker.mjs", nodesdk.Unpacker, nodesdk.Pack} {
		files = append(files, registry.PublishFile{Path: filepath.Join(src, name)})
	}
	_, err = registry.Publish(reg, registry.Publication{
		Name: vmBundleName, Kind: registry.KindBundle, Version: "1.0.0", Target: testTarget(),
		Description: "a Node worker run in a VM", Files: files, Tags: []string{registry.TagLatest},
		Now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	})
	assert.NilError(t, err)
}

// TestVMBundleWorker runs a registry bundle (kind bundle, runtime vm by
// default) in a real VM under TCG through the real sandbox-libkrun, with
// the layout a user gets: HOME is the test's, and both the package cache
// (~/.iii/compose/packages) and the adapter's state (~/.iii/sandbox) are
// the defaults under it.
//
//   - compose::up resolves `package://vmbundle` at '^1', locks it as a
//     bundle, installs it into the package cache, starts the adapter and
//     then the bundle in a VM, booted from the node image its manifest's
//     runtime.kind implies; the worker registers in the project namespace;
//   - a host caller invokes the worker's function through the engine and
//     sees the worker's VM environment;
//   - compose::status shows it ready, its log being the adapter's
//     worker.log in ~/.iii/sandbox/workers/<vm_id>/;
//   - compose::remove deletes that state directory.
//
// Serial: it boots a VM under TCG (see TestVMWorkerPathDot), and it sets
// HOME for the adapter the engine's plugin host starts.
func TestVMBundleWorker(t *testing.T) {
	layout, sdk := vmHost(t)
	home := dirs.Short(t, "cvh")
	// The adapter is a subprocess of the engine's plugin host and inherits
	// this process's environment: its defaults land under this HOME.
	t.Setenv("HOME", home)
	assert.NilError(t, os.MkdirAll(filepath.Join(home, ".iii", "cache"), 0o755))
	assert.NilError(t, os.Symlink(layout, filepath.Join(home, ".iii", "cache", "oci")))
	cache, err := packages.CacheDir(func(string) string { return "" }, os.UserHomeDir)
	assert.NilError(t, err)
	assert.Equal(t, cache, filepath.Join(home, ".iii", "compose", "packages"))

	reg := registryCopy(t)
	publishNodeBundle(t, reg, sdk)

	eng, _ := startEngineWith(t, engineSetup{home: home})
	c := eng.caller(t)
	file := "namespace: vmb\nstop_timeout: 20s\ncontainers:\n" +
		"  sandbox-libkrun:\n    worker: package://sandbox-libkrun\n    version: '0.3.1'\n    config_override:\n" +
		"      hypervisor: qemu\n      accel: tcg\n      worker_disk_mb: 512\n      boot_timeout_ms: 300000\n" +
		"  " + vmBundleName + ":\n    worker: package://" + vmBundleName + "\n    version: '^1'\n    startup_timeout: 6m\n" +
		"    environment: { APP_MODE: bundle }\n"
	dir := newProject(t, file)
	td := startDaemon(t, eng.attach(Options{Cwd: dir, Packages: PackageOptions{Registry: reg, Cache: cache}}))

	var up opResult
	assert.NilError(t, callLong(t, c, "vmb", "compose::up", nil, &up))
	assert.Equal(t, up.Status, "ok", "%s\n%s", resultText(up), td.out.String())

	l, err := lockfile.Read(lockfile.PathFor(filepath.Join(dir, "worker-compose.yaml")))
	assert.NilError(t, err)
	e := l.EntryOf(vmBundleName)
	assert.Assert(t, e != nil)
	assert.Equal(t, e.Resolved.Type, registry.KindBundle)
	assert.Equal(t, e.Resolved.Version, "1.0.0")
	entry := filepath.Join(cache, packages.EntryName(vmBundleName, "1.0.0", testTarget()))
	_, err = os.Stat(filepath.Join(entry, ManifestFile))
	assert.NilError(t, err, "the bundle is installed in the package cache")

	var got struct {
		Echo        map[string]any    `json:"echo"`
		Env         map[string]string `json:"env"`
		ComposeFile bool              `json:"compose_file"`
		Cwd         string            `json:"cwd"`
	}
	assert.NilError(t, callLong(t, c, "vmb", vmBundleName+"::probe", map[string]any{"n": 7}, &got))
	assert.Equal(t, got.Echo["n"], float64(7))
	assert.Equal(t, got.Env["III_ISOLATION"], "libkrun")
	assert.Equal(t, got.Env["III_NAMESPACE"], "vmb")
	assert.Equal(t, got.Env["III_WORKER_NAME"], vmBundleName)
	assert.Equal(t, got.Env["APP_MODE"], "bundle")
	assert.Check(t, strings.HasPrefix(got.Env["III_URL"], "ws://10.0.2.2:"), "the engine through the gateway: %s", got.Env["III_URL"])
	assert.Check(t, !got.ComposeFile, "a bundle's VM holds the bundle, not the project")
	assert.Equal(t, got.Cwd, "/workspace")

	vmID := vmworkers.VMID(filepath.Join(dir, "worker-compose.yaml"), "vmb", vmBundleName, func(string) string { return "" })
	stateDir := filepath.Join(home, ".iii", "sandbox", "workers", vmID)
	var st statusReply
	assert.NilError(t, call(t, c, "vmb", "compose::status", nil, &st))
	s, _, lastErr := st.of(vmBundleName)
	assert.Equal(t, s, "ready", "%+v", lastErr)
	found := false
	for _, cs := range st.Containers {
		if cs.Container == vmBundleName {
			found = true
			assert.Check(t, cs.Owned)
			assert.Equal(t, cs.LogPath, filepath.Join(stateDir, "worker.log"))
		}
	}
	assert.Check(t, found, "%+v", st)
	_, err = os.Stat(filepath.Join(stateDir, "disk.ext4"))
	assert.NilError(t, err, "the VM's state lives under the test's HOME")

	var logs logsJSON
	assert.NilError(t, call(t, c, "vmb", "compose::logs", map[string]any{"worker": vmBundleName, "tail": 200}, &logs))
	var text strings.Builder
	for _, e := range logs.Containers[0].Entries {
		text.WriteString(string(e.Stream) + ": " + e.Message + "\n")
	}
	assert.Check(t, is.Contains(text.String(), "stdout: worker "+vmBundleName+" ready in namespace vmb"))
	assert.Check(t, is.Contains(text.String(), "[sandbox-libkrun] install: done"))

	var rm vmRemoveReply
	assert.NilError(t, callLong(t, c, "vmb", "compose::remove", map[string]any{"worker": vmBundleName}, &rm))
	assert.Check(t, is.Len(rm.Warnings, 0), "%+v", rm.Warnings)
	assert.Assert(t, rm.VMState != nil, "%+v", rm)
	assert.Check(t, rm.VMState.Removed)
	assert.Equal(t, rm.VMState.VMID, vmID)
	_, err = os.Stat(stateDir)
	assert.Check(t, errors.Is(err, fs.ErrNotExist), "the VM's state directory is gone")
	assert.NilError(t, call(t, c, "vmb", "compose::status", nil, &st))
	s, _, _ = st.of(vmBundleName)
	assert.Equal(t, s, "", "the removed container is no longer listed: %+v", st)
}

// resultText spells out an operation's per-container results, errors
// included, for a failure message.
func resultText(r opResult) string {
	var b strings.Builder
	b.WriteString(r.Status + ":")
	for _, c := range r.Containers {
		b.WriteString("\n  " + c.Container + " " + c.State)
		if c.Error != nil {
			b.WriteString(" " + c.Error.Code + ": " + c.Error.Message)
		}
	}
	return b.String()
}

// A path:// worker inside a .iii directory never becomes a host root; the
// part of the path above the project does not count.
func TestInDotIII(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		base, dir string
		want      bool
	}{
		{"/p", "/p/workers/api", false},
		{"/p", "/p/.iii/compose/default", true},
		{"/p", "/p", false},
		{"/home/u/.iii/projects/p", "/home/u/.iii/projects/p/api", false},
		{"/home/u/.iii/projects/p", "/home/u/.iii/projects/p/.iii", true},
		{"/p", "/shared/api", false},
		{"/p", "/home/u/.iii/state", true},
		{"/p", "/home/u/.iiix/api", false},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			assert.Equal(t, inDotIII(tc.base, tc.dir), tc.want)
		})
	}
}
