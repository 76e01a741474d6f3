package router

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
)

// waitFor bounds waits; a hang guard, not a timing assertion.
const waitFor = 30 * time.Second

// testEnv is a real engine on a loopback WebSocket server with the plugin
// host and the router attached, and a Go client connected as a worker.
type testEnv struct {
	*enginetest.Env
	host   *pluginhost.Host
	router *Router
}

func newEnv(t testing.TB, configBinding func() (Binding, bool)) *testEnv {
	t.Helper()
	return newEnvWith(t, configBinding, pluginhost.Options{})
}

// newEnvWith is newEnv with the plugin host's options (its logger and
// finder are the test's).
func newEnvWith(t testing.TB, configBinding func() (Binding, bool), hopts pluginhost.Options) *testEnv {
	t.Helper()
	env := enginetest.Start(t, enginetest.Options{ClientName: "test-caller", CallTimeout: waitFor, Wait: waitFor})
	home := t.TempDir()
	hopts.Logger = env.Log.Named("engine")
	hopts.Finder = pluginhost.Finder{
		Getenv:     func(string) string { return "" },
		HomeDir:    func() (string, error) { return home, nil },
		Executable: func() (string, error) { return filepath.Join(home, "iii"), nil },
	}
	h, err := pluginhost.New(env.Engine, hopts)
	assert.NilError(t, err)
	r, err := New(env.Engine, Options{Logger: env.Log.Named(WorkerName), ConfigBinding: configBinding, Hosted: h.Hosted,
		EngineURL: func() string { return env.URL }})
	assert.NilError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		assert.Check(t, h.Close(ctx))
		r.Close()
		assert.Check(t, len(adapterProcesses()) == 0, "no adapter process outlives the plugin host")
	})
	return &testEnv{Env: env, host: h, router: r}
}

func (te *testEnv) startAdapter(t testing.TB, name, ns string, extra map[string]any) pluginhost.Status {
	t.Helper()
	cfg := map[string]any{"image_allowlist": []string{"python", "shell"}, "state_dir": t.TempDir()}
	for k, v := range extra {
		cfg[k] = v
	}
	raw, err := json.Marshal(cfg)
	assert.NilError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	st, err := te.host.Start(ctx, pluginhost.StartRequest{Adapter: name, Namespace: ns, Path: testBins.Path(t, name), Config: raw})
	assert.NilError(t, err)
	return st
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

// sandboxScript is the Node SDK driver of these tests, as an adapter or
// as a caller of sandbox::* (see the script's header).
var sandboxScript = nodesdk.Script{Path: filepath.Join("testdata", "node", "sandbox.mjs")}

// runNodeCalls runs a Node SDK caller job to completion and returns its
// result lines.
func runNodeCalls(t *testing.T, ne nodesdk.SDK, te *testEnv, calls []map[string]any) []map[string]any {
	t.Helper()
	p := ne.Start(t, sandboxScript, map[string]any{"mode": "call", "url": te.URL, "name": "node-caller", "calls": calls}, waitFor)
	out := make([]map[string]any, 0, len(calls))
	for range calls {
		out = append(out, p.Line(t, waitFor))
	}
	return out
}

// adminHeaders are the handshake headers of a Node SDK worker that presents
// the engine token, as an adapter must.
func (te *testEnv) adminHeaders() map[string]string {
	return map[string]string{"Authorization": "Bearer " + te.Token}
}
