package server

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
)

var streamScript = nodesdk.Script{Path: filepath.Join("testdata", "node", "stream.mjs"), RejectNonJSON: true}

const nodeWait = 30 * time.Second

// nodeCalls runs the SDK as a caller (iii.trigger for each call) and
// returns one result line per call.
func nodeCalls(t *testing.T, ne nodesdk.SDK, url string, calls ...map[string]any) []map[string]any {
	t.Helper()
	p := ne.Start(t, streamScript, map[string]any{"mode": "call", "url": url, "name": "stream-caller", "calls": calls}, nodeWait)
	out := make([]map[string]any, 0, len(calls))
	for range calls {
		out = append(out, p.Line(t, nodeWait))
	}
	select {
	case <-p.Done():
		assert.NilError(t, p.Err(), "the caller exits cleanly")
	case <-time.After(nodeWait):
		t.Fatal("caller did not exit")
	}
	return out
}

func call(fn string, payload map[string]any) map[string]any {
	return map[string]any{"function_id": fn, "payload": payload}
}

func okResult(t *testing.T, line map[string]any) any {
	t.Helper()
	assert.Equal(t, line["ok"], true, "%v", line)
	return line["result"]
}

// until reads the script's lines until each key in want has been seen once,
// returning the first line seen for each.
func until(t *testing.T, p *nodesdk.Proc, want ...string) map[string]map[string]any {
	t.Helper()
	seen := map[string]map[string]any{}
	for len(seen) < len(want) {
		line := p.Line(t, nodeWait)
		for _, k := range want {
			if _, ok := line[k]; ok {
				if _, dup := seen[k]; !dup {
					seen[k] = line
				}
			}
		}
	}
	return seen
}

// TestStreamNodeSDK is the acceptance test of iii-stream: the published
// Node SDK uses the stream API the way upstream's guide does (stream::set,
// get, list, list_groups, update through iii.trigger; a "stream" trigger
// and a "stream:join" trigger; a client on the stream socket), against an
// engine started from a config.yaml naming iii-stream with its upstream
// keys; then the engine restarts and what was set before is read after.
func TestStreamNodeSDK(t *testing.T) {
	t.Parallel()
	ne := nodesdk.Find(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	wmPort, streamPort := freePort(t), freePort(t)
	env := engineEnv(t, "STREAM_PORT", strconv.Itoa(streamPort))
	writeConfig(t, path, listenerConfig(wmPort)+streamEntry)
	url := "ws://127.0.0.1:" + strconv.Itoa(wmPort)

	r := serveWith(t, path, env, hclog.NewNullLogger())
	listener := ne.Start(t, streamScript, map[string]any{"mode": "listen", "url": url, "name": "stream-listener",
		"stream_name": "presence", "group_id": "room-1", "stream_url": "ws://" + r.s.StreamAddr() + "/"}, nodeWait)
	info := listener.Line(t, nodeWait)["info"].(map[string]any)
	triggers := info["registered_triggers"].([]any)
	assert.Equal(t, len(triggers), 1, "%v", info)
	assert.Equal(t, triggers[0].(map[string]any)["trigger_type"], "stream:join")

	// Joining the socket: the join trigger runs and the client gets the
	// group's current content (empty).
	got := until(t, listener, "started", "join", "socket")
	join := got["join"]["join"].(map[string]any)
	assert.Equal(t, join["subscription_id"], "sub-1")
	assert.Equal(t, join["stream_name"], "presence")
	assert.Equal(t, join["group_id"], "room-1")
	sync := got["socket"]["socket"].(map[string]any)
	assert.DeepEqual(t, sync["event"], map[string]any{"type": "sync", "data": []any{}})

	alice := map[string]any{"name": "Alice", "online": true}
	res := nodeCalls(t, ne, url,
		call("stream::set", map[string]any{"stream_name": "presence", "group_id": "room-1", "item_id": "user-123", "data": alice}),
		call("stream::get", map[string]any{"stream_name": "presence", "group_id": "room-1", "item_id": "user-123"}),
		call("stream::list", map[string]any{"stream_name": "presence", "group_id": "room-1"}),
		call("stream::update", map[string]any{"stream_name": "presence", "group_id": "room-1", "item_id": "user-123",
			"ops": []any{map[string]any{"type": "increment", "path": "visits", "by": 1}}}),
		call("stream::list_groups", map[string]any{"stream_name": "presence"}),
		call("stream::set", map[string]any{"stream_name": "presence", "group_id": "room-1", "item_id": "user-123"}),
	)
	assert.DeepEqual(t, okResult(t, res[0]), map[string]any{"old_value": nil, "new_value": alice})
	assert.DeepEqual(t, okResult(t, res[1]), alice)
	assert.DeepEqual(t, okResult(t, res[2]), []any{alice})
	withVisits := map[string]any{"name": "Alice", "online": true, "visits": 1.0}
	assert.DeepEqual(t, okResult(t, res[3]), map[string]any{"old_value": alice, "new_value": withVisits})
	assert.DeepEqual(t, okResult(t, res[4]), []any{"room-1"})
	assert.Equal(t, res[5]["ok"], false, "a set without data is refused")
	assert.Equal(t, res[5]["code"], "STREAM_INVALID_INPUT", "%v", res[5])

	// The stream trigger and the socket client both saw the changes.
	got = until(t, listener, "trigger", "socket")
	trig := got["trigger"]["trigger"].(map[string]any)
	assert.Equal(t, trig["streamName"], "presence")
	assert.Equal(t, trig["groupId"], "room-1")
	assert.Equal(t, trig["id"], "user-123")
	assert.DeepEqual(t, trig["event"], map[string]any{"type": "create", "data": alice})
	sock := got["socket"]["socket"].(map[string]any)
	assert.DeepEqual(t, sock["event"], map[string]any{"type": "create", "data": alice})
	listener.Stop(nodeWait)

	// The engine restarts: what was set before is read after.
	r.cancel()
	assert.NilError(t, r.stopped(t))
	serveWith(t, path, env, hclog.NewNullLogger())
	res = nodeCalls(t, ne, url,
		call("stream::get", map[string]any{"stream_name": "presence", "group_id": "room-1", "item_id": "user-123"}),
		call("stream::list", map[string]any{"stream_name": "presence", "group_id": "room-1"}),
		call("stream::list_all", map[string]any{}),
	)
	assert.DeepEqual(t, okResult(t, res[0]), withVisits)
	assert.DeepEqual(t, okResult(t, res[1]), []any{withVisits})
	assert.DeepEqual(t, okResult(t, res[2]), map[string]any{"stream": []any{map[string]any{"id": "presence", "groups": []any{"room-1"}}}, "count": 1.0})
}
