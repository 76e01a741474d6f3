package sdktest_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir"
	"github.com/iii-sandbox/iii/plugins/sdk/sdktest"
	"gotest.tools/v3/assert"
)

func TestMerge(t *testing.T) {
	base := map[string]any{"a": 1, "m": map[string]any{"x": 1, "y": 2}, "l": []any{1}}
	got := sdktest.Merge(base, map[string]any{"m": map[string]any{"y": 3, "z": 4}, "l": []any{2}, "b": true})
	assert.DeepEqual(t, got, map[string]any{"a": 1, "m": map[string]any{"x": 1, "y": 3, "z": 4}, "l": []any{2}, "b": true})
	assert.DeepEqual(t, base, map[string]any{"a": 1, "m": map[string]any{"x": 1, "y": 2}, "l": []any{1}}) // base is not changed
}

// startInProcess serves the hostdir adapter in this process: the suite
// then runs the Manager and the provider under the race detector.
func startInProcess(t *testing.T, config map[string]any) sdktest.Caller {
	t.Helper()
	t.Setenv(hostdir.EnvStateDir, t.TempDir())
	m := hostdir.NewAdapter(hclog.NewNullLogger())
	raw, err := json.Marshal(config)
	assert.NilError(t, err)
	assert.NilError(t, m.Configure(context.Background(), raw))
	t.Cleanup(func() { assert.NilError(t, m.Shutdown(context.Background())) })
	return sdktest.NewAdapterCaller(m)
}

func TestAdapterCaller(t *testing.T) {
	c := startInProcess(t, map[string]any{"image_allowlist": []string{"shell"}})
	ctx := context.Background()

	_, err := c.Call(ctx, "no::such::op", nil)
	assert.ErrorContains(t, err, "unknown sandbox operation")
	_, err = c.Call(ctx, contract.OpExec, json.RawMessage(`{"sandbox_id": "x"}`))
	var se *contract.Error
	assert.Assert(t, errors.As(err, &se))
	assert.Equal(t, se.Code, contract.S001)
	assert.Assert(t, se.DocsURL != "", "the error went through its wire form")

	raw, err := c.Call(ctx, contract.OpCreate, map[string]any{"image": "shell"})
	assert.NilError(t, err)
	var created contract.CreateResponse
	assert.NilError(t, json.Unmarshal(raw, &created))
	ch := c.(sdktest.Channels)
	ref, err := ch.WriteChannel(ctx, []byte("via a channel"))
	assert.NilError(t, err)
	_, err = c.Call(ctx, contract.OpFsWrite, map[string]any{"sandbox_id": created.SandboxID, "path": "/f", "content": ref})
	assert.NilError(t, err)
	_, err = c.Call(ctx, contract.OpFsWrite, map[string]any{"sandbox_id": created.SandboxID, "path": "/g", "content": ref})
	// A channel is read once; the second fs::write is refused as the
	// engine refuses it (adapterjson's decoding of the content ref).
	assert.Assert(t, contract.IsCode(err, contract.S210), "a channel is read once: %v", err)
	raw, err = c.Call(ctx, contract.OpFsRead, map[string]any{"sandbox_id": created.SandboxID, "path": "/f"})
	assert.NilError(t, err)
	var read contract.FsReadResponse
	assert.NilError(t, json.Unmarshal(raw, &read))
	data, err := ch.ReadChannel(ctx, read.Content)
	assert.NilError(t, err)
	assert.Equal(t, string(data), "via a channel")
	assert.Equal(t, *read.Body, "via a channel")
}

// TestSuiteInProcess runs the whole suite against the hostdir adapter
// without go-plugin, showing the suite is transport-agnostic.
func TestSuiteInProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the full conformance suite")
	}
	sdktest.Run(t, sdktest.Target{
		Image: "shell",
		Start: startInProcess,
		DenyPath: func(ctx context.Context, t *testing.T, c sdktest.Caller, id string) string {
			_, err := c.Call(ctx, contract.OpExec, map[string]any{"sandbox_id": id, "argv": []string{"ln", "-s", "/", "escape"}})
			assert.NilError(t, err)
			return "/home/escape/tmp/sdktest-denied"
		},
	})
}
