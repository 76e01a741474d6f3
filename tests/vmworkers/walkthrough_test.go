// Package vmworkers keeps docs/vm-workers.md's walkthrough runnable: it
// writes the files the page shows into a project, runs its sh steps, and
// runs `iii compose --up` with real VMs (QEMU) through the sandbox-libkrun
// adapter built from this tree, then calls the Node and the Python worker.
package vmworkers

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/icmd"

	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/docblocks"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/adapter"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/ocilayout"
)

const docFile = "../../docs/vm-workers.md"

// buildRegistry builds iii, sandbox-libkrun and its guest agent from this
// tree and publishes the adapter into dir/registry, iii's default one.
func buildRegistry(t *testing.T, dir string) string {
	t.Helper()
	iii := filepath.Join(dir, "iii")
	out, err := bins.GoBuild(iii, "github.com/iii-sandbox/iii/cmd/iii", nil)
	assert.NilError(t, err, "%s", out)
	agent := adapter.AgentName(runtime.GOARCH)
	bin, err := bins.SandboxLibkrun("../..", filepath.Join(dir, "adapter"), agent)
	assert.NilError(t, err)
	_, err = registry.Publish(filepath.Join(dir, "registry"), registry.Publication{
		Name: "sandbox-libkrun", Version: adapter.Version, Kind: registry.KindBinary,
		Target: registry.HostPlatform().Target(),
		Files:  []registry.PublishFile{{Path: bin}, {Path: filepath.Join(dir, "adapter", agent)}},
		Tags:   []string{registry.TagLatest},
	})
	assert.NilError(t, err)
	return iii
}

// vmHost skips unless this host can boot the walkthrough's VMs.
func vmHost(t *testing.T) (layout, nodeModules string) {
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
	for _, tool := range []string{"mkfs.erofs", "mkfs.ext4", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (scripts/setup-vm.sh)", tool)
		}
	}
	home, err := os.UserHomeDir()
	assert.NilError(t, err)
	layout = filepath.Join(home, ".iii", "cache", "oci")
	for _, ref := range []string{"docker.io/iiidev/node:latest", "docker.io/iiidev/python:latest"} {
		if e, err := ocilayout.Find(layout, ref); err != nil || e == nil {
			t.Skipf("%s is not in the local OCI layout %s (scripts/build-images.sh): %v", ref, layout, err)
		}
	}
	return layout, nodesdk.FindModules(t)
}

// adapterDirs makes the adapter's state_dir and cache_dir, short (the
// adapter keeps unix sockets under them), the cache pointing at layout's
// images: tag names them.
func adapterDirs(t *testing.T, layout, tag string) (state, cache string) {
	t.Helper()
	state = dirs.Short(t, tag+"s")
	cache = dirs.Short(t, tag+"c")
	assert.NilError(t, os.Symlink(layout, filepath.Join(cache, "oci")))
	return state, cache
}

