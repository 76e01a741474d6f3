package vmworkers

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
)

// TestVMWorkerInstallCache runs a Node VM worker with an install step as a
// new worker (its state directory deleted) four times over one adapter
// state_dir: the first installs and keeps its disk in the install cache;
// the second, with the same install inputs but a changed workspace, starts
// from a copy of that disk (the install's stamp is the first one's, the
// install does not run) and its copy removes the file the workspace no
// longer has; after package.json changes the third misses and installs;
// a project in another namespace with the same worker never gets this
// project's disk.
func TestVMWorkerInstallCache(t *testing.T) {
	layout, nodeModules := vmHost(t)
	iii := buildRegistry(t, t.TempDir())
	sbState, cache := adapterDirs(t, layout, "vc")

	files := map[string][]byte{
		// The install stamps the disk outside /workspace, where only a
		// disk that went through it has the stamp.
		// The SDK arrives packed and the install step lays it out, as
		// in the C2 benchmark: a copy of its 4,500 files would cost
		// every start tens of seconds under TCG.
		"w/iii.worker.yaml": []byte("name: w\nruntime:\n  kind: javascript\n  base_image: node\n" +
			"scripts:\n  install: node unpack.mjs && mkdir -p /opt/w && date +%s%N > /opt/w/stamp && echo install-step-ran\n  start: node worker.mjs\n"),
		"w/package.json": []byte(`{"name":"w","version":"1.0.0","private":true}` + "\n"),
		"w/gone.txt":     []byte("only in the first workspace\n"),
		"w/worker.mjs": []byte(`import { readFileSync, readdirSync } from "node:fs";
import { registerWorker } from "iii-sdk";
const { III_URL, III_WORKER_NAME: name, III_NAMESPACE: namespace } = process.env;
const iii = registerWorker(III_URL, { workerName: name });
// iii-sdk 0.22.1 has no namespace option: register it ourselves.
iii.trigger({ function_id: "engine::workers::register", payload: { name, namespace }, action: { type: "void" } });
iii.registerFunction("w::probe", async () => ({
  stamp: readFileSync("/opt/w/stamp", "utf8").trim(),
  files: readdirSync("/workspace").sort(),
}));
`),
	}
	packed := t.TempDir()
	assert.NilError(t, nodesdk.WriteWorkerFiles(packed, nodeModules))
	for _, n := range []string{nodesdk.Unpacker, nodesdk.Pack} {
		b, err := os.ReadFile(filepath.Join(packed, n))
		assert.NilError(t, err)
		files["w/"+n] = b
	}
	compose := func(ns string) func(int) string {
		return func(port int) string {
			return fmt.Sprintf("namespace: %s\nstop_timeout: 20s\nengine:\n  url: ws://127.0.0.1:%d\n  workers: {}\n", ns, port) +
				"containers:\n  sandbox-libkrun:\n    worker: package://sandbox-libkrun\n    version: latest\n" +
				"    config_override:\n      state_dir: " + sbState + "\n      cache_dir: " + cache +
				"\n      hypervisor: qemu\n      accel: tcg\n      worker_disk_mb: 512\n      boot_timeout_ms: 300000\n" +
				"  w:\n    worker: path://./w\n    startup_timeout: 8m\n"
		}
	}
	type probe struct {
		Stamp string
		Files []string
	}
	call := func(p *composeproj.Project) probe {
		t.Helper()
		out := p.MustCall(t, "w::probe")
		var got probe
		assert.NilError(t, json.Unmarshal([]byte(out), &got), out)
		assert.Assert(t, got.Stamp != "", out)
		return got
	}
	// logs are the worker's log lines, in namespace ns.
	logs := func(p *composeproj.Project, ns string) string {
		t.Helper()
		res := p.CallNS(ns, "compose::logs", "worker=w", "tail=1000")
		assert.Assert(t, res.ExitCode == 0, res.Combined())
		var got struct {
			Containers []struct {
				Entries []struct{ Message string } `json:"entries"`
			} `json:"containers"`
		}
		assert.NilError(t, json.Unmarshal([]byte(res.Stdout()), &got), res.Stdout())
		var lines []string
		for _, c := range got.Containers {
			for _, e := range c.Entries {
				lines = append(lines, e.Message)
			}
		}
		return strings.Join(lines, "\n")
	}
	// forget deletes the worker's state directory, Compose (and the
	// adapter) stopped: the next start is a new worker's.
	forget := func() {
		t.Helper()
		des, err := os.ReadDir(filepath.Join(sbState, "workers"))
		assert.NilError(t, err)
		assert.Assert(t, len(des) > 0)
		for _, de := range des {
			assert.NilError(t, os.RemoveAll(filepath.Join(sbState, "workers", de.Name())))
		}
	}

	p := composeproj.Start(t, composeproj.Options{III: iii, Files: files, Compose: compose("default")})
	waitReady(t, p, "sandbox-libkrun", "w")
	l := logs(p, "default")
	assert.Check(t, is.Contains(l, "install cache: no cached disk for these install inputs"))
	assert.Check(t, is.Contains(l, "install: first install on this disk"))
	assert.Check(t, is.Contains(l, `install cache: kept this disk for a new worker "w" in namespace "default"`))
	first := call(p)
	assert.Check(t, is.Contains(first.Files, "gone.txt"))
	p.Stop(t)

	// A new worker, same install, a workspace that lost gone.txt.
	forget()
	assert.NilError(t, os.Remove(filepath.Join(p.Dir, "w", "gone.txt")))
	assert.NilError(t, os.WriteFile(filepath.Join(p.Dir, "w", "new.txt"), []byte("new\n"), 0o644))
	p = p.Restart(t)
	waitReady(t, p, "sandbox-libkrun", "w")
	l = logs(p, "default")
	assert.Check(t, is.Contains(l, "started from the cached disk of this install"))
	assert.Check(t, is.Contains(l, "install: already done on this disk"))
	assert.Check(t, !strings.Contains(l, "install-step-ran"), "the install step did not run:\n%s", l)
	second := call(p)
	assert.Check(t, is.Equal(second.Stamp, first.Stamp), "the disk is the cached one")
	assert.Check(t, !slices.Contains(second.Files, "gone.txt"), "the copy removed what the workspace no longer has: %v", second.Files)
	assert.Check(t, is.Contains(second.Files, "new.txt"))
	p.Stop(t)

	// A new worker whose manifest changed: the cache misses, it installs.
	forget()
	assert.NilError(t, os.WriteFile(filepath.Join(p.Dir, "w", "package.json"),
		[]byte(`{"name":"w","version":"1.0.1","private":true}`+"\n"), 0o644))
	p = p.Restart(t)
	waitReady(t, p, "sandbox-libkrun", "w")
	l = logs(p, "default")
	assert.Check(t, is.Contains(l, "install cache: no cached disk for these install inputs"))
	assert.Check(t, is.Contains(l, "install: first install on this disk"))
	third := call(p)
	assert.Check(t, third.Stamp != first.Stamp, "the install ran again")
	p.Stop(t)

	// Another project, namespace other, the same worker and files, the
	// same adapter state: it never starts from the first project's disk.
	other := map[string][]byte{}
	for k, v := range files {
		other[k] = v
	}
	q := composeproj.Start(t, composeproj.Options{III: iii, Files: other, Compose: compose("other")})
	waitReadyNS(t, q, "other", "sandbox-libkrun", "w")
	l = logs(q, "other")
	assert.Check(t, is.Contains(l, "install: first install on this disk"))
	assert.Check(t, !strings.Contains(l, "started from the cached disk"))
	assert.Check(t, is.Contains(l, `kept this disk for a new worker "w" in namespace "other"`))
	des, err := os.ReadDir(filepath.Join(sbState, "worker-disks"))
	assert.NilError(t, err)
	assert.Check(t, is.Len(des, 2), "one entry per namespace and worker")
	q.Stop(t)
}

// waitReadyNS is waitReady for a project whose Compose serves in ns.
func waitReadyNS(t *testing.T, p *composeproj.Project, ns string, containers ...string) {
	t.Helper()
	p.WaitReadyNS(t, ns, 12*time.Minute, time.Second, containers...)
}
