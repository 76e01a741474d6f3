package config

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// A Stream survives the trip through its entry value, and the value is read
// with the file's checks.
func TestStreamEntryRoundTrip(t *testing.T) {
	s := Stream{Name: "iii-stream", Host: "127.0.0.1", Port: 4123, AuthFunction: "auth::stream", Adapter: "kv",
		StoreMethod: StoreInMemory, FilePath: "/var/lib/iii/streams", SaveInterval: 750 * time.Millisecond, ChannelSize: 64}
	got, err := StreamFromEntry("iii-stream", s.SeedValue(), "/srv")
	assert.NilError(t, err)
	assert.DeepEqual(t, *got, s)

	// Defaults fill what the value leaves out; relative paths resolve
	// against the directory given.
	got, err = StreamFromEntry("iii-stream", json.RawMessage(`{"port": 5000, "adapter": {"config": {"file_path": "data/s"}}}`), "/srv")
	assert.NilError(t, err)
	assert.Equal(t, got.Port, 5000)
	assert.Equal(t, got.Host, DefaultStreamHost)
	assert.Equal(t, got.FilePath, "/srv/data/s")
	assert.Equal(t, got.StoreMethod, StoreFileBased)
}

// The redis adapter's value is upstream's {name: "redis", config: {redis_url}}.
func TestStreamEntryRedis(t *testing.T) {
	s := Stream{Name: "iii-stream", Host: "127.0.0.1", Port: 3112, Adapter: "redis", RedisURL: "redis://:pw@cache:6379/1",
		StoreMethod: StoreFileBased, FilePath: "/srv/data/stream_store", SaveInterval: DefaultStreamSaveInterval, ChannelSize: DefaultStreamChannelSize}
	assert.Equal(t, string(s.SeedValue()), `{"adapter":{"config":{"redis_url":"redis://:pw@cache:6379/1"},"name":"redis"},"host":"127.0.0.1","port":3112}`)
	got, err := StreamFromEntry("iii-stream", s.SeedValue(), "/srv")
	assert.NilError(t, err)
	assert.DeepEqual(t, *got, s)
}

func TestStreamEntryRefused(t *testing.T) {
	tests := []struct{ name, value, want string }{
		{"not an object", `[1, 2]`, "must be an object"},
		{"not JSON", `{`, "not a JSON object"},
		{"unknown key", `{"prot": 1}`, "unknown key"},
		{"port out of range", `{"port": 70000}`, "port"},
		{"bridge", `{"adapter": {"name": "bridge"}}`, "which this engine does not have"},
		{"redis with a kv key", `{"adapter": {"name": "redis", "config": {"channel_size": 4}}}`, "unknown key"},
		{"redis_url not redis", `{"adapter": {"name": "redis", "config": {"redis_url": "ftp://h"}}}`, "redis_url is not a redis://"},
		{"bad store method", `{"adapter": {"config": {"store_method": "tape"}}}`, "store_method"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := StreamFromEntry("iii-stream", json.RawMessage(tc.value), "/srv")
			assert.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, CodeInvalidConfig)
		})
	}
}

func TestStreamEntrySchemaIsJSON(t *testing.T) {
	var v map[string]any
	assert.NilError(t, json.Unmarshal(StreamEntrySchema(), &v))
	assert.Equal(t, v["type"], "object")
}

// A redis_url written with placeholders seeds the entry as written, so a
// password from the environment never lands in the entry's file; the
// worker runs with it expanded.
func TestStreamSeedKeepsPlaceholders(t *testing.T) {
	doc := "workers:\n  - name: iii-stream\n    config:\n      adapter:\n        name: redis\n        config: { redis_url: \"${REDIS_URL}\" }\n"
	env := map[string]string{"REDIS_URL": "redis://:s3cret@127.0.0.1:6379/0"}
	cfg, err := Parse([]byte(doc), ParseOptions{Name: "config.yaml", Dir: "/srv", Lookup: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	assert.NilError(t, err)
	assert.Equal(t, cfg.Stream.RedisURL, "redis://:s3cret@127.0.0.1:6379/0")
	seed := string(cfg.Stream.SeedValue())
	assert.Assert(t, is.Contains(seed, `"redis_url":"${REDIS_URL}"`))
	assert.Assert(t, !strings.Contains(seed, "s3cret"), seed)

	// Written plainly, it is seeded plainly.
	plain := strings.Replace(doc, `"${REDIS_URL}"`, `"redis://127.0.0.1:6379"`, 1)
	cfg, err = Parse([]byte(plain), ParseOptions{Name: "config.yaml", Dir: "/srv"})
	assert.NilError(t, err)
	assert.Assert(t, is.Contains(string(cfg.Stream.SeedValue()), `"redis_url":"redis://127.0.0.1:6379"`))
}
