package daemon

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/adapter"
)

// fixtures are directory registries built once per test binary (TestMain
// removes them). Tests that change a registry work on a copy.
var fixtures struct {
	sync.Mutex
	empty    string // a registry with no package
	registry string // see publishedRegistry
}

// testTarget is the artefact target of the fixtures: this host's.
func testTarget() string { return registry.HostPlatform().Target() }

// emptyRegistry is a directory registry without packages: every
// package:// is PACKAGE_NOT_RESOLVED there.
func emptyRegistry(t *testing.T) string {
	t.Helper()
	fixtures.Lock()
	defer fixtures.Unlock()
	if fixtures.empty == "" {
		dir, err := os.MkdirTemp("", "compose-empty-registry-")
		assert.NilError(t, err)
		fixtures.empty = dir
	}
	return fixtures.empty
}

// publishedRegistry holds, for this host's target:
//
//	sandbox-hostdir 1.0.0          the hostdir example adapter
//	sandbox-libkrun 0.2.9, 0.3.1   the adapter and its guest agent built from this tree
//	                               (default configs differ: max_concurrent_sandboxes 2 and 3)
//	go-worker 1.0.0, 1.1.0         a script that runs this test binary as a Go worker;
//	                               1.1.0 depends on gw-dep ^1 and configuration (engine kind)
//	gw-dep 1.0.0, 1.2.0            the same script
//	configuration 0.24.6           kind engine (no artefact)
//	img 1.0.0                      kind image
//	bnd 1.0.0                      a bundle
func publishedRegistry(t *testing.T) string {
	t.Helper()
	bins := hostdirBin(t)
	fixtures.Lock()
	defer fixtures.Unlock()
	if fixtures.registry != "" {
		return fixtures.registry
	}
	dir, err := os.MkdirTemp("", "compose-registry-")
	assert.NilError(t, err)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	pub := func(p registry.Publication) {
		p.Target, p.Now = testTarget(), now
		if p.Kind == "" {
			p.Kind = registry.KindBinary
		}
		_, err := registry.Publish(dir, p)
		assert.NilError(t, err)
	}
	hostdir := filepath.Join(bins, "sandbox-hostdir")
	pub(registry.Publication{Name: "sandbox-hostdir", Version: "1.0.0", Files: []registry.PublishFile{{Path: hostdir}}, Tags: []string{registry.TagLatest}})
	for _, v := range []struct{ version, max string }{{"0.2.9", "2"}, {"0.3.1", "3"}} {
		pub(registry.Publication{Name: "sandbox-libkrun", Version: v.version, Description: "the adapter built from this tree, under both versions",
			Files:         []registry.PublishFile{{Path: filepath.Join(bins, "sandbox-libkrun")}, {Path: filepath.Join(bins, adapter.AgentName(runtime.GOARCH))}},
			DefaultConfig: json.RawMessage(`{"image_allowlist":["python","node"],"max_concurrent_sandboxes":` + v.max + `}`),
			Tags:          []string{registry.TagLatest}})
	}
	exe, err := os.Executable()
	assert.NilError(t, err)
	script := func(name, version string) string {
		p := filepath.Join(t.TempDir(), name+"-"+version)
		assert.NilError(t, os.WriteFile(p, []byte(fmt.Sprintf("#!/bin/sh\n# %s %s\nexec '%s' %s\n", name, version, exe, goWorkerCommand)), 0o755))
		return p
	}
	pub(registry.Publication{Name: "go-worker", Version: "1.0.0", Files: []registry.PublishFile{{Path: script("go-worker", "1.0.0"), ArchiveName: "go-worker"}},
		DefaultConfig: json.RawMessage(`{"greeting":"hello","level":1}`)})
	pub(registry.Publication{Name: "go-worker", Version: "1.1.0", Files: []registry.PublishFile{{Path: script("go-worker", "1.1.0"), ArchiveName: "go-worker"}},
		DefaultConfig: json.RawMessage(`{"greeting":"hello","level":2}`), Dependencies: map[string]string{"gw-dep": "^1", "configuration": "latest"},
		Tags: []string{registry.TagLatest}})
	for _, v := range []string{"1.0.0", "1.2.0"} {
		pub(registry.Publication{Name: "gw-dep", Version: v, Files: []registry.PublishFile{{Path: script("gw-dep", v), ArchiveName: "gw-dep"}}, Tags: []string{registry.TagLatest}})
	}
	pub(registry.Publication{Name: "bnd", Kind: registry.KindBundle, Version: "1.0.0", Files: []registry.PublishFile{{Path: writeTemp(t, "iii.worker.yaml", "name: bnd\n")}}})
	for name, kind := range map[string]string{"configuration": "engine", "img": "image"} {
		p := filepath.Join(dir, "packages", name, "index.json")
		assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		idx := fmt.Sprintf(`{"name":%q,"kind":%q,"tags":{"latest":"0.24.6"},"versions":{"0.24.6":{"artifacts":{}}}}`, name, kind)
		assert.NilError(t, os.WriteFile(p, []byte(idx), 0o644))
	}
	fixtures.registry = dir
	return dir
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	assert.NilError(t, os.WriteFile(p, []byte(content), 0o644))
	return p
}

// registryCopy is a copy of the published registry a test may change:
// artefacts are hard links (replace them, never write into them), the
// indexes are copies.
func registryCopy(t *testing.T) string {
	t.Helper()
	src := publishedRegistry(t)
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(out, 0o755)
		}
		if strings.HasSuffix(p, ".tar.gz") {
			return os.Link(p, out)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(out, data, 0o644)
	})
	assert.NilError(t, err)
	return dst
}

// removeFixtures deletes the fixture registries (TestMain).
func removeFixtures() {
	fixtures.Lock()
	defer fixtures.Unlock()
	for _, d := range []string{fixtures.empty, fixtures.registry} {
		if d != "" {
			_ = os.RemoveAll(d)
		}
	}
}
