package server

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/redisserver"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/protocol"
)

// streamEntry is an iii-stream entry with upstream's keys, its port from
// STREAM_PORT as the 0.26 guide writes it.
const streamEntry = `  - name: iii-stream
    config:
      port: ${STREAM_PORT:3112}
      host: 127.0.0.1
      adapter:
        name: kv
        config:
          store_method: file_based
          file_path: ./data/streams
          save_interval_ms: 100
          channel_size: 64
`

func waitStream(t *testing.T, r *running, want bool) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if got := r.s.StreamAddr() != ""; got != want {
			return poll.Continue("stream worker running: %v", got)
		}
		return poll.Success()
	}, poll.WithTimeout(20*time.Second))
}

// TestStreamWorkerReload: a config.yaml naming iii-stream with its upstream
// keys starts it, a reload removes it (stream::* and the port go) and adds
// it back, and its data survives both, because it is persisted under the
// file_path.
func TestStreamWorkerReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	wmPort, streamPort := freePort(t), freePort(t)
	env := engineEnv(t, "STREAM_PORT", strconv.Itoa(streamPort))
	with := listenerConfig(wmPort) + streamEntry
	writeConfig(t, path, with)
	r := serveWith(t, path, env, hclog.NewNullLogger())
	assert.Equal(t, r.s.StreamAddr(), "127.0.0.1:"+strconv.Itoa(streamPort))

	w := dial(t, "127.0.0.1:"+strconv.Itoa(wmPort))
	out, errb := w.call(t, "stream::set", `{"stream_name":"s","group_id":"g","item_id":"i","data":{"v":1}}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	assert.Equal(t, string(out), `{"old_value":null,"new_value":{"v":1}}`)

	// Removed: the functions and the port go; the store was saved.
	writeConfig(t, path, listenerConfig(wmPort))
	waitStream(t, r, false)
	_, errb = w.call(t, "stream::get", `{"stream_name":"s","group_id":"g","item_id":"i"}`)
	assert.Assert(t, errb != nil && errb.Code == protocol.CodeFunctionNotFound, "%+v", errb)
	_, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(streamPort), 5*time.Second)
	assert.Assert(t, err != nil, "the stream port is closed")
	_, err = os.Stat(filepath.Join(dir, "data", "streams", "streams.json"))
	assert.NilError(t, err)

	// Added back: the data is read back.
	writeConfig(t, path, with)
	waitStream(t, r, true)
	out, errb = w.call(t, "stream::get", `{"stream_name":"s","group_id":"g","item_id":"i"}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	assert.Equal(t, string(out), `{"v":1}`)

	// Changed at run time through its configuration entry (the file's
	// block only seeded it): restarted on the new port, data kept.
	p2 := freePort(t)
	admin := dialAdmin(t, r)
	value := fmt.Sprintf(`{"port": %d, "host": "127.0.0.1", "adapter": {"name": "kv", "config": {"file_path": "./data/streams", "save_interval_ms": 100}}}`, p2)
	_, errb = admin.call(t, "configuration::set", `{"id": "iii-stream", "value": `+value+`}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	waitStreamOn(t, r, p2)
	out, errb = w.call(t, "stream::list", `{"stream_name":"s","group_id":"g"}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	assert.Equal(t, string(out), `[{"v":1}]`)
}

// TestStreamConfigurationEntry: as in iii 0.26, the file's iii-stream block
// seeds the configuration entry "iii-stream" and is then taken out of
// config.yaml (a comment says where the value lives, everything else in the
// file stays); the worker runs with the entry, a set of the entry moves it
// at run time (a value it cannot start with leaves it where it was), and a
// restarted engine runs with the entry, not with a block written back.
func TestStreamConfigurationEntry(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	wmPort, p1 := freePort(t), freePort(t)
	env := engineEnv(t, "STREAM_PORT", strconv.Itoa(p1))
	head := "# my engine\n" + listenerConfig(wmPort)
	writeConfig(t, path, head+streamEntry+"  - name: iii-http-functions\n")
	r := serveWith(t, path, env, hclog.NewNullLogger())
	assert.Equal(t, r.s.StreamAddr(), "127.0.0.1:"+strconv.Itoa(p1))

	file, err := os.ReadFile(path)
	assert.NilError(t, err)
	want := head + "  - name: iii-stream\n    # 'iii-stream': value now lives in the configuration worker at " +
		filepath.Join(dir, "config", "iii-stream.yaml") +
		". Edit it at run time with `iii call configuration::set` (docs/stream.md); this block is no longer read.\n  - name: iii-http-functions\n"
	assert.Equal(t, string(file), want)

	admin := dialAdmin(t, r)
	out, errb := admin.call(t, "configuration::get", `{"id": "iii-stream"}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	assert.Assert(t, strings.Contains(string(out), fmt.Sprintf(`"port":%d`, p1)), "%s", out)

	// A value the worker cannot start with (its port is taken) leaves it
	// where it was.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	defer taken.Close()
	_, errb = admin.call(t, "configuration::set", fmt.Sprintf(`{"id": "iii-stream", "value": {"port": %d}}`, taken.Addr().(*net.TCPAddr).Port))
	assert.Assert(t, errb == nil, "%+v", errb)
	p2 := freePort(t)
	_, errb = admin.call(t, "configuration::set", fmt.Sprintf(`{"id": "iii-stream", "value": {"port": %d}}`, p2))
	assert.Assert(t, errb == nil, "%+v", errb)
	waitStreamOn(t, r, p2)

	// A schema violation is refused by the configuration worker itself.
	_, errb = admin.call(t, "configuration::set", `{"id": "iii-stream", "value": {"port": "soon"}}`)
	assert.Assert(t, errb != nil && errb.Code == "SCHEMA_INVALID", "%+v", errb)

	// Restarted with a block written back: the entry wins.
	r.cancel()
	assert.NilError(t, r.stopped(t))
	writeConfig(t, path, head+streamEntry)
	r = serveWith(t, path, env, hclog.NewNullLogger())
	assert.Equal(t, r.s.StreamAddr(), "127.0.0.1:"+strconv.Itoa(p2))
}

func TestStreamWorkerStartErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	held, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	defer held.Close()
	port := held.Addr().(*net.TCPAddr).Port
	writeConfig(t, path, listenerConfig(freePort(t))+fmt.Sprintf("  - name: iii-stream\n    config: { port: %d }\n", port))
	_, err = Start(t.Context(), Options{ConfigPath: path, Version: "0.26.0", LookupEnv: lookupIn(engineEnv(t))})
	assert.ErrorContains(t, err, "LISTEN_FAILED")

	writeConfig(t, path, listenerConfig(freePort(t))+"  - name: iii-stream\n    config: { adapter: { name: bridge } }\n")
	_, err = Start(t.Context(), Options{ConfigPath: path, Version: "0.26.0", LookupEnv: lookupIn(engineEnv(t))})
	assert.ErrorContains(t, err, "INVALID_CONFIG")
}

// A reload that replaces the configuration worker (another name) moves the
// stream worker's entry and its watch to the new one.
func TestStreamEntryFollowsConfigurationWorker(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	wmPort, p1 := freePort(t), freePort(t)
	env := engineEnv(t, "STREAM_PORT", strconv.Itoa(p1))
	writeConfig(t, path, listenerConfig(wmPort)+streamEntry)
	r := serveWith(t, path, env, hclog.NewNullLogger())
	assert.Equal(t, r.s.StreamAddr(), "127.0.0.1:"+strconv.Itoa(p1))
	before := r.s.Configuration()

	stripped, err := os.ReadFile(path)
	assert.NilError(t, err)
	writeConfig(t, path, string(stripped)+"  - name: configuration#other\n")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if r.s.Configuration() == before {
			return poll.Continue("configuration worker not replaced yet")
		}
		return poll.Success()
	}, poll.WithTimeout(20*time.Second))

	p2 := freePort(t)
	admin := dialAdmin(t, r)
	// The server registers the entry (and its schema) with the new worker
	// just after the swap; set needs the schema.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, errb := admin.call(t, "configuration::schema", `{"id": "iii-stream"}`); errb != nil {
			return poll.Continue("iii-stream not registered with the new worker yet: %+v", errb)
		}
		return poll.Success()
	}, poll.WithTimeout(20*time.Second))
	_, errb := admin.call(t, "configuration::set", fmt.Sprintf(`{"id": "iii-stream", "value": {"port": %d}}`, p2))
	assert.Assert(t, errb == nil, "%+v", errb)
	waitStreamOn(t, r, p2)
}

// TestStreamConfigurationRedis: configuration::set of the iii-stream entry
// moves the running worker from kv to redis and back, each time with that
// store's data; a Redis that cannot be reached leaves it where it was and
// the log names the URL without its password; bridge is refused by the
// entry's schema.
func TestStreamConfigurationRedis(t *testing.T) {
	t.Parallel()
	redis := redisserver.Start(t)
	redisURL, rdb := redis.URL, redis.Client
	assert.NilError(t, rdb.HSet(t.Context(), "stream:s:g", "i", `"from redis"`).Err())
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	wmPort, p1 := freePort(t), freePort(t)
	env := engineEnv(t, "STREAM_PORT", strconv.Itoa(p1))
	writeConfig(t, path, listenerConfig(wmPort)+streamEntry)
	logs := &syncbuf.Buffer{}
	r := serveWith(t, path, env, hclog.New(&hclog.LoggerOptions{Output: logs}))

	w := dial(t, "127.0.0.1:"+strconv.Itoa(wmPort))
	_, errb := w.call(t, "stream::set", `{"stream_name":"s","group_id":"g","item_id":"i","data":"from kv"}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	admin := dialAdmin(t, r)
	waitItem := func(want string) {
		t.Helper()
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			out, errb := w.call(t, "stream::get", `{"stream_name":"s","group_id":"g","item_id":"i"}`)
			if errb != nil || string(out) != want {
				return poll.Continue("stream::get answers %s (%+v)", out, errb)
			}
			return poll.Success()
		}, poll.WithTimeout(20*time.Second))
	}
	kv := fmt.Sprintf(`{"port": %d, "host": "127.0.0.1", "adapter": {"name": "kv", "config": {"file_path": "./data/streams", "save_interval_ms": 100}}}`, p1)
	tests := []struct {
		name, value, want string
	}{
		{"kv to redis", fmt.Sprintf(`{"port": %d, "host": "127.0.0.1", "adapter": {"name": "redis", "config": {"redis_url": %q}}}`, p1, redisURL), `"from redis"`},
		{"redis to kv", kv, `"from kv"`},
		{"kv to redis again", fmt.Sprintf(`{"port": %d, "adapter": {"name": "redis", "config": {"redis_url": %q}}}`, p1, redisURL), `"from redis"`},
	}
	for _, tc := range tests {
		_, errb = admin.call(t, "configuration::set", `{"id": "iii-stream", "value": `+tc.value+`}`)
		assert.Assert(t, errb == nil, "%s: %+v", tc.name, errb)
		waitItem(tc.want)
	}
	// On redis, a write lands in Redis.
	_, errb = w.call(t, "stream::set", `{"stream_name":"s","group_id":"g","item_id":"j","data":{"n":1}}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	v, err := rdb.HGet(t.Context(), "stream:s:g", "j").Result()
	assert.NilError(t, err)
	assert.Equal(t, v, `{"n":1}`)

	// Unreachable: back to the previous settings (redis), password unsaid.
	dead := fmt.Sprintf("redis://:s3cret@127.0.0.1:%d", freePort(t))
	_, errb = admin.call(t, "configuration::set", fmt.Sprintf(`{"id": "iii-stream", "value": {"port": %d, "adapter": {"name": "redis", "config": {"redis_url": %q}}}}`, p1, dead))
	assert.Assert(t, errb == nil, "%+v", errb)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if !strings.Contains(logs.String(), "back to its previous ones") || r.s.StreamAddr() == "" {
			return poll.Continue("no fallback yet")
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second))
	assert.Assert(t, strings.Contains(logs.String(), "STREAM_BACKEND_UNAVAILABLE"), logs.String())
	assert.Assert(t, strings.Contains(logs.String(), "redis://:xxxxx@127.0.0.1"), logs.String())
	assert.Assert(t, !strings.Contains(logs.String(), "s3cret"), "the password is never logged")
	waitItem(`"from redis"`)

	// Back to kv, and bridge is refused by the schema.
	_, errb = admin.call(t, "configuration::set", `{"id": "iii-stream", "value": `+kv+`}`)
	assert.Assert(t, errb == nil, "%+v", errb)
	waitItem(`"from kv"`)
	_, errb = admin.call(t, "configuration::set", `{"id": "iii-stream", "value": {"adapter": {"name": "bridge"}}}`)
	assert.Assert(t, errb != nil && errb.Code == "SCHEMA_INVALID", "%+v", errb)
}

// waitStreamOn waits until the server's stream socket listens on
// 127.0.0.1:port (a configuration change restarts it there).
func waitStreamOn(t *testing.T, r *running, port int) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if got := r.s.StreamAddr(); got != "127.0.0.1:"+strconv.Itoa(port) {
			return poll.Continue("stream on %q", got)
		}
		return poll.Success()
	}, poll.WithTimeout(20*time.Second))
}
