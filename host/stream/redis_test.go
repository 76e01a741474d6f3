package stream

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/redisserver"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// These tests run the redis backend against a real redis-server, started
// by each test on a free loopback port and stopped in its cleanup.
// scripts/setup-test.sh installs it.

// logBuffer is an hclog output tests can read while the worker writes.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startRedisEngine is start() with the redis backend and a readable log.
func startRedisEngine(t *testing.T, r *redisserver.Server, cfg Config) (*fixture, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	cfg.Backend, cfg.RedisURL = BackendRedis, r.URL
	eng := engine.New(engine.Options{})
	f := startWith(t, eng, cfg, hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug}))
	return f, logs
}

// TestRedisFunctions: two engines on one Redis answer TestFunctions' table
// as the kv store does, the calls alternating between them, so each sees
// what the other wrote.
func TestRedisFunctions(t *testing.T) {
	r := redisserver.Start(t)
	a, _ := startRedisEngine(t, r, Config{})
	b, _ := startRedisEngine(t, r, Config{})
	engines := []*fixture{a, b}
	for i, tc := range functionCases {
		f := engines[i%2]
		assert.Equal(t, f.mustCall(t, tc.fn, tc.payload), tc.want, "engine %d: %s %s", i%2, tc.fn, tc.payload)
	}
	// The layout is upstream's: one hash per group, the item's JSON text.
	v, err := r.Client.HGet(t.Context(), "stream:chat:r1", "c").Result()
	assert.NilError(t, err)
	assert.Equal(t, v, `{"n":4}`)
	for i, tc := range refusalCases {
		_, err := engines[i%2].call(t, tc.fn, tc.payload)
		assert.Equal(t, codeOf(t, err), tc.code, "%s %.80s", tc.fn, tc.payload)
	}
}

// TestRedisUpdateIsAtomic: increments from two engines at once are all
// counted (the WATCH/MULTI retry).
func TestRedisUpdateIsAtomic(t *testing.T) {
	r := redisserver.Start(t)
	a, _ := startRedisEngine(t, r, Config{})
	b, _ := startRedisEngine(t, r, Config{})
	const each = 20
	var wg sync.WaitGroup
	errs := make(chan error, 2*each)
	for _, f := range []*fixture{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				ctx, cancel := context.WithTimeout(context.Background(), waitFor)
				_, err := f.eng.Invoke(ctx, "", "stream::update", json.RawMessage(`{"stream_name":"n","group_id":"g","item_id":"c","ops":[{"type":"increment","path":"n","by":1}]}`))
				cancel()
				errs <- err
			}
		}()
	}
	waitfor.Group(t, &wg, waitFor, "both engines' updates")
	close(errs)
	for err := range errs {
		assert.NilError(t, err)
	}
	assert.Equal(t, a.mustCall(t, "stream::get", `{"stream_name":"n","group_id":"g","item_id":"c"}`), fmt.Sprintf(`{"n":%d}`, 2*each))
}

// TestRedisEventsAcrossEngines: a socket client on either engine gets
// every write of both exactly once, and a stream trigger fires on the
// engine that made the change only.
func TestRedisEventsAcrossEngines(t *testing.T) {
	r := redisserver.Start(t)
	a, _ := startRedisEngine(t, r, Config{})
	b, _ := startRedisEngine(t, r, Config{})

	c := a.worker(t, "listener")
	onA := &recorder{}
	_, err := c.RegisterFunction(client.FunctionDef{ID: "t::changed"}, onA.handler)
	assert.NilError(t, err)
	_, err = c.RegisterTrigger(client.TriggerDef{ID: "chat", TriggerType: TriggerStream, FunctionID: "t::changed", Config: json.RawMessage(`{"stream_name":"chat"}`)})
	assert.NilError(t, err)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if len(a.w.trig.matching(TriggerStream, "chat", "r1", ptr("x"))) == 0 {
			return poll.Continue("trigger not bound yet")
		}
		return poll.Success()
	}, poll.WithTimeout(waitFor))

	socks := map[string]*sock{}
	for name, f := range map[string]*fixture{"a": a, "b": b} {
		s, _, err := dialStream(t, f.w.Addr(), nil)
		assert.NilError(t, err)
		s.send(join("g", "chat", "r1", ""))
		assert.DeepEqual(t, s.next()["event"], map[string]any{"type": "sync", "data": []any{}})
		socks[name] = s
	}

	tests := []struct {
		name    string
		on      *fixture
		fn      string
		payload string
		id      any
		event   map[string]any
	}{
		{"set on A", a, "stream::set", `{"stream_name":"chat","group_id":"r1","item_id":"m1","data":{"t":1}}`, "m1", map[string]any{"type": "create", "data": map[string]any{"t": 1.0}}},
		{"set on B", b, "stream::set", `{"stream_name":"chat","group_id":"r1","item_id":"m2","data":2}`, "m2", map[string]any{"type": "create", "data": 2.0}},
		{"update on B", b, "stream::update", `{"stream_name":"chat","group_id":"r1","item_id":"m1","ops":[{"type":"set","path":"t","value":3}]}`, "m1", map[string]any{"type": "update", "data": map[string]any{"t": 3.0}}},
		{"delete on A", a, "stream::delete", `{"stream_name":"chat","group_id":"r1","item_id":"m2"}`, "m2", map[string]any{"type": "delete", "data": 2.0}},
		{"send on B", b, "stream::send", `{"stream_name":"chat","group_id":"r1","type":"typing","id":"m1","data":"ann"}`, "m1", map[string]any{"type": "event", "event": map[string]any{"type": "typing", "data": "ann"}}},
		{"set elsewhere", a, "stream::set", `{"stream_name":"chat","group_id":"r9","item_id":"x","data":0}`, nil, nil},
	}
	for _, tc := range tests {
		tc.on.mustCall(t, tc.fn, tc.payload)
		if tc.event == nil {
			continue
		}
		for name, s := range socks {
			ev := s.next()
			assert.Equal(t, ev["id"], tc.id, "%s, client on %s", tc.name, name)
			assert.DeepEqual(t, ev["event"], tc.event)
		}
	}
	// A marker written last is the next message of each client: nothing
	// came twice, nothing of r9 came.
	a.mustCall(t, "stream::send", `{"stream_name":"chat","group_id":"r1","type":"marker","data":null}`)
	for name, s := range socks {
		ev := s.next()
		assert.Check(t, is.DeepEqual(ev["event"], map[string]any{"type": "event", "event": map[string]any{"type": "marker", "data": nil}}), "client on %s", name)
	}

	// The trigger on A ran for A's changes only: set m1, delete m2, set
	// r9/x and the marker.
	got := onA.wait(t, 4)
	var seen []string
	for _, ev := range got {
		seen = append(seen, fmt.Sprint(ev["groupId"], "/", ev["id"], ":", ev["event"].(map[string]any)["type"]))
	}
	assert.DeepEqual(t, seen, []string{"r1/m1:create", "r1/m2:delete", "r9/x:create", "r1/<nil>:event"})
}

