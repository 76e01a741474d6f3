package vmworkers

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/icmd"

	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
)

// TestVMWorkerInstallRerunsOnManifestChange runs a Node VM worker with an
// install step three times on one kept disk: the first start installs, a
// restart with nothing changed skips it, and after package.json is edited
// a new `iii compose --up` runs it again, saying why. An edit to the
// worker's code alone does not.
func TestVMWorkerInstallRerunsOnManifestChange(t *testing.T) {
	layout, nodeModules := vmHost(t)
	iii := buildRegistry(t, t.TempDir())
	sbState, cache := adapterDirs(t, layout, "vi")

	files := map[string][]byte{
		"w/iii.worker.yaml": []byte("name: w\nruntime:\n  kind: javascript\n  base_image: node\n" +
			"scripts:\n  install: node -e 'console.log(\"installing version \" + require(\"./package.json\").version)'\n  start: node worker.mjs\n" +
			"copy:\n  include: [node_modules]\n"),
		"w/package.json": []byte(`{"name":"w","version":"1.0.0","private":true}` + "\n"),
		"w/worker.mjs": []byte(`import { registerWorker } from "iii-sdk";
const iii = registerWorker(process.env.III_URL, { workerName: process.env.III_WORKER_NAME });
iii.registerFunction("w::ping", async () => ({ pong: true }));
`),
	}
	// The SDK is vendored (copy.include), as in the walkthrough.
	assert.NilError(t, filepath.WalkDir(nodeModules, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(nodeModules, path)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		files["w/node_modules/"+filepath.ToSlash(rel)] = b
		return err
	}))
	p := composeproj.Start(t, composeproj.Options{
		III: iii, Files: files,
		Compose: func(port int) string {
			return fmt.Sprintf("stop_timeout: 20s\nengine:\n  url: ws://127.0.0.1:%d\n  workers: {}\n", port) +
				"containers:\n  sandbox-libkrun:\n    worker: package://sandbox-libkrun\n    version: latest\n" +
				"    config_override:\n      state_dir: " + sbState + "\n      cache_dir: " + cache +
				"\n      hypervisor: qemu\n      accel: tcg\n      worker_disk_mb: 512\n      boot_timeout_ms: 300000\n" +
				"  w:\n    worker: path://./w\n    startup_timeout: 8m\n"
		},
	})
	waitReady(t, p, "sandbox-libkrun", "w")

	// count is how many times the worker's log holds s.
	count := func(p *composeproj.Project, s string) int {
		t.Helper()
		return strings.Count(p.MustCall(t, "compose::logs", "worker=w", "tail=1000"), s)
	}
	assert.Equal(t, count(p, "install: first install on this disk"), 1)
	assert.Equal(t, count(p, "installing version 1.0.0"), 1)

	// Nothing the install depends on changed: the disk's record holds.
	assert.NilError(t, os.WriteFile(filepath.Join(p.Dir, "w", "worker.mjs"),
		append(files["w/worker.mjs"], []byte("// an edit to code only\n")...), 0o644))
	// A VM worker's restart boots its VM again: longer than a call's
	// default wait under TCG.
	res := icmd.RunCmd(icmd.Command(p.III, "call", "--port", strconv.Itoa(p.Port), "--timeout-ms", "600000", "compose::restart", "worker=w"),
		icmd.WithEnv(p.Env...), icmd.Dir(p.Dir), icmd.WithTimeout(11*time.Minute))
	res.Assert(t, icmd.Success)
	waitReady(t, p, "w")
	assert.Equal(t, count(p, "install: already done on this disk"), 1)
	assert.Equal(t, count(p, "installing version 1.0.0"), 1, "a code edit did not run the install")

	// Stopped, package.json edited, up again on the kept disk.
	p.Stop(t)
	assert.NilError(t, os.WriteFile(filepath.Join(p.Dir, "w", "package.json"),
		[]byte(`{"name":"w","version":"1.0.1","private":true,"scripts":{"hi":"echo hi"}}`+"\n"), 0o644))
	p = p.Restart(t)
	waitReady(t, p, "sandbox-libkrun", "w")
	logs := p.MustCall(t, "compose::logs", "worker=w", "tail=1000")
	assert.Check(t, is.Contains(logs, "install: inputs changed (package.json): node -e"))
	assert.Check(t, is.Contains(logs, "installing version 1.0.1"), "the install ran on the new package.json")
	assert.Check(t, is.Equal(strings.Count(logs, "installing version 1.0.0"), 1))
	assert.Check(t, is.Equal(strings.Count(logs, "install: first install on this disk"), 1), "the disk was kept")
	p.Stop(t)
}
