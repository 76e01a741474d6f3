package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/compose/vmworkers"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
)

// When a removed VM container's state cannot be deleted, compose::remove
// still removes the container and returns (and prints) a warning naming
// the container, the adapter, the vm_id and where the state stays: the
// declared adapter fails to start (a bad value in its configuration), or
// the file does not declare it and it does not run. No VM boots here.
func TestRemoveVMStateWarnings(t *testing.T) {
	t.Parallel()
	reg := publishedRegistry(t)
	eng := startEngine(t, "")
	c := eng.caller(t)
	worker := "    worker: path://./w\n    scripts: { run: 'node worker.mjs' }\n"
	tests := []struct {
		name, file, why string
	}{
		{
			name: "adapter fails to start",
			file: "namespace: rw1\ncontainers:\n  sandbox-libkrun:\n    worker: package://sandbox-libkrun\n    version: '0.3.1'\n" +
				"    config_override: { max_concurrent_sandboxes: lots }\n  w:\n" + worker,
			why: "the adapter, started for the clean-up, did not come up (SPAWN_FAILED",
		},
		{
			name: "adapter not declared and not running",
			file: "namespace: rw2\ncontainers:\n  w:\n" + worker + "  other:\n    worker: path://./o\n    scripts: { run: 'sleep 300' }\n",
			why:  `sandbox-libkrun does not run in namespace "rw2" and`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := newProject(t, tc.file, "w", "o")
			writeFile(t, filepath.Join(dir, "w"), ManifestFile, "runtime: { base_image: node }\n")
			ns := strings.Fields(tc.file)[1]
			td := startDaemon(t, eng.attach(Options{Cwd: dir, Packages: PackageOptions{Registry: reg}}))
			var rm vmRemoveReply
			assert.NilError(t, call(t, c, ns, "compose::remove", map[string]any{"worker": "w"}, &rm))
			assert.Equal(t, rm.Removed, "w")
			data, err := os.ReadFile(filepath.Join(dir, "worker-compose.yaml"))
			assert.NilError(t, err)
			assert.Check(t, !strings.Contains(string(data), "path://./w"), "the container left the file")
			vmID := vmworkers.VMID(filepath.Join(dir, "worker-compose.yaml"), ns, "w", func(string) string { return "" })
			assert.Assert(t, is.Len(rm.Warnings, 1), "%+v", rm)
			w := rm.Warnings[0]
			assert.Equal(t, w.Code, CodeVMStateLeft)
			assert.Equal(t, w.Container, "w")
			assert.Equal(t, w.Adapter, "sandbox-libkrun")
			assert.Equal(t, w.VMID, vmID)
			assert.Equal(t, w.StateDir, "~/.iii/sandbox/workers/"+vmID+"/")
			for _, part := range []string{`container "w"`, vmID, "sandbox-libkrun", "~/.iii/sandbox/workers/" + vmID + "/", tc.why} {
				assert.Check(t, is.Contains(w.Message, part))
			}
			assert.Check(t, rm.VMState != nil && !rm.VMState.Removed)
			assert.Check(t, is.Contains(td.out.String(), "compose: warning: VM_STATE_LEFT: "))
		})
	}
}

// A VM container cannot outlive the adapter that boots it in the file:
// removing the adapter first is refused, and the file stays.
func TestRemoveAdapterInUse(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, "")
	c := eng.caller(t)
	body := "namespace: rw3\ncontainers:\n  sandbox-libkrun:\n    worker: package://sandbox-libkrun\n    version: '0.3.1'\n  w:\n    worker: path://./w\n"
	dir := newProject(t, body, "w")
	writeFile(t, filepath.Join(dir, "w"), ManifestFile, "runtime: { base_image: node }\nscripts: { start: node w.js }\n")
	startDaemon(t, eng.attach(Options{Cwd: dir}))
	err := call(t, c, "rw3", "compose::remove", map[string]any{"worker": "sandbox-libkrun"}, nil)
	assert.Equal(t, codeOf(err), compose.CodeUnknownDependency, "%v", err)
	assert.Check(t, is.Contains(messageOf(err), "remove them first"))
	assert.Equal(t, readText(t, filepath.Join(dir, "worker-compose.yaml")), body)
}

