package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/adapter"
	"github.com/iii-sandbox/iii/protocol"
)

// adapterBins builds the adapters once per test binary.
var adapterBins struct {
	sync.Mutex
	dir string
}

// hostdirBin returns a directory holding the sandbox-hostdir example
// adapter (for III_PLUGIN_PATH), sandbox-libkrun and its guest agent.
func hostdirBin(t *testing.T) string {
	t.Helper()
	adapterBins.Lock()
	defer adapterBins.Unlock()
	if adapterBins.dir != "" {
		return adapterBins.dir
	}
	dir, err := os.MkdirTemp("", "compose-adapters-")
	assert.NilError(t, err)
	// sandbox-libkrun and its guest agent side by side, where the adapter
	// looks for the agent: the fixture registry publishes them as
	// package://sandbox-libkrun, and the VM worker tests boot them.
	for _, b := range []struct {
		out, pkg string
		env      []string
	}{
		{"sandbox-hostdir", "github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir/cmd/sandbox-hostdir", nil},
		{"sandbox-libkrun", "github.com/iii-sandbox/iii/plugins/sandbox-libkrun/cmd/sandbox-libkrun", nil},
		{adapter.AgentName(runtime.GOARCH), "github.com/iii-sandbox/iii/plugins/sandbox-libkrun/cmd/iii-guest-agent",
			[]string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=" + runtime.GOARCH}},
	} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Env = append(os.Environ(), b.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b.out, err, out)
		}
	}
	adapterBins.dir = dir
	return dir
}

// sandboxCode is the S-code of a sandbox::* failure.
func sandboxCode(err error) string {
	var eb *protocol.ErrorBody
	if !errors.As(err, &eb) {
		return ""
	}
	if se, ok := contract.FromErrorBody(eb); ok {
		return string(se.Code)
	}
	return eb.Code
}

