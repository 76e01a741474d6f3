package enginetest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/host/engine"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The client is connected to the engine for real: its call of a builtin
// goes over the WebSocket and finds the client itself among the workers.
// Everything is closed when the subtest ends (goleak checks).
func TestStart(t *testing.T) {
	var env *Env
	t.Run("running", func(t *testing.T) {
		env = Start(t, Options{ClientName: "enginetest-caller", CallTimeout: 30 * time.Second, Wait: 30 * time.Second})
		assert.Check(t, is.Contains(env.URL, "ws://127.0.0.1:"))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		raw, err := env.Client.Call(ctx, engine.FnWorkersList, map[string]any{"search": "enginetest-caller"})
		assert.NilError(t, err)
		var out struct {
			Workers []map[string]any `json:"workers"`
		}
		assert.NilError(t, json.Unmarshal(raw, &out))
		assert.Assert(t, is.Len(out.Workers, 1))
		// MustCall is the same call, decoded.
		m := env.MustCall(t, engine.FnWorkersList, map[string]any{"search": "enginetest-caller"})
		assert.Check(t, is.Len(m["workers"].([]any), 1))
		_, err = env.Call(t, "nowhere::nothing", nil)
		assert.Check(t, err != nil, "a call of a missing function fails")
		env.Log.Info("a line for the log")
		assert.Check(t, is.Contains(env.Logs.String(), "a line for the log"))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := env.Client.Call(ctx, engine.FnWorkersList, nil)
	assert.Check(t, err != nil, "the client is closed with the test")
}