// TestRedisRestartKeepsData: Redis holds the data, not the worker.
func TestRedisRestartKeepsData(t *testing.T) {
	r := redisserver.Start(t)
	eng := engine.New(engine.Options{})
	defer eng.Close(context.Background())
	ctx := context.Background()
	cfg := Config{Host: "127.0.0.1", Backend: BackendRedis, RedisURL: r.URL}
	w, err := Start(ctx, eng, Options{Config: cfg})
	assert.NilError(t, err)
	assert.Equal(t, w.Store(), r.URL)
	_, err = eng.Invoke(ctx, "", "stream::set", json.RawMessage(`{"stream_name":"s","group_id":"g","item_id":"i","data":{"kept":true}}`))
	assert.NilError(t, err)
	assert.NilError(t, w.Close(ctx))

	w, err = Start(ctx, eng, Options{Config: cfg})
	assert.NilError(t, err)
	defer w.Close(ctx)
	res, err := eng.Invoke(ctx, "", "stream::get", json.RawMessage(`{"stream_name":"s","group_id":"g","item_id":"i"}`))
	assert.NilError(t, err)
	assert.Equal(t, string(res), `{"kept":true}`)
}

// TestRedisUntrustedData: what another program put into Redis is checked
// as a client's write is: coded errors, never a panic; a set or delete
// repairs the item; a pub/sub message that does not decode is logged and
// dropped.
func TestRedisUntrustedData(t *testing.T) {
	r := redisserver.Start(t)
	f, logs := startRedisEngine(t, r, Config{Limits: Limits{ValueBytes: 64}})
	ctx := t.Context()
	assert.NilError(t, r.Client.HSet(ctx, "stream:bad:g", "junk", "not json", "big", `"`+strings.Repeat("x", 100)+`"`, "ok", `1`).Err())
	assert.NilError(t, r.Client.Set(ctx, "stream:bad:str", "a string, not a hash", 0).Err())
	assert.NilError(t, r.Client.HSet(ctx, "stream:nogroup", "i", `1`).Err())

	refusals := []struct {
		name, fn, payload, code, msg string
	}{
		{"get non-JSON", "stream::get", `{"stream_name":"bad","group_id":"g","item_id":"junk"}`, CodeStoreCorrupt, "does not hold a stream value"},
		{"get oversized", "stream::get", `{"stream_name":"bad","group_id":"g","item_id":"big"}`, CodeStoreCorrupt, "at most 64 are allowed"},
		{"list", "stream::list", `{"stream_name":"bad","group_id":"g"}`, CodeStoreCorrupt, "set or delete it to repair it"},
		{"update", "stream::update", `{"stream_name":"bad","group_id":"g","item_id":"junk","ops":[{"type":"set","path":"a","value":1}]}`, CodeStoreCorrupt, "does not hold a stream value"},
		{"get from a string key", "stream::get", `{"stream_name":"bad","group_id":"str","item_id":"i"}`, CodeStoreCorrupt, "not a hash"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.call(t, tc.fn, tc.payload)
			assert.Equal(t, codeOf(t, err), tc.code)
			assert.Assert(t, is.Contains(err.Error(), tc.msg))
		})
	}
	// Only hashes named stream:<stream>:<group> are listed.
	assert.Equal(t, f.mustCall(t, "stream::list_all", `{}`), `{"stream":[{"id":"bad","groups":["g"]}],"count":1}`)
	assert.Equal(t, f.mustCall(t, "stream::get", `{"stream_name":"bad","group_id":"g","item_id":"ok"}`), `1`)

	// A set or delete repairs the item; the unreadable old value is not
	// returned.
	assert.Equal(t, f.mustCall(t, "stream::set", `{"stream_name":"bad","group_id":"g","item_id":"junk","data":2}`), `{"old_value":null,"new_value":2}`)
	assert.Equal(t, f.mustCall(t, "stream::delete", `{"stream_name":"bad","group_id":"g","item_id":"big"}`), `{"old_value":null}`)
	// (The oversized value made Redis keep the group as a hash table, so
	// its order is Redis's.)
	list := f.mustCall(t, "stream::list", `{"stream_name":"bad","group_id":"g"}`)
	assert.Assert(t, list == `[2,1]` || list == `[1,2]`, list)

	// Pub/sub: junk is dropped (and logged); an upstream engine's event is
	// delivered.
	s, _, err := dialStream(t, f.w.Addr(), nil)
	assert.NilError(t, err)
	s.send(join("g", "chat", "r1", ""))
	s.next()
	for _, junk := range []string{"not json", `{"type":"stream"}`, `{"type":"stream","timestamp":1,"streamName":"chat","groupId":"r1","id":null,"event":{"type":"explode","data":1}}`} {
		assert.NilError(t, r.Client.Publish(ctx, RedisEventsChannel, junk).Err())
	}
	upstream := `{"type":"stream","timestamp":1764619200000,"streamName":"chat","groupId":"r1","id":"m1","event":{"type":"update","data":{"from":"upstream"}}}`
	assert.NilError(t, r.Client.Publish(ctx, RedisEventsChannel, upstream).Err())
	ev := s.next()
	assert.Equal(t, ev["timestamp"], 1764619200000.0)
	assert.DeepEqual(t, ev["event"], map[string]any{"type": "update", "data": map[string]any{"from": "upstream"}})
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if n := strings.Count(logs.String(), "stream event from Redis dropped"); n < 3 {
			return poll.Continue("%d drops logged", n)
		}
		return poll.Success()
	}, poll.WithTimeout(waitFor))
}

