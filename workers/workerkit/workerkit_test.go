package workerkit

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/host/configuration"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestEnvFrom(t *testing.T) {
	e := EnvFrom(envOf(nil), "state")
	assert.DeepEqual(t, e, Env{URL: DefaultURL, WorkerName: "state"})
	assert.Equal(t, e.EntryID(), "state")
	e = EnvFrom(envOf(map[string]string{EnvURL: "ws://h:1", EnvNamespace: "shop", EnvWorkerName: "kv",
		EnvConfig: "/c.yaml", EnvConfigName: "kv-config", EnvComposeDir: "/proj"}), "state")
	assert.DeepEqual(t, e, Env{URL: "ws://h:1", Namespace: "shop", WorkerName: "kv", ConfigPath: "/c.yaml", ConfigName: "kv-config", ComposeDir: "/proj"})
	assert.Equal(t, e.EntryID(), "kv-config")
	assert.Equal(t, e.BaseDir(), "/proj")
}

func TestConfigFile(t *testing.T) {
	tests := []struct{ name, yaml, want, err string }{
		{"mapping", "a: 1\nb: [x, true]\n", `{"a":1,"b":["x",true]}`, ""},
		{"json is yaml", `{"adapter":{"name":"kv"}}`, `{"adapter":{"name":"kv"}}`, ""},
		{"placeholders", "n: '${WK_N:5}'\ns: 'at ${WK_DIR}/x'\nu: '${WK_UNSET}'\nb: '${WK_B:false}'\n",
			`{"b":false,"n":5,"s":"at /data/x","u":"${WK_UNSET}"}`, ""},
		{"empty", "", `null`, ""},
		{"bad yaml", "a: [", "", "configuration"},
		{"non-string key", "1: a\n", "", "mapping key 1 is not a string"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "c.yaml")
			assert.NilError(t, os.WriteFile(path, []byte(tc.yaml), 0o600))
			k, err := New(Spec{Name: "wk", Logger: hclog.NewNullLogger(),
				Getenv: envOf(map[string]string{EnvConfig: path, "WK_DIR": "/data"})})
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, string(k.FileConfig()), tc.want)
		})
	}
	k, err := New(Spec{Name: "wk", Logger: hclog.NewNullLogger(), Getenv: envOf(nil), DefaultConfig: json.RawMessage(`{"d":"${WK_D:x}"}`)})
	assert.NilError(t, err)
	assert.Equal(t, string(k.FileConfig()), `{"d":"x"}`, "without III_CONFIG: the default config")
	_, err = New(Spec{Name: "wk", Logger: hclog.NewNullLogger(), Getenv: envOf(map[string]string{EnvConfig: "/nonexistent/c.yaml"})})
	assert.ErrorContains(t, err, "III_CONFIG")
}

func TestMergeJSON(t *testing.T) {
	tests := []struct{ base, over, want string }{
		{`{"a":1,"m":{"x":1,"y":2}}`, `{"m":{"y":3},"b":2}`, `{"a":1,"b":2,"m":{"x":1,"y":3}}`},
		{`{"l":[1,2]}`, `{"l":[3]}`, `{"l":[3]}`},
		{`{"adapter":{"name":"kv","config":{"store_method":"file_based"}}}`, `{"adapter":{"name":"redis"}}`, `{"adapter":{"name":"redis"}}`},
		{`{"adapter":{"name":"kv","config":{"a":1}}}`, `{"adapter":{"config":{"b":2}}}`, `{"adapter":{"config":{"a":1,"b":2},"name":"kv"}}`},
		{`null`, `{"a":1}`, `{"a":1}`},
		{`{"a":1}`, `null`, `null`},
	}
	for _, tc := range tests {
		got, err := MergeJSON(json.RawMessage(tc.base), json.RawMessage(tc.over))
		assert.NilError(t, err)
		assert.Equal(t, string(got), tc.want, "%s < %s", tc.base, tc.over)
	}
}

// TestWatchConfig runs a worker under MainContext against a real engine
// with the configuration worker: its entry's changes reach apply, merged
// over the file, and cancelling the context ends it cleanly.
func TestWatchConfig(t *testing.T) {
	env := enginetest.Start(t, enginetest.Options{ClientName: "admin", CallTimeout: 10 * time.Second, Wait: waitfor.Default})
	cw := configuration.New(configuration.Options{Store: configuration.NewFSStore(configuration.FSOptions{Dir: t.TempDir()})})
	assert.NilError(t, cw.Open(context.Background()))
	assert.NilError(t, cw.Attach(env.Engine))
	t.Cleanup(cw.Close)

	path := filepath.Join(t.TempDir(), "c.yaml")
	assert.NilError(t, os.WriteFile(path, []byte("a: 1\nm: {x: 1}\n"), 0o600))
	applied := make(chan string, 16)
	ready := make(chan *Kit, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	go func() {
		exit <- MainContext(ctx, Spec{Name: "wk", Logger: hclog.NewNullLogger(),
			Getenv: envOf(map[string]string{EnvURL: env.URL, EnvWorkerName: "wk-1", EnvConfigName: "wk", EnvConfig: path})},
			func(ctx context.Context, k *Kit) error {
				if err := k.Connect(ctx); err != nil {
					return err
				}
				if err := k.WatchConfig(ctx, func(_ context.Context, raw json.RawMessage) error {
					applied <- string(raw)
					return nil
				}); err != nil {
					return err
				}
				ready <- k
				<-ctx.Done()
				return nil
			})
	}()
	k := waitfor.Recv(t, ready, waitfor.Default, "the worker to watch its configuration")
	assert.Equal(t, k.Client.Name(), "wk-1")

	// No entry yet: nothing applied. The entry appears: file < entry.
	env.MustCall(t, "configuration::register", map[string]any{"id": "wk", "schema": map[string]any{}, "initial_value": map[string]any{"m": map[string]any{"y": 2}}})
	assert.Equal(t, waitfor.Recv(t, applied, waitfor.Default, "the registered entry"), `{"a":1,"m":{"x":1,"y":2}}`)
	env.MustCall(t, "configuration::set", map[string]any{"id": "wk", "value": map[string]any{"a": 3}})
	assert.Equal(t, waitfor.Recv(t, applied, waitfor.Default, "the set entry"), `{"a":3,"m":{"x":1}}`)
	// The reload hook answers {ok: true}; nothing changed, nothing applied.
	out := env.MustCall(t, "wk::on-config-change", map[string]any{})
	assert.Check(t, is.DeepEqual(out, map[string]any{"ok": true}))
	select {
	case got := <-applied:
		t.Fatalf("applied %s again", got)
	default:
	}

	cancel()
	assert.Equal(t, waitfor.Recv(t, exit, waitfor.Default, "the worker to stop"), 0)
}