// The sandbox adapter is a container Compose runs through the engine's
// plugin host (engine::adapters::*) with its merged configuration: the
// engine keeps that configuration as the in-memory entry
// <ns>-<adapter>, which configuration::set cannot write; removing a key
// from config_override keeps its current value; a bad value fails closed
// (S301) until a valid one and compose::restart; restarting the adapter
// ends every sandbox; down stops it.
//
// The engine's config.yaml binds the adapter with a configuration, so the
// engine runs it before Compose attaches; compose::up takes it over (no
// ADAPTER_ALREADY_STARTED) with its layered configuration, whose middle
// layer is what config.yaml gave.
func TestAdapterContainer(t *testing.T) {
	bins := hostdirBin(t)
	t.Parallel()
	state := t.TempDir()
	eng, _ := startEngineWith(t, engineSetup{pluginPath: bins,
		extra: "sandbox:\n  adapter: sandbox-hostdir\n  namespace: sbx\n  config: { image_allowlist: [shell], state_dir: " + state + " }\n"})
	c := eng.caller(t)
	compose := func(override string) string {
		return "namespace: sbx\ncontainers:\n  sandbox-hostdir:\n    worker: package://sandbox-hostdir\n    version: '1.0.0'\n    config_override:\n" + override
	}
	good := "      image_allowlist: [shell]\n      custom_images: { mysh: 'host:/bin/sh' }\n      state_dir: " + state + "\n"
	dir := newProject(t, compose(good))
	file := filepath.Join(dir, "worker-compose.yaml")
	startDaemon(t, eng.attach(Options{Cwd: dir, Packages: PackageOptions{Registry: publishedRegistry(t)}}))

	run := func() (string, error) {
		raw, err := c.Call(context.Background(), "sandbox::run", map[string]any{"image": "shell", "lang": "shell", "code": "echo hi"})
		if err != nil {
			return "", err
		}
		var out struct {
			Stdout string `json:"stdout"`
		}
		assert.NilError(t, json.Unmarshal(raw, &out))
		return out.Stdout, nil
	}
	var list struct {
		Adapters []adapterStatus `json:"adapters"`
	}
	startedBy := func() string {
		var l struct {
			Adapters []struct {
				StartedBy string `json:"started_by"`
			} `json:"adapters"`
		}
		assert.NilError(t, call(t, c, "default", "engine::adapters::list", nil, &l))
		assert.Assert(t, is.Len(l.Adapters, 1))
		return l.Adapters[0].StartedBy
	}
	// Before the project is up, the engine runs the bound adapter itself,
	// with config.yaml's configuration.
	out, err := run()
	assert.NilError(t, err)
	assert.Equal(t, out, "hi\n")
	assert.Equal(t, startedBy(), "config.yaml")

	var up opResult
	assert.NilError(t, call(t, c, "sbx", "compose::up", nil, &up))
	assert.Equal(t, up.Status, "ok", "%+v", up)
	out, err = run()
	assert.NilError(t, err)
	assert.Equal(t, out, "hi\n")
	assert.Equal(t, startedBy(), "call", "Compose took the adapter over")
	raw, err := c.Call(context.Background(), "sandbox::catalog::list", map[string]any{})
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(raw), `"mysh"`), "the project's config_override is in force")

	entry := func() map[string]any {
		var got struct {
			Value map[string]any `json:"value"`
		}
		assert.NilError(t, call(t, c, "default", "configuration::get", map[string]any{"id": "sbx-sandbox-hostdir", "raw": true}, &got))
		return got.Value
	}
	assert.DeepEqual(t, entry(), map[string]any{"image_allowlist": []any{"shell"}, "custom_images": map[string]any{"mysh": "host:/bin/sh"}, "state_dir": state})
	err = call(t, c, "default", "configuration::set", map[string]any{"id": "sbx-sandbox-hostdir", "value": map[string]any{}}, nil)
	assert.Equal(t, codeOf(err), "NOT_REGISTERED", "%v", err)

	// Remove custom_images from config_override: after the restart the
	// entry still has it (removing a key does not restore its default).
	assert.NilError(t, os.WriteFile(file, []byte(compose("      image_allowlist: [shell, mysh]\n      state_dir: "+state+"\n")), 0o644))
	var restarted opResult
	assert.NilError(t, call(t, c, "sbx", "compose::restart", nil, &restarted))
	assert.Equal(t, restarted.Status, "ok", "%+v", restarted)
	assert.Check(t, restarted.Changed)
	assert.DeepEqual(t, entry(), map[string]any{"image_allowlist": []any{"shell", "mysh"}, "custom_images": map[string]any{"mysh": "host:/bin/sh"}, "state_dir": state})
	_, err = c.Call(context.Background(), "sandbox::run", map[string]any{"image": "mysh", "lang": "shell", "code": "echo kept"})
	assert.NilError(t, err, "mysh survived its removal from config_override")

	// A bad value fails closed: the adapter does not start and
	// sandbox::* fail with S301.
	assert.NilError(t, os.WriteFile(file, []byte(compose("      max_concurrent_sandboxes: lots\n")), 0o644))
	assert.NilError(t, call(t, c, "sbx", "compose::restart", nil, &restarted))
	assert.Equal(t, restarted.Status, "failed")
	assert.Equal(t, restarted.Containers[0].Error.Code, "SPAWN_FAILED")
	assert.Check(t, is.Contains(restarted.Containers[0].Error.Message, "max_concurrent_sandboxes"))
	_, err = run()
	assert.Equal(t, sandboxCode(err), "S301", "%v", err)
	// Removing the bad key does not recover: the bad value stays in the
	// entry...
	assert.NilError(t, os.WriteFile(file, []byte(compose("      state_dir: "+state+"\n")), 0o644))
	assert.NilError(t, call(t, c, "sbx", "compose::restart", nil, &restarted))
	assert.Equal(t, restarted.Status, "failed")
	// ...a valid value and compose::restart do.
	assert.NilError(t, os.WriteFile(file, []byte(compose("      max_concurrent_sandboxes: 4\n")), 0o644))
	assert.NilError(t, call(t, c, "sbx", "compose::restart", nil, &restarted))
	assert.Equal(t, restarted.Status, "ok", "%+v", restarted)
	out, err = run()
	assert.NilError(t, err)
	assert.Equal(t, out, "hi\n")

	// compose::restart worker=<adapter> ends every sandbox.
	raw, err = c.Call(context.Background(), "sandbox::create", map[string]any{"image": "shell"})
	assert.NilError(t, err)
	var created struct {
		SandboxID string `json:"sandbox_id"`
	}
	assert.NilError(t, json.Unmarshal(raw, &created))
	var one opResult
	assert.NilError(t, call(t, c, "sbx", "compose::restart", map[string]any{"worker": "sandbox-hostdir"}, &one))
	assert.Equal(t, one.Status, "ok", "%+v", one)
	_, err = c.Call(context.Background(), "sandbox::exec", map[string]any{"sandbox_id": created.SandboxID, "cmd": "true"})
	assert.Check(t, sandboxCode(err) == "S002" || sandboxCode(err) == "S004", "%v", err)

	// Status reports the adapter; down stops it.
	var st statusReply
	assert.NilError(t, call(t, c, "sbx", "compose::status", nil, &st))
	s, pid, _ := st.of("sandbox-hostdir")
	assert.Equal(t, s, "ready")
	assert.Check(t, pid > 0, "the adapter's pid, from the plugin host")
	var down opResult
	assert.NilError(t, call(t, c, "sbx", "compose::down", nil, &down))
	assert.Check(t, down.Containers[0].Changed)
	_, err = run()
	assert.Equal(t, sandboxCode(err), "S301", "%v", err)
	assert.NilError(t, call(t, c, "default", "engine::adapters::list", nil, &list))
	assert.Equal(t, list.Adapters[0].State, "stopped")
}