// TestRedisUnreachable: a Redis nobody answers at fails the start with
// STREAM_BACKEND_UNAVAILABLE, naming the URL without its password, and
// leaves nothing registered.
func TestRedisUnreachable(t *testing.T) {
	port, err := loopback.FreePort()
	assert.NilError(t, err)
	eng := engine.New(engine.Options{})
	defer eng.Close(context.Background())
	logs := &logBuffer{}
	for _, url := range []string{
		fmt.Sprintf("redis://default:s3cret@127.0.0.1:%d/0", port),
		fmt.Sprintf("redis://:s3cret@127.0.0.1:%d", port),
		"redis://:s3cret@127.0.0.1:notaport",
		"http://:s3cret@127.0.0.1:6379",
	} {
		begin := time.Now()
		_, err = Start(context.Background(), eng, Options{Logger: hclog.New(&hclog.LoggerOptions{Output: logs}),
			Config: Config{Host: "127.0.0.1", Backend: BackendRedis, RedisURL: url}})
		assert.Equal(t, codeOf(t, err), CodeBackendUnavailable, url)
		assert.Assert(t, is.Contains(err.Error(), "xxxxx"))
		assert.Assert(t, !strings.Contains(err.Error(), "s3cret"), err.Error())
		assert.Assert(t, time.Since(begin) < RedisDialTimeout+5*time.Second, "bounded by the dial timeout")
		assert.Assert(t, !eng.HasFunction("", "stream::set"))
	}
	assert.Assert(t, !strings.Contains(logs.String(), "s3cret"))
}

// TestRedisResubscribes: when Redis drops the subscription, the worker
// subscribes again (and says events may have been missed), and later
// changes reach its socket clients again.
func TestRedisResubscribes(t *testing.T) {
	r := redisserver.Start(t)
	f, logs := startRedisEngine(t, r, Config{})
	s, _, err := dialStream(t, f.w.Addr(), nil)
	assert.NilError(t, err)
	s.send(join("g", "chat", "r1", ""))
	s.next()
	assert.NilError(t, r.Client.ClientKillByFilter(t.Context(), "TYPE", "pubsub").Err())
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if !strings.Contains(logs.String(), "subscribed again to the stream events") {
			return poll.Continue("not subscribed again yet")
		}
		return poll.Success()
	}, poll.WithTimeout(waitFor))
	f.mustCall(t, "stream::set", `{"stream_name":"chat","group_id":"r1","item_id":"m1","data":1}`)
	assert.DeepEqual(t, s.next()["event"], map[string]any{"type": "create", "data": 1.0})
}