// The project token is replaced before the managed engine starts when an
// adapter before 0.3.1 (or of a version Compose cannot read) ran a VM
// worker whose directory holds the compose file; those records go. A run
// by 0.3.1, or of a directory without the compose file, keeps it.
func TestProjectTokenReplacement(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		runs     []state.VMRun
		replaced bool
		left     int
	}{
		{name: "no runs"},
		{name: "0.3.1 ran path://.", runs: []state.VMRun{{VMID: "a", Adapter: "sandbox-libkrun", AdapterVersion: "0.3.1", HoldsComposeFile: true}}, left: 1},
		{name: "0.2.9 ran a subdirectory", runs: []state.VMRun{{VMID: "a", Adapter: "sandbox-libkrun", AdapterVersion: "0.2.9"}}, left: 1},
		{name: "0.2.9 ran path://.", runs: []state.VMRun{{VMID: "a", Container: "app", Adapter: "sandbox-libkrun", AdapterVersion: "0.2.9", HoldsComposeFile: true}}, replaced: true},
		{name: "0.3.0 ran path://.", runs: []state.VMRun{{VMID: "a", Adapter: "sandbox-libkrun", AdapterVersion: "0.3.0", HoldsComposeFile: true}}, replaced: true},
		{name: "unknown version", runs: []state.VMRun{{VMID: "a", Adapter: "sandbox-libkrun", AdapterVersion: "", HoldsComposeFile: true},
			{VMID: "b", Adapter: "sandbox-libkrun", AdapterVersion: "0.3.1", HoldsComposeFile: true}}, replaced: true, left: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			st, err := state.Open(filepath.Join(root, ".iii", "compose", "x"), filepath.Join(root, "worker-compose.yaml"), "x")
			assert.NilError(t, err)
			defer st.Close()
			before, _, err := st.ProjectToken()
			assert.NilError(t, err)
			for _, r := range tc.runs {
				assert.NilError(t, st.RecordVMRun(r))
			}
			out := &syncbuf.Buffer{}
			d := newDaemon(Options{Out: out, Logger: hclog.NewNullLogger(), LookupEnv: func(string) (string, bool) { return "", false }})
			tok, err := d.projectToken(st)
			assert.NilError(t, err)
			if tc.replaced {
				assert.Check(t, tok != before)
				assert.Check(t, is.Contains(out.String(), "compose: replaced the project token"))
			} else {
				assert.Equal(t, tok, before)
				assert.Equal(t, out.String(), "")
			}
			onDisk, _, err := st.ProjectToken()
			assert.NilError(t, err)
			assert.Equal(t, onDisk, tok)
			runs, err := st.LoadVMRuns()
			assert.NilError(t, err)
			assert.Check(t, is.Len(runs.Runs, tc.left))
			d.bgCancel()
		})
	}
}

// Compose reads the operator's III_ENGINE_TOKEN for its own calls only:
// interpolation and worker environments never see it.
func TestEngineTokenHidden(t *testing.T) {
	t.Parallel()
	lookup := withoutEngineToken(func(k string) (string, bool) { return "v-" + k, true })
	_, ok := lookup(envEngineToken)
	assert.Check(t, !ok)
	v, ok := lookup("HOME")
	assert.Check(t, ok && v == "v-HOME")
	d := &Daemon{token: "t"}
	assert.DeepEqual(t, d.withToken(map[string]any{"adapter": "a"}), map[string]any{"adapter": "a", "token": "t"})
	d.token = ""
	assert.DeepEqual(t, d.withToken(map[string]any{"adapter": "a"}), map[string]any{"adapter": "a"})
}
