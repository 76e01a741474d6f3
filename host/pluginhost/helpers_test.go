package pluginhost

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
)

// waitFor bounds waits in these tests; it is a hang guard, not a timing
// assertion.
const waitFor = 30 * time.Second

// testEnv is a real engine on a loopback WebSocket server with the plugin
// host attached, and a Go client connected to it as a worker.
type testEnv struct {
	*enginetest.Env
	host *Host
}

// isolatedFinder finds nothing by discovery: tests give explicit paths,
// or set up their own directories.
func isolatedFinder(t testing.TB) Finder {
	home := t.TempDir()
	return Finder{
		Getenv:     func(string) string { return "" },
		HomeDir:    func() (string, error) { return home, nil },
		Executable: func() (string, error) { return filepath.Join(home, "bin", "iii"), nil },
	}
}

func newEnv(t testing.TB, opts Options) *testEnv {
	t.Helper()
	env := enginetest.Start(t, enginetest.Options{ClientName: "test-caller", CallTimeout: waitFor, Wait: waitFor})
	if opts.Logger == nil {
		opts.Logger = env.Log.Named("plugin-host")
	}
	if opts.Finder.Getenv == nil {
		opts.Finder = isolatedFinder(t)
	}
	h, err := New(env.Engine, opts)
	assert.NilError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		assert.Check(t, h.Close(ctx))
		assert.Check(t, len(adapterProcesses()) == 0, "no adapter process outlives Close")
	})
	return &testEnv{Env: env, host: h}
}

// hostdirConfig is a working configuration of the hostdir example adapter.
func hostdirConfig(t testing.TB, extra map[string]any) map[string]any {
	cfg := map[string]any{
		"image_allowlist":                 []string{"python", "shell"},
		"state_dir":                       t.TempDir(),
		"max_concurrent_exec_per_sandbox": 64,
	}
	for k, v := range extra {
		cfg[k] = v
	}
	return cfg
}

func codeOf(err error) string { return client.CodeOf(err) }

func (te *testEnv) start(t testing.TB, in map[string]any) (map[string]any, error) {
	t.Helper()
	out, err := te.Call(t, FnStart, in)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	assert.NilError(t, json.Unmarshal(out, &m))
	return m, nil
}

func (te *testEnv) status(t *testing.T, adapter, ns string) map[string]any {
	t.Helper()
	list := te.MustCall(t, FnList, map[string]any{})
	for _, a := range list["adapters"].([]any) {
		s := a.(map[string]any)
		if s["adapter"] == adapter && s["namespace"] == ns {
			return s
		}
	}
	t.Fatalf("adapter %s not listed in %s: %v", adapter, ns, list)
	return nil
}

func pollUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if cond() {
			return poll.Success()
		}
		return poll.Continue("%s", what)
	}, poll.WithTimeout(timeout), poll.WithDelay(10*time.Millisecond))
}
