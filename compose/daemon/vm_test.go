package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/compose/vmworkers"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/ocilayout"
)

// vmNodeImage is the Debian-built node preset scripts/build-images.sh puts
// in the local OCI layout.
const vmNodeImage = "docker.io/iiidev/node:latest"

// vmWait bounds a VM worker's first start under TCG: boot, copy, the
// install step, the SDK's connection. A safety net, not a timing.
const vmWait = 8 * time.Minute

// vmHost is what a VM worker test needs from this host: QEMU, a guest
// kernel, the image tools, the node image in the local OCI layout and the
// Node SDK to pack into the worker. It skips otherwise, and under -short.
func vmHost(t *testing.T) (layout, sdk string) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots VMs; skipped with -short")
	}
	if _, err := (&qemu.Config{}).Binary(); err != nil {
		t.Skipf("QEMU is not installed (scripts/setup-vm.sh): %v", err)
	}
	if _, err := qemu.FindKernel("/boot", "/lib/modules", runtime.GOARCH); err != nil {
		t.Skipf("no guest kernel (scripts/setup-vm.sh): %v", err)
	}
	for _, tool := range []string{"mkfs.erofs", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (scripts/setup-vm.sh)", tool)
		}
	}
	home, err := os.UserHomeDir()
	assert.NilError(t, err)
	layout = filepath.Join(home, ".iii", "cache", "oci")
	if e, err := ocilayout.Find(layout, vmNodeImage); err != nil || e == nil {
		t.Skipf("%s is not in the local OCI layout %s (scripts/build-images.sh): %v", vmNodeImage, layout, err)
	}
	return layout, nodesdk.FindModules(t)
}

// vmWorkerDir lays out a Node VM worker in dir: its manifest (base_image,
// install, start), the worker, the install step and the SDK pack.
func vmWorkerDir(t *testing.T, dir, sdk string) {
	t.Helper()
	writeFile(t, dir, ManifestFile, "name: vmtest\nruntime:\n  kind: javascript\n  base_image: "+vmNodeImage+"\nscripts:\n  install: node "+nodesdk.Unpacker+"\n  start: node worker.mjs\n")
	b, err := os.ReadFile(filepath.Join("testdata", "vmworker", "worker.mjs"))
	assert.NilError(t, err)
	writeFile(t, dir, "worker.mjs", string(b))
	assert.NilError(t, nodesdk.WriteWorkerFiles(dir, sdk))
}

// callLong calls fn in ns with a timeout a VM's first start fits in.
func callLong(t *testing.T, c *client.Client, ns, fn string, payload, out any) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), vmWait)
	defer cancel()
	raw, err := c.Call(ctx, fn, payload, client.WithNamespace(ns), client.WithTimeout(vmWait))
	if err != nil {
		return err
	}
	if out != nil {
		assert.NilError(t, json.Unmarshal(raw, out), string(raw))
	}
	return nil
}

type vmRemoveReply struct {
	Removed  string        `json:"removed"`
	VMState  *vmStateJSON  `json:"vm_state"`
	Warnings []warningJSON `json:"warnings"`
}