// TestVMWorkersWalkthrough performs docs/vm-workers.md's walkthrough: the
// page's files, its sh steps, the vendoring of the Node SDK (from the
// pinned copy, offline), then `iii compose --up` with the adapter set up
// for this host (QEMU TCG, the local image layout, private state), and
// calls both workers. The Node worker's vendored node_modules/iii-sdk/dist
// arrives through copy.include; the Python worker's install step unpacks a
// tar.gz with tar and gzip in the python image.
func TestVMWorkersWalkthrough(t *testing.T) {
	layout, nodeModules := vmHost(t)
	doc, err := os.ReadFile(docFile)
	assert.NilError(t, err)
	files, steps, err := docblocks.Parse(docFile, string(doc))
	assert.NilError(t, err)
	for _, f := range []string{"worker-compose.yaml", "hello-node/iii.worker.yaml", "hello-node/worker.mjs", "hello-py/iii.worker.yaml", "hello-py/worker.py", "src/iii_mini/__init__.py"} {
		assert.Assert(t, files[f] != "", "the page shows no %s", f)
	}
	assert.Assert(t, len(steps) > 0)

	iii := buildRegistry(t, t.TempDir())
	sbState, cache := adapterDirs(t, layout, "vw")
	compose := files["worker-compose.yaml"]
	delete(files, "worker-compose.yaml")
	// This host's adapter settings, and room for a first start under TCG.
	const adapterLine = "    worker: package://sandbox-libkrun\n"
	assert.Assert(t, strings.Contains(compose, adapterLine))
	compose = strings.Replace(compose, adapterLine, adapterLine+"    config_override:\n"+
		"      state_dir: "+sbState+"\n      cache_dir: "+cache+"\n      hypervisor: qemu\n      accel: tcg\n"+
		"      worker_disk_mb: 512\n      boot_timeout_ms: 300000\n      image_allowlist: [node, python]\n", 1)
	compose = regexp.MustCompile(`(?m)^(    worker: path://.*\n)`).ReplaceAllString(compose, "${1}    startup_timeout: 8m\n")

	// The page's steps run in a staging copy of the project, with the
	// Node SDK vendored as `npm install --prefix hello-node iii-sdk`
	// would; the project Compose runs is what they leave.
	stage := t.TempDir()
	for name, content := range files {
		f := filepath.Join(stage, filepath.FromSlash(name))
		assert.NilError(t, os.MkdirAll(filepath.Dir(f), 0o755))
		assert.NilError(t, os.WriteFile(f, []byte(content), 0o644))
	}
	assert.NilError(t, os.CopyFS(filepath.Join(stage, "hello-node", "node_modules"), os.DirFS(nodeModules)))
	for _, step := range steps {
		icmd.RunCmd(icmd.Command("/bin/sh", "-ec", step), icmd.Dir(stage)).Assert(t, icmd.Success)
	}
	project := map[string][]byte{}
	assert.NilError(t, filepath.WalkDir(stage, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(stage, path)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		project[filepath.ToSlash(rel)] = b
		return err
	}))
	assert.Assert(t, project["hello-py/vendor/iii_mini.tar.gz"] != nil, "the pack step made the archive")
	assert.Assert(t, project["hello-node/node_modules/iii-sdk/package.json"] != nil)

	p := composeproj.Start(t, composeproj.Options{
		III: iii, Files: project,
		Compose: func(port int) string {
			return fmt.Sprintf("stop_timeout: 20s\nengine:\n  url: ws://127.0.0.1:%d\n  workers: {}\n", port) + compose
		},
	})
	waitReady(t, p, "sandbox-libkrun", "hello-node", "hello-py")

	for _, w := range []struct{ fn, runtime string }{{"hello-node::greet", "from node v"}, {"hello-py::greet", "from python 3."}} {
		out := p.MustCall(t, w.fn, "name=ada")
		var got struct{ Greeting, Isolation string }
		assert.NilError(t, json.Unmarshal([]byte(out), &got), out)
		assert.Check(t, is.Contains(got.Greeting, "hello ada "+w.runtime), w.fn)
		assert.Equal(t, got.Isolation, "libkrun", w.fn)
	}
	logs := p.MustCall(t, "compose::logs", "worker=hello-node", "tail=200")
	assert.Check(t, is.Contains(logs, "workspace: copied"))
	assert.Check(t, !strings.Contains(logs, "left out"), "copy.include brought node_modules in: nothing was left out")
	pyLogs := p.MustCall(t, "compose::logs", "worker=hello-py", "tail=200")
	assert.Check(t, is.Contains(pyLogs, "install: done"), "the install step unpacked the archive")
	p.Stop(t)
}

// waitReady is composeproj's WaitReady with room for VMs' first start
// under TCG.
func waitReady(t *testing.T, p *composeproj.Project, containers ...string) {
	t.Helper()
	waitReadyNS(t, p, "default", containers...)
}
