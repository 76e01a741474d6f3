package daemon

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/lockfile"
	"github.com/iii-sandbox/iii/compose/vmworkers"
	"github.com/iii-sandbox/iii/protocol"
)

// fakeEngine answers configuration::get from a map (unit tests only; the
// integration tests run a real engine).
type fakeEngine struct {
	entries map[string]string
	calls   []string
}

func (f *fakeEngine) Call(_ context.Context, fn string, payload any, _ ...client.CallOption) (json.RawMessage, error) {
	f.calls = append(f.calls, fn)
	if fn != fnConfigGet {
		return nil, &protocol.ErrorBody{Code: "function_not_found", Message: fn}
	}
	id := payload.(map[string]any)["id"].(string)
	v, ok := f.entries[id]
	if !ok {
		return nil, &protocol.ErrorBody{Code: "NOT_FOUND", Message: "no " + id}
	}
	return json.RawMessage(`{"id":"` + id + `","value":` + v + `}`), nil
}

// The adapter's layers: the package's default_config (from the lock) < the entry the
// engine holds < config_override. With no entry the defaults show
// through; a key removed from config_override keeps the entry's value
// (it does not fall back to the default).
func TestAdapterConfigLayers(t *testing.T) {
	t.Parallel()
	d := &Daemon{}
	p := &project{d: d, ns: "shop"}
	decl := &composefile.Container{Key: "sandbox-libkrun", ConfigOverride: map[string]any{"image_allowlist": []any{"python", "node", "myimg"},
		"custom_images": map[string]any{"myimg": "ghcr.io/acme/my-app:1.2.3"}}}
	ref := &vmworkers.Adapter{Name: "sandbox-libkrun", NS: "shop"}
	f := &composefile.File{Namespace: "shop", Dir: "/p", Path: "/p/worker-compose.yaml", Containers: map[string]*composefile.Container{}}

	cfg, err := lockfile.ConfigFromJSON([]byte(`{"auto_install":true,"default_cpus":1,"default_idle_timeout_secs":300,"default_memory_mb":512,"image_allowlist":["python","node"],"max_concurrent_sandboxes":32}`))
	assert.NilError(t, err)
	pi := &pkgInfo{entry: &lockfile.Entry{Resolved: lockfile.Resolved{DefaultConfig: cfg}}}
	d.eng = &fakeEngine{entries: map[string]string{}}
	got, err := p.adapterConfig(context.Background(), f, ref, decl, pi)
	assert.NilError(t, err)
	want, _ := decodeJSON([]byte(`{"auto_install":true,"default_cpus":1,"default_idle_timeout_secs":300,"default_memory_mb":512,
		"image_allowlist":["python","node","myimg"],"max_concurrent_sandboxes":32,"custom_images":{"myimg":"ghcr.io/acme/my-app:1.2.3"}}`))
	assert.DeepEqual(t, got, want)

	// The entry holds what the adapter last started with, including a
	// custom image and a limit the file no longer sets.
	d.eng = &fakeEngine{entries: map[string]string{"shop-sandbox-libkrun": `{"custom_images":{"old":"x:1"},"default_cpus":4,"image_allowlist":["python"]}`}}
	decl.ConfigOverride = map[string]any{"custom_images": map[string]any{"new": "y:2"}}
	got, err = p.adapterConfig(context.Background(), f, ref, decl, pi)
	assert.NilError(t, err)
	want, _ = decodeJSON([]byte(`{"auto_install":true,"default_cpus":4,"default_idle_timeout_secs":300,"default_memory_mb":512,
		"image_allowlist":["python"],"max_concurrent_sandboxes":32,"custom_images":{"old":"x:1","new":"y:2"}}`))
	assert.DeepEqual(t, got, want)

	// A package whose default_config is null has no default layer.
	d.eng = &fakeEngine{entries: map[string]string{}}
	got, err = p.adapterConfig(context.Background(), f, &vmworkers.Adapter{Name: "sandbox-hostdir", NS: "shop"}, &composefile.Container{Key: "sandbox-hostdir"},
		&pkgInfo{entry: &lockfile.Entry{}})
	assert.NilError(t, err)
	assert.DeepEqual(t, got, map[string]any{})
}

func TestWorkerEnvLayers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := filepath.Join(dir, "a.env")
	assert.NilError(t, os.WriteFile(a, []byte("X=from-file\nY=from-file\n"), 0o644))
	lookup := func(k string) (string, bool) {
		v, ok := map[string]string{"PATH": "/bin", "SECRET": "s", "LANG": "C"}[k]
		return v, ok
	}
	c := &composefile.Container{Key: "w", EnvFile: []string{a}, Environment: map[string]string{"Y": "from-env"}}
	env, err := workerEnv(lookup, c, map[string]string{envWorkerName: "w"})
	assert.NilError(t, err)
	assert.DeepEqual(t, env, []string{"III_WORKER_NAME=w", "LANG=C", "PATH=/bin", "X=from-file", "Y=from-env"})

	c.Environment = map[string]string{"III_NAMESPACE": "x"}
	_, err = workerEnv(lookup, c, nil)
	assert.Equal(t, compose.CodeOf(err), compose.CodeReservedEnvOverride)
}