// TestVMWorkerPathDot runs a path://. worker (its directory holds the
// compose file and Compose's .iii state) in a real VM under TCG through
// the real sandbox-libkrun, which Compose installs from a registry and
// starts through the engine's plugin host with the engine token (the
// operator's III_ENGINE_TOKEN: this engine is attached, not managed):
//
//   - compose::up starts the adapter, then the VM worker (an implicit
//     start_after); it registers in the project namespace and a host
//     caller invokes its function through the engine;
//   - the worker's environment carries no token and no III_CONFIG host
//     path; its configuration arrives as a file; .iii never reaches it;
//   - status and logs read the adapter's worker::status and worker::logs;
//   - vm-workers.json records the adapter version that ran it;
//   - a path:// VM worker outside the compose directory added while the
//     adapter runs fails with SPAWN_FAILED carrying S501; restarting the
//     adapter admits it (the running VM worker is adopted by the new
//     adapter process, its command going on), and compose::up then starts
//     it;
//   - compose::down stops the VMs (their state stays); compose::remove
//     after down starts the declared adapter just for the call, deletes
//     the state directory, and stops the adapter again.
//
// Of the package's three tests that boot VMs under TCG (CPU-bound), this
// one alone runs beside other tests; the other two are serial, and serial
// tests end before parallel ones start, so no two VMs of this package boot
// at once (two at once on the build machines' two cores are not measured
// to fit their timeouts).
func TestVMWorkerPathDot(t *testing.T) {
	t.Parallel()
	layout, sdk := vmHost(t)
	reg := publishedRegistry(t)
	const token = "vm-test-engine-token"
	eng := startEngine(t, "engine_token: "+token+"\n")
	c := callerWithToken(t, eng.url, token)

	sbState := dirs.Short(t, "cvs")
	cache := dirs.Short(t, "cvc")
	assert.NilError(t, os.Symlink(layout, filepath.Join(cache, "oci")))
	file := "namespace: vmp\nstop_timeout: 20s\ncontainers:\n" +
		"  sandbox-libkrun:\n    worker: package://sandbox-libkrun\n    version: '0.3.1'\n    config_override:\n" +
		"      state_dir: " + sbState + "\n      cache_dir: " + cache + "\n      hypervisor: qemu\n      accel: tcg\n" +
		"      worker_disk_mb: 512\n      boot_timeout_ms: 300000\n      image_allowlist: [node]\n" +
		"  vmtest:\n    worker: path://.\n    startup_timeout: 6m\n" +
		"    environment: { APP_MODE: vm, DB_URL: 'postgres://localhost:5432/x' }\n    config_override: { greeting: hi }\n"
	dir := newProject(t, file)
	vmWorkerDir(t, dir, sdk)
	shared := filepath.Join(filepath.Dir(dir), filepath.Base(dir)+"-shared")
	assert.NilError(t, os.MkdirAll(shared, 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(shared) })
	vmWorkerDir(t, shared, sdk)

	env := map[string]string{"III_ENGINE_TOKEN": token, "PATH": os.Getenv("PATH")}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	td := startDaemon(t, eng.attach(Options{Cwd: dir, LookupEnv: lookup, Packages: PackageOptions{Registry: reg}}))

	var up opResult
	assert.NilError(t, callLong(t, c, "vmp", "compose::up", nil, &up))
	assert.Equal(t, up.Status, "ok", "%+v\n%s", up, td.out.String())

	var got struct {
		Echo        map[string]any    `json:"echo"`
		Env         map[string]string `json:"env"`
		Config      string            `json:"config"`
		IIIDir      bool              `json:"iii_dir"`
		ComposeFile bool              `json:"compose_file"`
		Cwd         string            `json:"cwd"`
	}
	assert.NilError(t, callLong(t, c, "vmp", "vmtest::probe", map[string]any{"n": 1}, &got))
	assert.Equal(t, got.Echo["n"], float64(1))
	assert.Equal(t, got.Env["III_ISOLATION"], "libkrun")
	assert.Equal(t, got.Env["III_NAMESPACE"], "vmp")
	assert.Equal(t, got.Env["III_WORKER_NAME"], "vmtest")
	assert.Equal(t, got.Env["APP_MODE"], "vm")
	assert.Check(t, strings.HasPrefix(got.Env["III_URL"], "ws://10.0.2.2:"), "the engine through the gateway: %s", got.Env["III_URL"])
	assert.Equal(t, got.Env["DB_URL"], "postgres://10.0.2.2:5432/x")
	assert.Equal(t, got.Env["III_CONFIG"], "/run/iii/config/vmtest.yaml")
	assert.Check(t, is.Contains(got.Config, "greeting: hi"))
	for k, v := range got.Env {
		assert.Check(t, k != "III_ENGINE_TOKEN" && !strings.Contains(v, token), "the engine token reached the VM in %s", k)
	}
	assert.Check(t, !strings.Contains(got.Config, token))
	assert.Check(t, !got.IIIDir, ".iii (Compose's state, the token among it) is never copied into a VM")
	assert.Check(t, got.ComposeFile, "path://. copies the compose file's directory")
	assert.Equal(t, got.Cwd, "/workspace")

	// Hostile code in the VM reaches the engine only with the worker's
	// narrow credential: no privileged function, no reserved id.
	var atk struct {
		Codes map[string]string `json:"codes"`
	}
	assert.NilError(t, callLong(t, c, "vmp", "vmtest::attack", nil, &atk))
	assert.Equal(t, len(atk.Codes), 5, "%v", atk.Codes)
	for fn, code := range atk.Codes {
		assert.Check(t, code == "UNAUTHORIZED" || code == "FORBIDDEN", "%s from inside the VM answered %q", fn, code)
	}

	vmID := vmworkers.VMID(filepath.Join(dir, "worker-compose.yaml"), "vmp", "vmtest", func(string) string { return "" })
	stateDir := filepath.Join(sbState, "workers", vmID)
	var st statusReply
	assert.NilError(t, call(t, c, "vmp", "compose::status", nil, &st))
	s, _, _ := st.of("vmtest")
	assert.Equal(t, s, "ready")
	for _, cs := range st.Containers {
		if cs.Container == "vmtest" {
			assert.Equal(t, cs.LogPath, filepath.Join(stateDir, "worker.log"))
		}
	}
	var logs logsJSON
	assert.NilError(t, call(t, c, "vmp", "compose::logs", map[string]any{"worker": "vmtest", "tail": 200}, &logs))
	var text strings.Builder
	for _, e := range logs.Containers[0].Entries {
		text.WriteString(string(e.Stream) + ": " + e.Message + "\n")
	}
	assert.Check(t, is.Contains(text.String(), "stdout: worker vmtest ready in namespace vmp"))
	assert.Check(t, is.Contains(text.String(), "[sandbox-libkrun] install: done"))

	store := filepath.Join(dir, ".iii", "compose", "vmp")
	runs, err := os.ReadFile(filepath.Join(store, state.VMWorkersFile))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(runs), `"adapter_version": "0.3.1"`))
	assert.Check(t, is.Contains(string(runs), `"holds_compose_file": true`))

	// A path:// VM worker outside the compose directory, added while the
	// adapter runs: SPAWN_FAILED with the adapter's S501.
	var added struct {
		Up *opResult `json:"up"`
	}
	// Its startup_timeout is vmtest's: a Node worker's first start under
	// TCG outlasts the default minute on a loaded machine.
	assert.NilError(t, callLong(t, c, "vmp", "compose::add", map[string]any{"workers": []any{
		map[string]any{"worker": "path://" + shared, "startup_timeout": "6m"}}}, &added))
	sharedKey := filepath.Base(shared)
	assert.Assert(t, added.Up != nil)
	var failed *containerResult
	for i := range added.Up.Containers {
		if added.Up.Containers[i].Container == sharedKey {
			failed = &added.Up.Containers[i]
		}
	}
	assert.Assert(t, failed != nil && failed.Error != nil, "%+v", added.Up)
	assert.Equal(t, failed.Error.Code, "SPAWN_FAILED")
	assert.Check(t, is.Contains(failed.Error.Message, "S501"))
	assert.Check(t, is.Contains(failed.Error.Message, "compose::restart worker=sandbox-libkrun"))

	// Restarting the adapter reads the new roots; the VM worker it ran
	// goes on in its VM, adopted; compose::up then starts the new one.
	var restarted opResult
	assert.NilError(t, callLong(t, c, "vmp", "compose::restart", map[string]any{"worker": "sandbox-libkrun"}, &restarted))
	assert.Equal(t, restarted.Status, "ok", "%+v", restarted)
	assert.NilError(t, callLong(t, c, "vmp", "vmtest::probe", map[string]any{"n": 2}, &got))
	assert.Equal(t, got.Echo["n"], float64(2))
	assert.NilError(t, call(t, c, "vmp", "compose::logs", map[string]any{"worker": "vmtest", "tail": 200}, &logs))
	text.Reset()
	for _, e := range logs.Containers[0].Entries {
		text.WriteString(e.Message + "\n")
	}
	assert.Check(t, is.Contains(text.String(), "adopted by a new adapter process"), "the VM worker outlived the adapter's restart")
	assert.Check(t, !strings.Contains(text.String(), "install: already done on this disk"), "the VM worker was not started again")
	assert.NilError(t, call(t, c, "vmp", "compose::status", nil, &st))
	s, _, _ = st.of("vmtest")
	assert.Equal(t, s, "ready")
	assert.NilError(t, callLong(t, c, "vmp", "compose::up", nil, &up))
	assert.Equal(t, up.Status, "ok", "%s\n%s", asJSON(up), td.out.String())
	assert.NilError(t, callLong(t, c, "vmp", sharedKey+"::probe", map[string]any{"n": 3}, &got))
	assert.Equal(t, got.Env["III_WORKER_NAME"], sharedKey)

	// Down stops the VMs; their state stays.
	var down opResult
	assert.NilError(t, callLong(t, c, "vmp", "compose::down", nil, &down))
	assert.Equal(t, down.Status, "ok", "%+v", down)
	_, err = os.Stat(filepath.Join(stateDir, "disk.ext4"))
	assert.NilError(t, err, "a stopped VM keeps its disk")

	// Remove after down: the declared adapter starts for the call, the
	// state goes, the adapter stops again.
	var rm vmRemoveReply
	assert.NilError(t, callLong(t, c, "vmp", "compose::remove", map[string]any{"worker": "vmtest"}, &rm))
	assert.Check(t, is.Len(rm.Warnings, 0), "%+v", rm.Warnings)
	assert.Assert(t, rm.VMState != nil)
	assert.Check(t, rm.VMState.Removed)
	assert.Equal(t, rm.VMState.VMID, vmID)
	_, err = os.Stat(stateDir)
	assert.Check(t, errors.Is(err, fs.ErrNotExist), "the VM's state directory is gone")
	var list struct {
		Adapters []adapterStatus `json:"adapters"`
	}
	assert.NilError(t, call(t, c, "default", "engine::adapters::list", nil, &list))
	for _, a := range list.Adapters {
		assert.Check(t, a.State != "running", "the adapter started for the clean-up stopped again: %+v", a)
	}
	assert.NilError(t, callLong(t, c, "vmp", "compose::remove", map[string]any{"worker": sharedKey}, &rm))
	assert.Check(t, rm.VMState != nil && rm.VMState.Removed, "%+v", rm)
}

