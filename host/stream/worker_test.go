package stream

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const waitFor = 10 * time.Second

type fixture struct {
	eng *engine.Engine
	url string // the engine's worker WebSocket
	w   *Worker
	dir string
}

// start runs an engine (served over a loopback WebSocket) with an
// iii-stream worker on a free loopback port; the test's cleanup stops both.
func start(t *testing.T, cfg Config) *fixture {
	t.Helper()
	return startWith(t, engine.New(engine.Options{}), cfg, nil)
}

// startWith is start with the engine and the worker's logger given.
func startWith(t *testing.T, eng *engine.Engine, cfg Config, log hclog.Logger) *fixture {
	t.Helper()
	srv := httptest.NewServer(eng.Handler())
	f := &fixture{eng: eng, url: "ws" + strings.TrimPrefix(srv.URL, "http"), dir: cfg.StoreDir}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	w, err := Start(context.Background(), eng, Options{Config: cfg, Logger: log})
	assert.NilError(t, err)
	f.w = w
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		assert.Check(t, f.w.Close(ctx))
		srv.Close()
		assert.Check(t, eng.Close(ctx))
	})
	return f
}

func (f *fixture) call(t *testing.T, fn, payload string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	res, err := f.eng.Invoke(ctx, "", fn, json.RawMessage(payload))
	return string(res), err
}

func (f *fixture) mustCall(t *testing.T, fn, payload string) string {
	t.Helper()
	res, err := f.call(t, fn, payload)
	assert.NilError(t, err, "%s %s", fn, payload)
	return res
}

// worker connects a Go client worker to the engine.
func (f *fixture) worker(t *testing.T, name string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := client.Dial(ctx, f.url, client.Options{Name: name, IgnoreEnv: true})
	assert.NilError(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// functionCases is stream::*'s behaviour, call by call, from an empty
// store; every backend gives these answers (redis_test.go runs it across
// two engines sharing one Redis).
var functionCases = []struct{ fn, payload, want string }{
	{"stream::get", `{"stream_name":"chat","group_id":"r1","item_id":"m1"}`, `null`},
	{"stream::set", `{"stream_name":"chat","group_id":"r1","item_id":"m1","data":{"text":"hi"}}`, `{"old_value":null,"new_value":{"text":"hi"}}`},
	{"stream::set", `{"stream_name":"chat","group_id":"r1","item_id":"m1","data":{"text":"hello"}}`, `{"old_value":{"text":"hi"},"new_value":{"text":"hello"}}`},
	{"stream::set", `{"stream_name":"chat","group_id":"r2","item_id":"m1","data":1}`, `{"old_value":null,"new_value":1}`},
	{"stream::get", `{"stream_name":"chat","group_id":"r1","item_id":"m1"}`, `{"text":"hello"}`},
	{"stream::list", `{"stream_name":"chat","group_id":"r1"}`, `[{"text":"hello"}]`},
	{"stream::list", `{"stream_name":"chat","group_id":"none"}`, `[]`},
	{"stream::list_groups", `{"stream_name":"chat"}`, `["r1","r2"]`},
	{"stream::list_all", `{}`, `{"stream":[{"id":"chat","groups":["r1","r2"]}],"count":1}`},
	{"stream::update", `{"stream_name":"chat","group_id":"r1","item_id":"c","ops":[{"type":"increment","path":"n","by":2},{"type":"merge","value":7}]}`,
		`{"old_value":null,"new_value":{"n":2},"errors":[{"op_index":1,"code":"merge.value.not_an_object","message":"Merge value must be a JSON object"}]}`},
	{"stream::update", `{"stream_name":"chat","group_id":"r1","item_id":"c","ops":[{"type":"increment","path":"n","by":2}]}`, `{"old_value":{"n":2},"new_value":{"n":4}}`},
	{"stream::delete", `{"stream_name":"chat","group_id":"r2","item_id":"m1"}`, `{"old_value":1}`},
	{"stream::delete", `{"stream_name":"chat","group_id":"r2","item_id":"m1"}`, `{"old_value":null}`},
	{"stream::list_groups", `{"stream_name":"chat"}`, `["r1"]`},
	{"stream::send", `{"stream_name":"chat","group_id":"r1","type":"typing","data":{"who":"ann"}}`, `null`},
}

// refusalCases are requests every backend refuses, with their codes.
var refusalCases = []struct{ fn, payload, code string }{
	{"stream::set", `[]`, CodeInvalidInput},
	{"stream::set", `{"stream_name":"chat","group_id":"r1","item_id":"m1"}`, CodeInvalidInput},
	{"stream::set", `{"stream_name":5,"group_id":"r1","item_id":"m1","data":1}`, CodeInvalidInput},
	{"stream::get", `{"stream_name":"","group_id":"r1","item_id":"m1"}`, CodeInvalidInput},
	{"stream::get", `{"stream_name":"chat","group_id":"` + strings.Repeat("g", 257) + `","item_id":"m1"}`, CodeInvalidInput},
	{"stream::set", `{"stream_name":"chat","group_id":"r1","item_id":"big","data":"` + strings.Repeat("x", 2<<20) + `"}`, CodeValueTooLarge},
	{"stream::update", `{"stream_name":"chat","group_id":"r1","item_id":"c","ops":[{"type":"boom"}]}`, CodeInvalidInput},
	{"stream::send", `{"stream_name":"chat","group_id":"r1","data":1}`, CodeInvalidInput},
}

func TestFunctions(t *testing.T) {
	f := start(t, Config{})
	for _, tc := range functionCases {
		assert.Equal(t, f.mustCall(t, tc.fn, tc.payload), tc.want, "%s %s", tc.fn, tc.payload)
	}
	for _, tc := range refusalCases {
		_, err := f.call(t, tc.fn, tc.payload)
		assert.Equal(t, codeOf(t, err), tc.code, "%s %.80s", tc.fn, tc.payload)
	}
}

// recorder is a Go client worker function that keeps what it is called with.
type recorder struct {
	mu    sync.Mutex
	calls []map[string]any
	reply any
}

func (r *recorder) handler(_ context.Context, inv *client.Invocation) (any, error) {
	var m map[string]any
	_ = json.Unmarshal(inv.Data, &m)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, m)
	return r.reply, nil
}

func (r *recorder) wait(t *testing.T, n int) []map[string]any {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.calls) < n {
			return poll.Continue("%d calls of %d", len(r.calls), n)
		}
		return poll.Success()
	}, poll.WithTimeout(waitFor))
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]any(nil), r.calls...)
}

