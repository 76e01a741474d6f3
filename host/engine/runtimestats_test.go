package engine

import (
	"encoding/json"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestRuntimeStats(t *testing.T) {
	te := startEngine(t, Options{})
	priv, ok := te.FunctionPrivileged(DefaultNamespace, FnRuntimeStats)
	assert.Assert(t, ok, "registered")
	assert.Check(t, priv, "privileged")

	stats := func(t *testing.T, rc *rawClient, id string) (out struct {
		Goroutines int   `json:"goroutines"`
		OpenFDs    int   `json:"open_fds"`
		RSSBytes   int64 `json:"rss_bytes"`
	}) {
		t.Helper()
		f := rc.call(id, FnRuntimeStats, nil, `{}`)
		raw, err := json.Marshal(f["result"])
		assert.NilError(t, err)
		var keys map[string]any
		assert.NilError(t, json.Unmarshal(raw, &keys))
		assert.Check(t, is.Len(keys, 3), "exactly the runtime block: %s", raw)
		assert.NilError(t, json.Unmarshal(raw, &out))
		return out
	}

	cases := []struct {
		name    string
		payload string
		code    string // "" = answered
		admin   bool
	}{
		{"without the token", `{}`, CodeUnauthorized, false},
		{"with the token", `{}`, "", true},
		{"no payload", ``, "", true},
		{"not an object", `[1]`, CodeInvalidArgument, true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc := te.dial(t)
			if tc.admin {
				rc = te.dialAdmin(t)
			}
			f := rc.call(string(rune('a'+i)), FnRuntimeStats, nil, tc.payload)
			if tc.code != "" {
				code, _ := errBody(t, f)
				assert.Equal(t, code, tc.code)
				return
			}
			assert.Check(t, f["error"] == nil, "%v", f)
		})
	}

	t.Run("counts what the engine holds", func(t *testing.T) {
		admin := te.dialAdmin(t)
		before := stats(t, admin, "s1")
		assert.Check(t, before.Goroutines > 0 && before.OpenFDs > 0 && before.RSSBytes > 0, "%+v", before)
		// More connections: each holds a socket on both ends (the test
		// dials its own engine) and a read loop in the engine.
		const more = 4
		for range more {
			te.dial(t)
		}
		after := stats(t, admin, "s2")
		assert.Check(t, after.Goroutines >= before.Goroutines+more, "goroutines %d then %d", before.Goroutines, after.Goroutines)
		assert.Check(t, after.OpenFDs >= before.OpenFDs+2*more, "fds %d then %d", before.OpenFDs, after.OpenFDs)
	})

	t.Run("described with its response schema", func(t *testing.T) {
		out := invokeJSON(t, te, FnFunctionsInfo, map[string]any{"function_id": FnRuntimeStats})
		schema, _ := out["response_schema"].(map[string]any)
		assert.DeepEqual(t, schema["required"], []any{"goroutines", "open_fds", "rss_bytes"})
	})
}
