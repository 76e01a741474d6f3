package pluginhost

import (
	"context"
	"encoding/json"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
)

// TestRestartReconfiguresInPlace: engine::adapters::restart with a changed
// configuration that the running adapter (the hostdir example, on the
// kit) can take live keeps its process: a sandbox created before is still
// there and the raised limit applies at once. A changed key it cannot
// take live (state_dir) restarts it; so does a restart without a new
// configuration, or with the same one.
func TestRestartReconfiguresInPlace(t *testing.T) {
	te := newEnv(t, Options{})
	state := t.TempDir()
	cfg := func(maxN int, stateDir string) map[string]any {
		return hostdirConfig(t, map[string]any{"max_concurrent_sandboxes": maxN, "state_dir": stateDir})
	}
	st, err := te.start(t, map[string]any{"adapter": "sandbox-hostdir", "path": testBins.Path(t, "sandbox-hostdir"), "config": cfg(1, state)})
	assert.NilError(t, err)
	pid := st["pid"]
	info := te.MustCall(t, "sandbox-hostdir::adapter::info", map[string]any{})
	assert.Check(t, is.Contains(info["capabilities"], contract.CapabilityReconfigure))

	created := te.MustCall(t, "sandbox-hostdir::create", map[string]any{"image": "python"})
	id := created["sandbox_id"].(string)
	_, err = te.Call(t, "sandbox-hostdir::create", map[string]any{"image": "python"})
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S400)

	restart := func(config map[string]any) map[string]any {
		t.Helper()
		in := map[string]any{"adapter": "sandbox-hostdir"}
		if config != nil {
			in["config"] = config
		}
		out, err := te.Call(t, FnRestart, in)
		assert.NilError(t, err)
		var s map[string]any
		assert.NilError(t, json.Unmarshal(out, &s))
		assert.Equal(t, s["state"], "running")
		return s
	}

	// Raised limit: the same process, the sandbox kept, the limit applied.
	st = restart(cfg(2, state))
	assert.Equal(t, st["pid"], pid, "reloaded in place")
	assert.Equal(t, st["restarts"], float64(0))
	assert.Equal(t, st["started_by"], OriginCall)
	exec := te.MustCall(t, "sandbox-hostdir::exec", map[string]any{"sandbox_id": id, "cmd": "echo", "args": []string{"kept"}})
	assert.Equal(t, exec["stdout"], "kept\n")
	te.MustCall(t, "sandbox-hostdir::create", map[string]any{"image": "python"})
	// The engine keeps the configuration it applied, for relaunches and
	// for Compose to read back.
	m := te.host.entries[key{"sandbox-hostdir", "default"}]
	m.mu.Lock()
	assert.Check(t, sameConfig(m.config, mustJSON(t, cfg(2, state))))
	m.mu.Unlock()

	// The same configuration again is a restart the caller asked for.
	st = restart(cfg(2, state))
	assert.Check(t, st["pid"] != pid, "restarted: %v", st)
	assert.Equal(t, st["restarts"], float64(1))
	pid = st["pid"]

	// A key hostdir cannot change live: a new process.
	st = restart(cfg(2, t.TempDir()))
	assert.Check(t, st["pid"] != pid, "restarted: %v", st)
	assert.Equal(t, st["restarts"], float64(2))
	pid = st["pid"]

	// No configuration: a restart, as before.
	st = restart(nil)
	assert.Check(t, st["pid"] != pid, "restarted: %v", st)
}

// TestReconfigureGoAPI: Host.Reconfigure (config.yaml's path) applies a
// change in place only to the adapter started by the origin asked for, and
// says why not otherwise.
func TestReconfigureGoAPI(t *testing.T) {
	te := newEnv(t, Options{})
	ctx := context.Background()
	state := t.TempDir()
	cfg := func(maxN int) json.RawMessage {
		return mustJSON(t, hostdirConfig(t, map[string]any{"max_concurrent_sandboxes": maxN, "state_dir": state}))
	}
	_, _, why, err := te.host.Reconfigure(ctx, "sandbox-hostdir", "", cfg(2), OriginConfig)
	assert.NilError(t, err)
	assert.Check(t, is.Contains(why, "not running"))

	st, err := te.host.Start(ctx, StartRequest{Adapter: "sandbox-hostdir", Path: testBins.Path(t, "sandbox-hostdir"), Config: cfg(1), Origin: OriginConfig})
	assert.NilError(t, err)
	next, ok, why, err := te.host.Reconfigure(ctx, "sandbox-hostdir", "", cfg(3), OriginConfig)
	assert.NilError(t, err)
	assert.Assert(t, ok, why)
	assert.Equal(t, next.PID, st.PID)
	assert.Equal(t, next.StartedBy, OriginConfig)
	info := te.MustCall(t, "sandbox-hostdir::adapter::info", map[string]any{})
	assert.Equal(t, info["capacity"].(map[string]any)["max_sandboxes"], float64(3))

	// Not the origin that started it: left alone.
	_, ok, why, err = te.host.Reconfigure(ctx, "sandbox-hostdir", "", cfg(4), OriginCall)
	assert.NilError(t, err)
	assert.Check(t, !ok)
	assert.Check(t, is.Contains(why, "started by config.yaml"))

	// A change hostdir cannot take live: not done, and the adapter keeps
	// running with what it had.
	bad := mustJSON(t, hostdirConfig(t, map[string]any{"max_concurrent_sandboxes": 5}))
	_, ok, why, err = te.host.Reconfigure(ctx, "sandbox-hostdir", "", bad, OriginConfig)
	assert.NilError(t, err)
	assert.Check(t, !ok)
	assert.Check(t, is.Contains(why, "state_dir"))
	// So is an invalid one; the adapter does not exit over it.
	_, ok, why, err = te.host.Reconfigure(ctx, "sandbox-hostdir", "", json.RawMessage(`{"max_concurrent_sandboxes":"many"}`), OriginConfig)
	assert.NilError(t, err)
	assert.Check(t, !ok)
	assert.Check(t, is.Contains(why, "max_concurrent_sandboxes"))
	info = te.MustCall(t, "sandbox-hostdir::adapter::info", map[string]any{})
	assert.Equal(t, info["capacity"].(map[string]any)["max_sandboxes"], float64(3))
	cur, _ := te.host.Lookup("sandbox-hostdir", "")
	assert.Equal(t, cur.PID, st.PID)
	assert.Equal(t, cur.State, StateRunning)
}