func TestStreamTriggers(t *testing.T) {
	f := start(t, Config{})
	c := f.worker(t, "listener")
	all, room, cond := &recorder{}, &recorder{}, &recorder{reply: false}
	for id, r := range map[string]*recorder{"t::all": all, "t::room": room, "t::cond": cond} {
		_, err := c.RegisterFunction(client.FunctionDef{ID: id}, r.handler)
		assert.NilError(t, err)
	}
	gated := &recorder{}
	_, err := c.RegisterFunction(client.FunctionDef{ID: "t::gated"}, gated.handler)
	assert.NilError(t, err)
	for _, td := range []client.TriggerDef{
		{ID: "all", TriggerType: TriggerStream, FunctionID: "t::all", Config: json.RawMessage(`{"stream_name":"chat"}`)},
		{ID: "room", TriggerType: TriggerStream, FunctionID: "t::room", Config: json.RawMessage(`{"stream_name":"chat","group_id":"r2","item_id":"m9"}`)},
		{ID: "gated", TriggerType: TriggerStream, FunctionID: "t::gated", Config: json.RawMessage(`{"stream_name":"chat","condition_function_id":"t::cond"}`)},
	} {
		_, err := c.RegisterTrigger(td)
		assert.NilError(t, err)
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if len(f.w.trig.matching(TriggerStream, "chat", "r2", ptr("m9"))) < 3 {
			return poll.Continue("triggers not bound yet")
		}
		return poll.Success()
	}, poll.WithTimeout(waitFor))

	f.mustCall(t, "stream::set", `{"stream_name":"chat","group_id":"r1","item_id":"m1","data":{"t":1}}`)
	f.mustCall(t, "stream::set", `{"stream_name":"other","group_id":"r1","item_id":"m1","data":{"t":1}}`)
	f.mustCall(t, "stream::set", `{"stream_name":"chat","group_id":"r2","item_id":"m9","data":2}`)
	f.mustCall(t, "stream::delete", `{"stream_name":"chat","group_id":"r1","item_id":"m1"}`)

	got := all.wait(t, 3)
	assert.Equal(t, len(got), 3, "the other stream does not fire")
	ev := got[0]
	assert.Equal(t, ev["type"], "stream")
	assert.Equal(t, ev["streamName"], "chat")
	assert.Equal(t, ev["groupId"], "r1")
	assert.Equal(t, ev["id"], "m1")
	assert.DeepEqual(t, ev["event"], map[string]any{"type": "create", "data": map[string]any{"t": 1.0}})
	assert.DeepEqual(t, got[2]["event"], map[string]any{"type": "delete", "data": map[string]any{"t": 1.0}})
	rg := room.wait(t, 1)
	assert.Equal(t, len(rg), 1)
	assert.Equal(t, rg[0]["id"], "m9")
	assert.Assert(t, len(cond.wait(t, 3)) >= 3, "the condition sees each event")
	gated.mu.Lock()
	assert.Equal(t, len(gated.calls), 0, "a condition answering false skips the handler")
	gated.mu.Unlock()

	// A stream trigger without stream_name is refused to its originator.
	refused := make(chan error, 1)
	c2, err := client.Dial(context.Background(), f.url, client.Options{Name: "bad", IgnoreEnv: true,
		OnRegistrationError: func(err error) { refused <- err }})
	assert.NilError(t, err)
	defer c2.Close(context.Background())
	_, err = c2.RegisterTrigger(client.TriggerDef{ID: "nostream", TriggerType: TriggerStream, FunctionID: "t::all", Config: json.RawMessage(`{}`)})
	assert.NilError(t, err)
	select {
	case err := <-refused:
		assert.Assert(t, is.Contains(err.Error(), "stream_name is required"))
	case <-time.After(waitFor):
		t.Fatal("no refusal")
	}
}

