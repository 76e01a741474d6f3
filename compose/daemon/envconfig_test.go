package daemon

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"gopkg.in/yaml.v3"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/host/engine"
)

type pingReply struct {
	Worker string            `json:"worker"`
	PID    int               `json:"pid"`
	Config *string           `json:"config"`
	Env    map[string]string `json:"env"`
}

// A worker's environment is built in layers (host baseline, env files in
// order, environment, the reserved III_* variables) and nothing else of
// Compose's environment leaks in. Its configuration is the package
// defaults < the configuration entry < config_override (maps merge, lists
// and scalars replace, a changed name replaces the mapping, null is a
// value, config_override is never interpolated), written owner-only to
// III_CONFIG and published back to the entry.
func TestWorkerEnvironmentAndConfiguration(t *testing.T) {
	t.Parallel()
	n := findNode(t)
	eng := startEngine(t, "")
	c := eng.caller(t)
	assert.NilError(t, call(t, c, "default", "configuration::register", map[string]any{
		"id": "shop-api", "name": "shop api", "description": "d", "schema": map[string]any{},
		"initial_value": map[string]any{"log_level": "info", "db": map[string]any{"host": "a", "port": 5432}, "tags": []any{"x", "y"},
			"adapter": map[string]any{"name": "fs", "config": map[string]any{"directory": "./d"}}},
	}, nil))

	file := `namespace: cfgtest
containers:
  w:
    worker: path://./w
    config_name: shop-api
    config_override:
      db: { port: 6000 }
      tags: [z]
      adapter: { name: s3, config: { bucket: b } }
      extra: null
      api_key: ${ANTHROPIC_API_KEY}
    env_file: [./a.env, ./b.env]
    environment:
      APP_C: from-environment
      III_SDK_URL: "` + n.URL + `"
    scripts: { run: ` + n.runCommand() + ` }
  fresh:
    worker: path://./fresh
    config_name: fresh-entry
    config_override: { port: 1 }
    environment: { III_SDK_URL: "` + n.URL + `" }
    scripts: { run: ` + n.runCommand() + ` }
`
	dir := newProject(t, file, "w", "fresh")
	writeFile(t, dir, "a.env", "APP_A=1\nAPP_B=from-a\n")
	writeFile(t, dir, "b.env", "export APP_B=from-b\nAPP_C=from-b\n")
	env := map[string]string{"PATH": os.Getenv("PATH"), "HOME": "/home/compose-test", "LEAK_SECRET": "must-not-reach-workers", "ANTHROPIC_API_KEY": "sk-secret"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	startDaemon(t, eng.attach(Options{Cwd: dir, LookupEnv: lookup}))

	var up opResult
	assert.NilError(t, call(t, c, "cfgtest", "compose::up", nil, &up))
	assert.Equal(t, up.Status, "ok", "%+v", up)

	var ping pingReply
	assert.NilError(t, call(t, c, "cfgtest", "w::ping", nil, &ping))
	stateDir := filepath.Join(dir, ".iii", "compose", "cfgtest")
	cfgPath := filepath.Join(stateDir, "config", "w.yaml")
	assert.DeepEqual(t, ping.Env, map[string]string{
		"APP_A": "1", "APP_B": "from-b", "APP_C": "from-environment",
		"HOME": "/home/compose-test", "PATH": os.Getenv("PATH"),
		"III_SDK_URL":           n.URL,
		"III_URL":               eng.url,
		"III_NAMESPACE":         "cfgtest",
		"III_COMPOSE_NAMESPACE": "cfgtest",
		"III_COMPOSE_FILE":      filepath.Join(dir, "worker-compose.yaml"),
		"III_COMPOSE_DIR":       dir,
		"III_WORKER_NAME":       "w",
		"III_CONFIG":            cfgPath,
		"III_CONFIG_NAME":       "shop-api",
		"III_ISOLATION":         "host",
	})
	want := map[string]any{
		"log_level": "info",
		"db":        map[string]any{"host": "a", "port": 6000},
		"tags":      []any{"z"},
		"adapter":   map[string]any{"name": "s3", "config": map[string]any{"bucket": "b"}},
		"extra":     nil,
		"api_key":   "${ANTHROPIC_API_KEY}",
	}
	assert.Assert(t, ping.Config != nil)
	var fromFile map[string]any
	assert.NilError(t, yaml.Unmarshal([]byte(*ping.Config), &fromFile))
	assert.DeepEqual(t, fromFile, want)
	st, err := os.Stat(cfgPath)
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))

	// Published back: the entry now holds the merged value.
	var got struct {
		Value map[string]any `json:"value"`
	}
	assert.NilError(t, call(t, c, "default", "configuration::get", map[string]any{"id": "shop-api", "raw": true}, &got))
	assert.DeepEqual(t, got.Value, map[string]any{
		"log_level": "info", "db": map[string]any{"host": "a", "port": float64(6000)}, "tags": []any{"z"},
		"adapter": map[string]any{"name": "s3", "config": map[string]any{"bucket": "b"}}, "extra": nil, "api_key": "${ANTHROPIC_API_KEY}",
	})
	// An entry that did not exist is registered with the merged value.
	var fresh struct {
		Value map[string]any `json:"value"`
	}
	assert.NilError(t, call(t, c, "default", "configuration::get", map[string]any{"id": "fresh-entry", "raw": true}, &fresh))
	assert.DeepEqual(t, fresh.Value, map[string]any{"port": float64(1)})
}

