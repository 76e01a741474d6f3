package engine

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
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
		first := stats(t, admin, "s0")
		assert.Check(t, first.Goroutines > 0 && first.OpenFDs > 0 && first.RSSBytes > 0, "%+v", first)
		// The engine runs in this test process: files and goroutines the
		// test holds are the engine's too. Earlier tests' connections may
		// still be closing and move the count, so the difference is taken
		// again (up to 50 rounds) until a round sees nothing else change.
		const files, parked = 3, 5
		var last string
		for try := range 50 {
			before := stats(t, admin, fmt.Sprintf("b%d", try))
			var held []*os.File
			for i := range files {
				f, err := os.Create(filepath.Join(t.TempDir(), fmt.Sprint(try, "-", i)))
				assert.NilError(t, err)
				held = append(held, f)
			}
			release := make(chan struct{})
			var started sync.WaitGroup
			for range parked {
				started.Add(1)
				go func() { started.Done(); <-release }()
			}
			waitfor.Group(t, &started, waitFor, "the parked goroutines to start")
			after := stats(t, admin, fmt.Sprintf("a%d", try))
			close(release)
			for _, f := range held {
				f.Close()
			}
			if after.OpenFDs-before.OpenFDs == files && after.Goroutines-before.Goroutines >= parked {
				return
			}
			last = fmt.Sprintf("fds %d then %d, goroutines %d then %d", before.OpenFDs, after.OpenFDs, before.Goroutines, after.Goroutines)
			runtime.Gosched()
		}
		t.Fatalf("the figures never moved by exactly what the test held: last %s", last)
	})

	t.Run("described with its response schema", func(t *testing.T) {
		out := invokeJSON(t, te, FnFunctionsInfo, map[string]any{"function_id": FnRuntimeStats})
		schema, _ := out["response_schema"].(map[string]any)
		assert.DeepEqual(t, schema["required"], []any{"goroutines", "open_fds", "rss_bytes"})
	})
}