func ptr[T any](v T) *T { return &v }

// sock is a client of the stream socket.
type sock struct {
	t    *testing.T
	conn *websocket.Conn
}

func dialStream(t *testing.T, addr string, h http.Header) (*sock, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, "ws://"+addr+"/", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		return nil, resp, err
	}
	conn.SetReadLimit(8 << 20)
	t.Cleanup(func() { conn.CloseNow() })
	return &sock{t: t, conn: conn}, resp, nil
}

func (s *sock) send(frame string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	assert.NilError(s.t, s.conn.Write(ctx, websocket.MessageText, []byte(frame)))
}

func (s *sock) next() map[string]any {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, data, err := s.conn.Read(ctx)
	assert.NilError(s.t, err)
	var m map[string]any
	assert.NilError(s.t, json.Unmarshal(data, &m))
	return m
}

func join(sub, streamName, group, id string) string {
	d := map[string]any{"subscriptionId": sub, "streamName": streamName, "groupId": group}
	if id != "" {
		d["id"] = id
	}
	b, _ := json.Marshal(map[string]any{"type": "join", "data": d})
	return string(b)
}

func TestSocketSubscriptions(t *testing.T) {
	f := start(t, Config{Limits: Limits{SubscriptionsPerConnection: 3, FrameBytes: 1024}})
	f.mustCall(t, "stream::set", `{"stream_name":"chat","group_id":"r1","item_id":"m1","data":"first"}`)
	s, _, err := dialStream(t, f.w.Addr(), nil)
	assert.NilError(t, err)

	// Junk is ignored, as upstream does.
	s.send("")
	s.send("not-json")
	s.send(`{"type":"subscribe"}`)
	s.send(join("g", "chat", "r1", ""))
	sync := s.next()
	assert.Equal(t, sync["streamName"], "chat")
	assert.DeepEqual(t, sync["event"], map[string]any{"type": "sync", "data": []any{"first"}})
	s.send(join("i", "chat", "r1", "m2"))
	sync = s.next()
	assert.Equal(t, sync["id"], "m2")
	assert.DeepEqual(t, sync["event"], map[string]any{"type": "sync", "data": nil})

	// m2 is covered by both subscriptions: delivered twice; m3 once.
	f.mustCall(t, "stream::set", `{"stream_name":"chat","group_id":"r1","item_id":"m2","data":"second"}`)
	for range 2 {
		ev := s.next()
		assert.Equal(t, ev["id"], "m2")
		assert.DeepEqual(t, ev["event"], map[string]any{"type": "create", "data": "second"})
	}
	f.mustCall(t, "stream::set", `{"stream_name":"chat","group_id":"other","item_id":"x","data":0}`)
	f.mustCall(t, "stream::send", `{"stream_name":"chat","group_id":"r1","type":"typing","data":{"who":"ann"}}`)
	ev := s.next()
	assert.DeepEqual(t, ev["event"], map[string]any{"type": "event", "event": map[string]any{"type": "typing", "data": map[string]any{"who": "ann"}}})

	// Leave: no more events for that subscription.
	s.send(`{"type":"leave","data":{"subscriptionId":"i","streamName":"chat","groupId":"r1","id":"m2"}}`)
	s.send(join("z", "barrier", "g", "")) // its sync shows the leave was applied
	assert.Equal(t, s.next()["streamName"], "barrier")
	f.mustCall(t, "stream::delete", `{"stream_name":"chat","group_id":"r1","item_id":"m2"}`)
	ev = s.next()
	assert.DeepEqual(t, ev["event"], map[string]any{"type": "delete", "data": "second"})
	f.mustCall(t, "stream::send", `{"stream_name":"chat","group_id":"r1","type":"marker","data":null}`)
	ev = s.next()
	assert.Equal(t, ev["event"].(map[string]any)["type"], "event", "the delete came once")

	// Past the subscription cap the connection is closed (policy).
	s.send(join("a", "chat", "r1", ""))
	s.next()
	s.send(join("a", "chat", "r1", "")) // joining again replaces
	s.next()
	s.send(join("b", "chat", "r1", ""))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, _, err = s.conn.Read(ctx)
	assert.Equal(t, websocket.CloseStatus(err), websocket.StatusPolicyViolation, "%v", err)

	// An oversized frame ends the connection too.
	s2, _, err := dialStream(t, f.w.Addr(), nil)
	assert.NilError(t, err)
	s2.send(`{"type":"join","data":{"x":"` + strings.Repeat("y", 2048) + `"}}`)
	_, _, err = s2.conn.Read(ctx)
	assert.Equal(t, websocket.CloseStatus(err), websocket.StatusMessageTooBig, "%v", err)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if n := f.w.hub.count(); n != 0 {
			return poll.Continue("%d connections", n)
		}
		return poll.Success()
	}, poll.WithTimeout(waitFor))
}