// config_name with an entry the engine cannot read is CONFIG_FETCH_FAILED
// (the worker does not start on stale defaults); a merged value the
// entry's schema refuses is CONFIG_PUBLISH_FAILED.
func TestConfigFetchAndPublishFailures(t *testing.T) {
	t.Parallel()
	t.Run("fetch", func(t *testing.T) {
		// A bare engine without the configuration worker: configuration::get
		// is not there at all.
		const token = "bare-engine-token"
		eng := engine.New(engine.Options{Version: "0.26.0", AdminToken: func() string { return token }})
		srv := httptest.NewServer(eng.Handler())
		defer func() {
			_ = eng.Close(context.Background())
			srv.Close()
		}()
		url := "ws://" + srv.Listener.Addr().String()
		dir := newProject(t, "containers:\n  w:\n    worker: path://./w\n    config_name: shop-api\n    scripts: { run: 'sleep 300' }\n", "w")
		startDaemon(t, Options{EngineURL: url, Cwd: dir, LookupEnv: func(k string) (string, bool) {
			if k == envEngineToken {
				return token, true
			}
			return os.LookupEnv(k)
		}})
		c := callerWithToken(t, url, token)
		var up opResult
		assert.NilError(t, call(t, c, "default", "compose::up", nil, &up))
		assert.Equal(t, up.Status, "failed")
		e := up.Containers[0].Error
		assert.Equal(t, e.Code, compose.CodeConfigFetchFailed)
		assert.Check(t, is.Contains(e.Message, `container "w": cannot read configuration entry "shop-api" (configuration::get): function_not_found`))
		assert.Check(t, is.Contains(e.Message, "the container was not started"))
	})
	t.Run("publish", func(t *testing.T) {
		eng := startEngine(t, "")
		c := eng.caller(t)
		assert.NilError(t, call(t, c, "default", "configuration::register", map[string]any{
			"id": "typed", "name": "typed", "description": "d",
			"schema":        map[string]any{"type": "object", "properties": map[string]any{"port": map[string]any{"type": "integer"}}},
			"initial_value": map[string]any{"port": 1},
		}, nil))
		dir := newProject(t, "containers:\n  w:\n    worker: path://./w\n    config_name: typed\n    config_override: { port: not-a-number }\n    scripts: { run: 'sleep 300' }\n", "w")
		startDaemon(t, eng.attach(Options{Cwd: dir}))
		var up opResult
		assert.NilError(t, call(t, c, "default", "compose::up", nil, &up))
		assert.Equal(t, up.Status, "failed")
		e := up.Containers[0].Error
		assert.Equal(t, e.Code, compose.CodeConfigPublishFailed, e.Message)
		assert.Check(t, is.Contains(e.Message, `container "w": cannot publish the merged configuration to entry "typed": SCHEMA_INVALID`))
	})
}

func TestMergeConfig(t *testing.T) {
	t.Parallel()
	j := func(s string) any {
		v, err := decodeJSON([]byte(s))
		assert.NilError(t, err)
		return v
	}
	tests := []struct{ name, base, over, want string }{
		{"maps merge key by key", `{"a":1,"m":{"x":1,"y":2}}`, `{"b":2,"m":{"y":3}}`, `{"a":1,"b":2,"m":{"x":1,"y":3}}`},
		{"lists replace", `{"l":[1,2,3]}`, `{"l":[4]}`, `{"l":[4]}`},
		{"scalars replace", `{"s":"a"}`, `{"s":5}`, `{"s":5}`},
		{"null is a value", `{"s":"a"}`, `{"s":null}`, `{"s":null}`},
		{"a changed name replaces the mapping", `{"adapter":{"name":"fs","config":{"directory":"./c"}}}`,
			`{"adapter":{"name":"s3","config":{"bucket":"b"}}}`, `{"adapter":{"name":"s3","config":{"bucket":"b"}}}`},
		{"the same name merges", `{"adapter":{"name":"fs","config":{"directory":"./c","mode":1}}}`,
			`{"adapter":{"name":"fs","config":{"mode":2}}}`, `{"adapter":{"name":"fs","config":{"directory":"./c","mode":2}}}`},
		{"a map over a scalar", `{"m":1}`, `{"m":{"a":1}}`, `{"m":{"a":1}}`},
		{"a scalar over a map", `{"m":{"a":1}}`, `{"m":1}`, `{"m":1}`},
		{"top-level replace", `[1]`, `{"a":1}`, `{"a":1}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.DeepEqual(t, mergeConfig(j(tc.base), j(tc.over)), j(tc.want))
		})
	}
	// Layers: absent layers are skipped; none at all is no configuration.
	_, ok := layers{}.merged()
	assert.Check(t, !ok)
	v, ok := layers{defaults: j(`{"a":1,"b":1}`), hasDef: true, override: j(`{"b":2}`), hasOver: true}.merged()
	assert.Check(t, ok)
	assert.DeepEqual(t, v, j(`{"a":1,"b":2}`))
}

func FuzzMergeConfig(f *testing.F) {
	f.Add([]byte(`{"a":{"name":"x","b":1}}`), []byte(`{"a":{"name":"y"}}`))
	f.Add([]byte(`[1,2]`), []byte(`null`))
	f.Fuzz(func(t *testing.T, base, over []byte) {
		b, err1 := decodeJSON(base)
		o, err2 := decodeJSON(over)
		if err1 != nil || err2 != nil {
			return
		}
		out := mergeConfig(b, o)
		if _, err := json.Marshal(out); err != nil {
			t.Fatal(err)
		}
		if _, err := yamlOf(out); err != nil {
			t.Fatal(err)
		}
	})
}
