package engineproc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/host/config"
)

// newProject writes a compose file into a fresh directory (symlinks
// resolved, as the paths in the golden files are) and loads it.
func newProject(t *testing.T, text string) (string, *composefile.File) {
	t.Helper()
	dir := t.TempDir()
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	path := filepath.Join(dir, composefile.FileName)
	assert.NilError(t, os.WriteFile(path, []byte(text), 0o644))
	f, err := composefile.Load(path, nil)
	assert.NilError(t, err)
	return dir, f
}

// The generated config of the managed engine: engine.workers as written
// (list shape), the listener of engine.url, the configuration store
// anchored to the project, the grace time and the sandbox binding. The
// engine's own loader accepts it.
func TestEngineConfig(t *testing.T) {
	tests := []struct{ name, file string }{
		{"spec-example", `namespace: shop
engine:
  url: ws://127.0.0.1:49135
  registration_namespace_grace_ms: 2500
  workers:
    configuration:
      adapter: { name: fs, config: { directory: ./config } }
    iii-worker-manager: { host: 127.0.0.1, port: 49135 }
  sandbox:
    adapter: sandbox-libkrun
    namespace: shop
containers: {}
`},
		{"defaults", "namespace: dev\nengine:\n  workers: {}\ncontainers: {}\n"},
		{"engine-expands-its-own", "engine:\n  url: ws://127.0.0.1:49136\n  workers:\n    iii-worker-manager: { host: 127.0.0.1, port: 49136, handshake_timeout_ms: ${HS:5000} }\n    configuration: {}\n  sandbox: { adapter: sandbox-hostdir, namespace: tools }\ncontainers: {}\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir, f := newProject(t, tc.file)
			stateDir := filepath.Join(dir, ".iii", "compose", f.Namespace)
			data, err := Config(f, stateDir)
			assert.NilError(t, err)
			text := strings.ReplaceAll(string(data), dir, "$DIR")
			golden.Assert(t, text, filepath.Join("engine", tc.name+".golden"))
			cfg, err := config.Parse(data, config.ParseOptions{Name: "engine-config.yaml", Dir: stateDir, Lookup: func(string) (string, bool) { return "", false }})
			assert.NilError(t, err)
			assert.Assert(t, cfg.Sandbox != nil)
			assert.Check(t, strings.HasPrefix(cfg.Configuration.Directory, dir))
			assert.Check(t, is.Len(cfg.Listeners, 1))
		})
	}
}

func TestListenerOf(t *testing.T) {
	for _, tc := range []struct {
		raw, host, port, code string
	}{
		{raw: "ws://127.0.0.1:49134", host: "127.0.0.1", port: "49134"},
		{raw: "ws://localhost:8080", host: "127.0.0.1", port: "8080"},
		{raw: "ws://[::1]:9", host: "::1", port: "9"},
		{raw: "ws://127.0.0.1", code: compose.CodeInvalidManagedEngineURL},
		{raw: "::", code: compose.CodeInvalidManagedEngineURL},
	} {
		host, port, err := ListenerOf(tc.raw)
		if tc.code != "" {
			assert.Check(t, is.Equal(compose.CodeOf(err), tc.code), tc.raw)
			continue
		}
		assert.Check(t, is.Nil(err), tc.raw)
		assert.Check(t, is.Equal(host, tc.host), tc.raw)
		assert.Check(t, is.Equal(port, tc.port), tc.raw)
	}
}