func TestSocketConnectionLimitAndOrigin(t *testing.T) {
	f := start(t, Config{Limits: Limits{Connections: 1}})
	_, _, err := dialStream(t, f.w.Addr(), nil)
	assert.NilError(t, err)
	_, resp, err := dialStream(t, f.w.Addr(), nil)
	assert.Assert(t, err != nil)
	assert.Equal(t, resp.StatusCode, http.StatusServiceUnavailable)

	g := start(t, Config{})
	_, resp, err = dialStream(t, g.w.Addr(), http.Header{"Origin": {"https://evil.example"}})
	assert.Assert(t, err != nil, "a page of another origin cannot open the socket")
	assert.Equal(t, resp.StatusCode, http.StatusForbidden)
	// A page that rebinds its name to 127.0.0.1 sends a matching Origin
	// but a foreign Host.
	for host, want := range map[string]int{
		"rebound.example:3112": http.StatusForbidden, "rebound.example": http.StatusForbidden,
		"localhost:3112": http.StatusSwitchingProtocols, "[::1]:3112": http.StatusSwitchingProtocols, "127.0.0.1": http.StatusSwitchingProtocols,
	} {
		assert.Equal(t, upgradeStatus(t, g.w.Addr(), host), want, host)
	}
}

func TestSocketAuthAndJoinTriggers(t *testing.T) {
	f := start(t, Config{AuthFunction: "auth::stream"})
	c := f.worker(t, "auth")
	auth := &recorder{reply: map[string]any{"context": map[string]any{"user": "ann"}}}
	_, err := c.RegisterFunction(client.FunctionDef{ID: "auth::stream"}, func(ctx context.Context, inv *client.Invocation) (any, error) {
		var in struct {
			Headers map[string]string `json:"headers"`
		}
		_ = json.Unmarshal(inv.Data, &in)
		if in.Headers["x-token"] != "letmein" {
			return nil, &client.Error{Code: "DENIED", Message: "bad token"}
		}
		return auth.handler(ctx, inv)
	})
	assert.NilError(t, err)
	joins, leaves := &recorder{reply: map[string]any{"unauthorized": false}}, &recorder{}
	_, err = c.RegisterFunction(client.FunctionDef{ID: "t::join"}, func(ctx context.Context, inv *client.Invocation) (any, error) {
		res, _ := joins.handler(ctx, inv)
		if strings.Contains(string(inv.Data), `"secret"`) {
			return map[string]any{"unauthorized": true}, nil
		}
		return res, nil
	})
	assert.NilError(t, err)
	_, err = c.RegisterFunction(client.FunctionDef{ID: "t::leave"}, leaves.handler)
	assert.NilError(t, err)
	_, err = c.RegisterTrigger(client.TriggerDef{TriggerType: TriggerJoin, FunctionID: "t::join"})
	assert.NilError(t, err)
	_, err = c.RegisterTrigger(client.TriggerDef{TriggerType: TriggerLeave, FunctionID: "t::leave", Config: json.RawMessage(`{}`)})
	assert.NilError(t, err)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if len(f.w.trig.matching(TriggerJoin, "x", "y", nil)) == 0 || len(f.w.trig.matching(TriggerLeave, "x", "y", nil)) == 0 {
			return poll.Continue("join/leave triggers not bound")
		}
		return poll.Success()
	}, poll.WithTimeout(waitFor))

	_, resp, err := dialStream(t, f.w.Addr(), nil)
	assert.Assert(t, err != nil, "no token, no socket")
	assert.Equal(t, resp.StatusCode, http.StatusUnauthorized)

	s, _, err := dialStream(t, f.w.Addr(), http.Header{"X-Token": {"letmein"}})
	assert.NilError(t, err)
	a := auth.wait(t, 1)[0]
	assert.Equal(t, a["path"], "/")
	assert.Assert(t, strings.HasPrefix(a["addr"].(string), "127.0.0.1:"))

	s.send(join("s1", "secret", "g", ""))
	ev := s.next()
	assert.DeepEqual(t, ev["event"], map[string]any{"type": "unauthorized"})
	s.send(join("s2", "chat", "g", ""))
	ev = s.next()
	assert.Equal(t, ev["event"].(map[string]any)["type"], "sync")
	j := joins.wait(t, 2)
	assert.Equal(t, j[1]["subscription_id"], "s2")
	assert.DeepEqual(t, j[1]["context"], map[string]any{"user": "ann"})

	// Disconnecting leaves the joined subscription (not the refused one).
	s.conn.Close(websocket.StatusNormalClosure, "")
	l := leaves.wait(t, 1)
	assert.Equal(t, l[0]["subscription_id"], "s2")
	assert.Equal(t, l[0]["stream_name"], "chat")
}

