package pluginhost

import (
	"encoding/json"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
)

// handoverEnv starts the hostdir example with a sandbox and returns the
// adapter's entry and the sandbox id.
func handoverEnv(t *testing.T, opts Options) (*testEnv, *managed, string) {
	t.Helper()
	te := newEnv(t, opts)
	_, err := te.start(t, map[string]any{"adapter": "sandbox-hostdir", "path": testBins.Path(t, "sandbox-hostdir"), "config": hostdirConfig(t, nil)})
	assert.NilError(t, err)
	created := te.MustCall(t, "sandbox-hostdir::create", map[string]any{"image": "python"})
	m := te.host.entries[key{"sandbox-hostdir", "default"}]
	return te, m, created["sandbox_id"].(string)
}

type callResult struct {
	out json.RawMessage
	err error
}

// inFlight starts a call in the background and waits until the adapter's
// process is serving it.
func inFlight(t *testing.T, te *testEnv, m *managed, fn string, in map[string]any) <-chan callResult {
	t.Helper()
	done := make(chan callResult, 1)
	go func() {
		out, err := te.Call(t, fn, in)
		done <- callResult{out, err}
	}()
	pollUntil(t, fn+" is being served", waitFor, func() bool {
		m.mu.Lock()
		in := m.current
		m.mu.Unlock()
		if in == nil {
			return false
		}
		in.calls.mu.Lock()
		defer in.calls.mu.Unlock()
		return in.calls.n > 0
	})
	return done
}

// TestRestartHandsOver: engine::adapters::restart of a running adapter is
// a hand-over. An exec running on the old process finishes there (it is
// not cut with S301), a call made while the restart is under way waits
// for the new process and succeeds, and the adapter's worker stays
// published, showing the new process.
func TestRestartHandsOver(t *testing.T) {
	te, m, id := handoverEnv(t, Options{})
	pid := te.status(t, "sandbox-hostdir", "default")["pid"]
	workerID := func() string {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.worker.ID()
	}
	before := workerID()

	exec := inFlight(t, te, m, "sandbox-hostdir::exec", map[string]any{"sandbox_id": id, "cmd": "sh", "args": []string{"-c", "sleep 1; echo done"}})
	restart := make(chan callResult, 1)
	go func() {
		out, err := te.Call(t, FnRestart, map[string]any{"adapter": "sandbox-hostdir"})
		restart <- callResult{out, err}
	}()
	pollUntil(t, "the restart began its hand-over", waitFor, m.handingOver)
	held := make(chan callResult, 1)
	go func() {
		out, err := te.Call(t, "sandbox-hostdir::catalog::list", map[string]any{})
		held <- callResult{out, err}
	}()

	ran := <-exec
	assert.NilError(t, ran.err, "the exec in flight was cut by the restart")
	var res struct {
		Stdout string `json:"stdout"`
	}
	assert.NilError(t, json.Unmarshal(ran.out, &res))
	assert.Check(t, is.Equal(res.Stdout, "done\n"))

	r := <-restart
	assert.NilError(t, r.err)
	var st map[string]any
	assert.NilError(t, json.Unmarshal(r.out, &st))
	assert.Check(t, is.Equal(st["state"], "running"))
	assert.Check(t, st["pid"] != pid, "a new process: %v", st)

	h := <-held
	assert.NilError(t, h.err, "a call made during the hand-over waits for the new process")
	assert.Check(t, is.Equal(workerID(), before), "the publication is kept across the hand-over")
	info := te.MustCall(t, "engine::workers::info", map[string]any{"name": "sandbox-hostdir"})
	w := info["worker"].(map[string]any)
	assert.Check(t, is.Equal(w["pid"], st["pid"]), "the worker shows the new process: %v", w)
	// The new process serves calls as before.
	te.MustCall(t, "sandbox-hostdir::catalog::list", map[string]any{})
}

// TestHandoverDrainIsBounded: a call that runs past Options.HandoverDrain
// does not hold the replacement up; it ends with S301, as in a crash.
func TestHandoverDrainIsBounded(t *testing.T) {
	te, m, id := handoverEnv(t, Options{HandoverDrain: 200 * time.Millisecond})
	exec := inFlight(t, te, m, "sandbox-hostdir::exec", map[string]any{"sandbox_id": id, "cmd": "sleep", "args": []string{"20"}})
	out, err := te.Call(t, FnRestart, map[string]any{"adapter": "sandbox-hostdir"})
	assert.NilError(t, err)
	var st map[string]any
	assert.NilError(t, json.Unmarshal(out, &st))
	assert.Check(t, is.Equal(st["state"], "running"))
	ran := <-exec
	assert.Check(t, is.Equal(enginetest.SandboxError(t, ran.err).Code, contract.S301))
}