// TestVMWorkerTokenReplacement: sandbox-libkrun published as 0.2.9 runs a
// path://. worker whose command exits before it registers. The start fails
// with CHILD_EXITED_BEFORE_REGISTRATION carrying the exit status and the
// tail of worker::logs, and vm-workers.json records that 0.2.9 ran a VM
// from the compose file's directory, so the next managed start replaces
// the project token (and forgets the record). Serial: it boots a VM under
// TCG, and TestVMWorkerPathDot is the one that may run beside others.
func TestVMWorkerTokenReplacement(t *testing.T) {
	layout, _ := vmHost(t)
	reg := publishedRegistry(t)
	eng := startEngine(t, "")
	c := eng.caller(t)
	sbState := dirs.Short(t, "cvs")
	cache := dirs.Short(t, "cvc")
	assert.NilError(t, os.Symlink(layout, filepath.Join(cache, "oci")))
	file := "namespace: vmt\ncontainers:\n" +
		"  sandbox-libkrun:\n    worker: package://sandbox-libkrun\n    version: '0.2.9'\n    config_override:\n" +
		"      state_dir: " + sbState + "\n      cache_dir: " + cache + "\n      hypervisor: qemu\n      accel: tcg\n" +
		"      worker_disk_mb: 256\n      boot_timeout_ms: 300000\n" +
		"  app:\n    worker: path://.\n    startup_timeout: 6m\n"
	dir := newProject(t, file)
	writeFile(t, dir, ManifestFile, "name: app\nruntime: { base_image: "+vmNodeImage+" }\nscripts: { start: 'echo leaving before registering; exit 3' }\n")
	td := startDaemon(t, eng.attach(Options{Cwd: dir, Packages: PackageOptions{Registry: reg}}))

	var up opResult
	assert.NilError(t, callLong(t, c, "vmt", "compose::up", nil, &up))
	assert.Equal(t, up.Status, "failed", "%+v", up)
	var res *containerResult
	for i := range up.Containers {
		if up.Containers[i].Container == "app" {
			res = &up.Containers[i]
		}
	}
	assert.Assert(t, res != nil && res.Error != nil, "%+v", up)
	assert.Equal(t, res.Error.Code, compose.CodeChildExitedBeforeRegistration)
	assert.Check(t, is.Contains(res.Error.Message, "status 3"))
	assert.Check(t, is.Contains(res.Error.Message, "leaving before registering"), "the tail of worker::logs")

	assert.NilError(t, callLong(t, c, "vmt", "compose::down", nil, nil))
	assert.NilError(t, td.stop(t))

	st, err := state.Open(filepath.Join(dir, ".iii", "compose", "vmt"), filepath.Join(dir, "worker-compose.yaml"), "vmt")
	assert.NilError(t, err)
	defer st.Close()
	runs, err := st.LoadVMRuns()
	assert.NilError(t, err)
	assert.Assert(t, is.Len(runs.Runs, 1))
	assert.Equal(t, runs.Runs[0].AdapterVersion, "0.2.9")
	assert.Check(t, runs.Runs[0].HoldsComposeFile)
	assert.Equal(t, runs.Runs[0].HostDir, dir)

	before, err := st.ReplaceProjectToken()
	assert.NilError(t, err)
	out := &syncbuf.Buffer{}
	d := newDaemon(Options{Out: out, Logger: hclog.NewNullLogger(), LookupEnv: func(string) (string, bool) { return "", false }})
	defer d.bgCancel()
	tok, err := d.projectToken(st)
	assert.NilError(t, err)
	assert.Check(t, tok != before, "the token a 0.2.9 VM could read is replaced")
	assert.Check(t, is.Contains(out.String(), `sandbox-libkrun 0.2.9 ran VM worker "app" from `+dir))
	runs, err = st.LoadVMRuns()
	assert.NilError(t, err)
	assert.Check(t, is.Len(runs.Runs, 0))
	again, err := d.projectToken(st)
	assert.NilError(t, err)
	assert.Equal(t, again, tok, "replaced once")
}

// asJSON shows v whole, pointers followed, for an assertion's message.
func asJSON(v any) string {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}