func TestCustomStreamOverride(t *testing.T) {
	f := start(t, Config{})
	c := f.worker(t, "custom")
	for _, op := range []string{"get", "set", "list"} {
		_, err := c.RegisterFunction(client.FunctionDef{ID: "stream::" + op + "(ext)"}, func(_ context.Context, inv *client.Invocation) (any, error) {
			switch op {
			case "set":
				return map[string]any{"old_value": nil, "new_value": "from-custom"}, nil
			case "get":
				return "custom-get", nil
			}
			return []string{"custom-list"}, nil
		})
		assert.NilError(t, err)
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if !f.eng.HasFunction("", "stream::list(ext)") || !f.eng.HasFunction("", "stream::set(ext)") || !f.eng.HasFunction("", "stream::get(ext)") {
			return poll.Continue("custom functions not registered yet")
		}
		return poll.Success()
	}, poll.WithTimeout(waitFor))
	assert.Equal(t, f.mustCall(t, "stream::set", `{"stream_name":"ext","group_id":"g","item_id":"i","data":1}`), `{"old_value":null,"new_value":"from-custom"}`)
	assert.Equal(t, f.mustCall(t, "stream::get", `{"stream_name":"ext","group_id":"g","item_id":"i"}`), `"custom-get"`)
	assert.Equal(t, f.mustCall(t, "stream::list", `{"stream_name":"ext","group_id":"g"}`), `["custom-list"]`)
	assert.Equal(t, f.mustCall(t, "stream::list_all", `{}`), `{"stream":[],"count":0}`, "the built-in store was not used")
}

func TestRestartKeepsData(t *testing.T) {
	dir := t.TempDir()
	eng := engine.New(engine.Options{})
	defer eng.Close(context.Background())
	ctx := context.Background()
	w, err := Start(ctx, eng, Options{Config: Config{Host: "127.0.0.1", StoreDir: dir, SaveInterval: time.Hour}})
	assert.NilError(t, err)
	_, err = eng.Invoke(ctx, "", "stream::set", json.RawMessage(`{"stream_name":"s","group_id":"g","item_id":"i","data":{"kept":true}}`))
	assert.NilError(t, err)
	assert.NilError(t, w.Close(ctx))
	_, err = eng.Invoke(ctx, "", "stream::get", json.RawMessage(`{"stream_name":"s","group_id":"g","item_id":"i"}`))
	assert.Assert(t, err != nil, "stream::* goes with the worker")

	w, err = Start(ctx, eng, Options{Config: Config{Host: "127.0.0.1", StoreDir: dir, SaveInterval: time.Hour}})
	assert.NilError(t, err)
	defer w.Close(ctx)
	res, err := eng.Invoke(ctx, "", "stream::get", json.RawMessage(`{"stream_name":"s","group_id":"g","item_id":"i"}`))
	assert.NilError(t, err)
	assert.Equal(t, string(res), `{"kept":true}`)
}

func TestStartFailsCleanly(t *testing.T) {
	eng := engine.New(engine.Options{})
	defer eng.Close(context.Background())
	first, err := Start(context.Background(), eng, Options{Config: Config{Host: "127.0.0.1"}})
	assert.NilError(t, err)
	defer first.Close(context.Background())
	// A second worker cannot take the name, and one on a taken port fails
	// with LISTEN_FAILED after undoing its registration.
	_, err = Start(context.Background(), eng, Options{Config: Config{Host: "127.0.0.1"}})
	assert.ErrorContains(t, err, "attach iii-stream")

	eng2 := engine.New(engine.Options{})
	defer eng2.Close(context.Background())
	port := first.Addr()[strings.LastIndex(first.Addr(), ":")+1:]
	var p int
	_, _ = fmtSscan(port, &p)
	_, err = Start(context.Background(), eng2, Options{Config: Config{Host: "127.0.0.1", Port: p}})
	assert.Equal(t, codeOf(t, err), CodeListenFailed)
	assert.Assert(t, !eng2.HasFunction("", "stream::set"))
}

func fmtSscan(s string, p *int) (int, error) { return fmt.Sscan(s, p) }

// upgradeStatus sends a WebSocket upgrade to addr with the given Host (and
// a matching Origin) and returns the status it gets.
func upgradeStatus(t *testing.T, addr, host string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	assert.NilError(t, err)
	req.Host = host
	req.Header.Set("Origin", "http://"+host)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: waitFor}
	resp, err := c.Do(req)
	assert.NilError(t, err)
	resp.Body.Close()
	c.CloseIdleConnections()
	return resp.StatusCode
}

// TestBuiltinIDsReserved: no worker may stand in for stream::* while the
// stream worker is stopped, and custom streams stay open to every worker.
func TestBuiltinIDsReserved(t *testing.T) {
	eng := engine.New(engine.Options{})
	srv := httptest.NewServer(eng.Handler())
	defer func() {
		srv.Close()
		assert.Check(t, eng.Close(context.Background()))
	}()
	refused := make(chan error, 4)
	c, err := client.Dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http"), client.Options{Name: "squatter", IgnoreEnv: true,
		OnRegistrationError: func(err error) { refused <- err }})
	assert.NilError(t, err)
	defer c.Close(context.Background())
	h := func(context.Context, *client.Invocation) (any, error) { return nil, nil }
	_, err = c.RegisterFunction(client.FunctionDef{ID: "stream::set"}, h)
	assert.NilError(t, err)
	_, err = c.RegisterFunction(client.FunctionDef{ID: "stream::set(mine)"}, h)
	assert.NilError(t, err)
	select {
	case err := <-refused:
		assert.Assert(t, is.Contains(err.Error(), "FORBIDDEN"), err.Error())
		assert.Assert(t, is.Contains(err.Error(), `"stream::set"`), err.Error())
	case <-time.After(waitFor):
		t.Fatal("stream::set was not refused")
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if !eng.HasFunction("", "stream::set(mine)") {
			return poll.Continue("the custom stream function is not registered")
		}
		return poll.Success()
	}, poll.WithTimeout(waitFor))
	assert.Assert(t, !eng.HasFunction("", "stream::set"))
}

// TestEnqueueDropsOldest: a client that does not read keeps the newest
// channel_size messages; the writer never blocks.
func TestEnqueueDropsOldest(t *testing.T) {
	c := &conn{out: make(chan *outItem, 3)}
	c.q.total = new(queuedTotal)
	for i := range 10 {
		c.enqueue([]byte(fmt.Sprint(i)))
	}
	var got []string
	for i := range 3 {
		got = append(got, string(c.q.take(waitfor.Recv(t, c.out, waitFor, fmt.Sprintf("queued frame %d of 3", i+1)))))
	}
	assert.DeepEqual(t, got, []string{"7", "8", "9"})
}

// TestTriggerWritingToItsOwnStream: a stream trigger that writes to the
// stream it watches while that stream's dispatch backlog is full neither
// stalls its own write nor anybody else's: writers never wait for
// triggers; the oldest waiting events are dropped (logged) instead.
func TestTriggerWritingToItsOwnStream(t *testing.T) {
	f := start(t, Config{})
	c := f.worker(t, "looper")
	release := make(chan struct{})
	echoed := make(chan error, 1)
	var mu sync.Mutex
	var seen []string
	first := true
	_, err := c.RegisterFunction(client.FunctionDef{ID: "t::loop"}, func(ctx context.Context, inv *client.Invocation) (any, error) {
		var ev struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(inv.Data, &ev)
		mu.Lock()
		seen = append(seen, ev.ID)
		wasFirst := first
		first = false
		mu.Unlock()
		if wasFirst {
			<-release
			// The backlog is full now: write to the stream this trigger
			// watches.
			start := time.Now()
			_, err := c.Call(ctx, "stream::set", map[string]any{"stream_name": "loop", "group_id": "g", "item_id": "echo", "data": 1})
			if err == nil && time.Since(start) > 5*time.Second {
				err = fmt.Errorf("the trigger's own write took %s", time.Since(start))
			}
			echoed <- err
		}
		return nil, nil
	})
	assert.NilError(t, err)
	_, err = c.RegisterTrigger(client.TriggerDef{ID: "loop", TriggerType: TriggerStream, FunctionID: "t::loop", Config: json.RawMessage(`{"stream_name":"loop"}`)})
	assert.NilError(t, err)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if len(f.w.trig.matching(TriggerStream, "loop", "g", ptr("x"))) == 0 {
			return poll.Continue("trigger not bound yet")
		}
		return poll.Success()
	}, poll.WithTimeout(waitFor))

	// Twice the backlog a dispatcher holds: no write waits for the
	// blocked trigger.
	n := 2 * triggerQueue / dispatchers
	// A write that waited for the blocked trigger would never return; no
	// timing is asserted.
	wrote := make(chan error, 1)
	go func() {
		for i := range n {
			if _, err := f.call(t, "stream::set", fmt.Sprintf(`{"stream_name":"loop","group_id":"g","item_id":"i%d","data":%d}`, i, i)); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	assert.NilError(t, waitfor.Recv(t, wrote, waitfor.Default, fmt.Sprintf("%d stream writes while a trigger blocks", n)))
	close(release)
	select {
	case err := <-echoed:
		assert.NilError(t, err)
	case <-time.After(waitFor):
		t.Fatal("the trigger's write to its own stream stalled")
	}
	// The newest events are delivered in order, the trigger's own write last.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 || seen[len(seen)-1] != "echo" {
			return poll.Continue("%d events delivered", len(seen))
		}
		return poll.Success()
	}, poll.WithTimeout(waitFor))
	mu.Lock()
	defer mu.Unlock()
	tail := seen[len(seen)-4:]
	assert.DeepEqual(t, tail, []string{fmt.Sprintf("i%d", n-3), fmt.Sprintf("i%d", n-2), fmt.Sprintf("i%d", n-1), "echo"})
	assert.Assert(t, len(seen) <= triggerQueue/dispatchers+2, "the oldest waiting events were dropped: %d delivered", len(seen))
}
