package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestDialHandshakeSendsMetadata(t *testing.T) {
	p := newPeer(t)
	o := testOptions()
	o.Name = "billing"
	o.Namespace = "orders"
	o.Description = "bills things"
	o.Isolation = "vm"
	o.Version = "9.9.9"
	ch := dialAsync(t, p.url(), o)
	pc := p.accept(t)
	pc.greet(t, "w-1", "tok-1")
	meta := expectRegister(t, pc)
	c, err := waitDial(t, ch)
	assert.NilError(t, err)

	assert.DeepEqual(t, meta, map[string]any{
		"runtime":     "go",
		"version":     "9.9.9",
		"name":        "billing",
		"description": "bills things",
		"os":          runtime.GOOS + " (" + runtime.GOARCH + ")",
		"pid":         float64(os.Getpid()),
		"isolation":   "vm",
		"namespace":   "orders",
	})
	assert.Equal(t, c.WorkerID(), "w-1")
	assert.Assert(t, c.Connected())
}

func TestOptionsDefaults(t *testing.T) {
	env := map[string]string{EnvWorkerName: "from-env", EnvNamespace: " dev ", EnvIsolation: "microvm"}
	getenv := func(k string) string { return env[k] }

	o, err := Options{}.withDefaults(getenv)
	assert.NilError(t, err)
	assert.Equal(t, o.Name, "from-env")
	assert.Equal(t, o.Namespace, "dev")
	assert.Equal(t, o.Isolation, "microvm")
	assert.Equal(t, o.Runtime, "go")
	assert.Equal(t, o.DialTimeout, DefaultDialTimeout)
	assert.Equal(t, o.PingInterval, DefaultPingInterval)
	assert.Equal(t, o.IdleTimeout, DefaultIdleTimeout)
	assert.Equal(t, o.CallTimeout, DefaultCallTimeout)
	assert.DeepEqual(t, o.Reconnect, ReconnectPolicy{Initial: time.Second, Multiplier: 2, Max: 30 * time.Second, Jitter: 0.3})

	o, err = Options{IgnoreEnv: true}.withDefaults(getenv)
	assert.NilError(t, err)
	host, _ := os.Hostname()
	assert.Equal(t, o.Name, fmt.Sprintf("%s:%d", host, os.Getpid()))
	assert.Equal(t, o.Namespace, "")
	assert.Equal(t, o.Isolation, "")

	o, err = Options{Name: "explicit", Namespace: "ns"}.withDefaults(getenv)
	assert.NilError(t, err)
	assert.Equal(t, o.Name, "explicit")
	assert.Equal(t, o.Namespace, "ns")

	for _, bad := range []string{"Dev", "a b", "é", "x/y"} {
		_, err := Options{Namespace: bad}.withDefaults(getenv)
		assert.Equal(t, CodeOf(err), CodeInvalidNamespace, bad)
	}
}

func TestReconnectDelay(t *testing.T) {
	p := ReconnectPolicy{Initial: time.Second, Multiplier: 2, Max: 30 * time.Second, Jitter: 0.3}
	tests := []struct {
		attempt int
		r       float64
		want    time.Duration
	}{
		{0, 0.5, time.Second},
		{1, 0.5, 2 * time.Second},
		{4, 0.5, 16 * time.Second},
		{5, 0.5, 30 * time.Second},
		{500, 0.5, 30 * time.Second},
		{0, 0, 700 * time.Millisecond},
		{0, 1, 1300 * time.Millisecond},
		{10, 0, 21 * time.Second},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%d-%v", tc.attempt, tc.r), func(t *testing.T) {
			assert.Equal(t, p.delay(tc.attempt, tc.r), tc.want)
		})
	}
	assert.Assert(t, !p.exhausted(100))
	assert.Assert(t, ReconnectPolicy{MaxAttempts: 3}.exhausted(3))
	assert.Assert(t, !ReconnectPolicy{MaxAttempts: 3}.exhausted(2))
	assert.Assert(t, ReconnectPolicy{Disable: true}.exhausted(0))
}

func TestEngineURL(t *testing.T) {
	tests := []struct {
		in, want, code string
	}{
		{in: "ws://127.0.0.1:49134", want: "ws://127.0.0.1:49134"},
		{in: "http://localhost:1/x", want: "ws://localhost:1/x"},
		{in: "https://h", want: "wss://h"},
		{in: "wss://h:2", want: "wss://h:2"},
		{in: "tcp://h", code: CodeInvalidArgument},
		{in: "ws://", code: CodeInvalidArgument},
		{in: "::", code: CodeInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			u, err := engineURL(tc.in)
			if tc.code != "" {
				assert.Equal(t, CodeOf(err), tc.code)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, u.String(), tc.want)
		})
	}
}

func TestDialUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	addr := l.Addr().String()
	assert.NilError(t, l.Close())

	_, err = Dial(context.Background(), "ws://"+addr, testOptions())
	assert.Equal(t, CodeOf(err), CodeEngineUnreachable)
	assert.Equal(t, err.Error(), "cannot reach the engine at ws://"+addr+": connection refused")
}

func TestDialNotAWebSocket(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	_, err := Dial(context.Background(), srv.URL, testOptions())
	assert.Equal(t, CodeOf(err), CodeEngineUnreachable)
	assert.ErrorContains(t, err, "answered HTTP 404")
}

func TestDialGreetingErrors(t *testing.T) {
	tests := []struct {
		name  string
		frame string
		code  string
	}{
		{"auth error frame", `{"type":"error","error":{"code":"AUTH_ERROR","message":"bad token"}}`, "AUTH_ERROR"},
		{"wrong first frame", `{"type":"pong"}`, CodeHandshakeFailed},
		{"not json", `hello`, CodeHandshakeFailed},
		{"no worker id", `{"type":"workerregistered"}`, CodeHandshakeFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPeer(t)
			ch := dialAsync(t, p.url(), testOptions())
			pc := p.accept(t)
			pc.sendRaw(t, tc.frame)
			_, err := waitDial(t, ch)
			assert.Equal(t, CodeOf(err), tc.code, "%v", err)
		})
	}
}

func TestDialRetriesUntilEngineGreets(t *testing.T) {
	p := newPeer(t)
	o := testOptions()
	o.Reconnect = ReconnectPolicy{Initial: time.Millisecond, Max: 5 * time.Millisecond}
	ch := dialAsync(t, p.url(), o)
	first := p.accept(t)
	assert.NilError(t, first.conn.CloseNow()) // the engine drops the first attempt
	pc := p.accept(t)
	pc.greet(t, "w-2", "tok-2")
	expectRegister(t, pc)
	c, err := waitDial(t, ch)
	assert.NilError(t, err)
	assert.Equal(t, c.WorkerID(), "w-2")
}

func TestHandlers(t *testing.T) {
	p := newPeer(t)
	c, pc := connect(t, p, testOptions())

	register := func(id string, h Handler) {
		t.Helper()
		_, err := c.RegisterFunction(FunctionDef{ID: id}, h)
		assert.NilError(t, err)
		assert.Equal(t, expect[*protocol.RegisterFunction](t, pc).ID, id)
	}
	register("t::echo", func(_ context.Context, inv *Invocation) (any, error) { return inv.Data, nil })
	register("t::struct", func(context.Context, *Invocation) (any, error) { return map[string]int{"n": 1}, nil })
	register("t::nil", func(context.Context, *Invocation) (any, error) { return nil, nil })
	register("t::coded", func(context.Context, *Invocation) (any, error) {
		return nil, &protocol.ErrorBody{Code: "E_COLD", Message: "too cold", Stacktrace: "st"}
	})
	register("t::wrapped", func(context.Context, *Invocation) (any, error) {
		return nil, fmt.Errorf("outer: %w", &protocol.ErrorBody{Code: "E_INNER", Message: "inner"})
	})
	register("t::plain", func(context.Context, *Invocation) (any, error) { return nil, errors.New("boom") })
	register("t::panic", func(context.Context, *Invocation) (any, error) { panic("kaput") })
	register("t::badjson", func(context.Context, *Invocation) (any, error) { return json.RawMessage(`{`), nil })
	register("t::unencodable", func(context.Context, *Invocation) (any, error) { return func() {}, nil })
	register("t::meta", func(_ context.Context, inv *Invocation) (any, error) {
		return map[string]any{"id": inv.ID, "fn": inv.FunctionID, "meta": inv.Metadata, "tp": inv.Traceparent, "ns": inv.Namespace}, nil
	})
	_, err := c.RegisterFunction(FunctionDef{ID: "t::http", HTTP: &protocol.HTTPInvocationRef{URL: "http://127.0.0.1:1/x"}}, nil)
	assert.NilError(t, err)
	assert.Assert(t, expect[*protocol.RegisterFunction](t, pc).Invocation != nil)

	ns := "orders"
	tests := []struct {
		name    string
		invoke  protocol.InvokeFunction
		result  string
		errBody *protocol.ErrorBody
		errLike string // prefix of the message when it is not fixed
	}{
		{name: "raw result", invoke: protocol.InvokeFunction{FunctionID: "t::echo", Data: json.RawMessage(`{"a":[1,2]}`)}, result: `{"a":[1,2]}`},
		{name: "struct result", invoke: protocol.InvokeFunction{FunctionID: "t::struct"}, result: `{"n":1}`},
		{name: "nil result", invoke: protocol.InvokeFunction{FunctionID: "t::nil"}, result: ``},
		{name: "coded error verbatim", invoke: protocol.InvokeFunction{FunctionID: "t::coded"},
			errBody: &protocol.ErrorBody{Code: "E_COLD", Message: "too cold", Stacktrace: "st"}},
		{name: "wrapped coded error", invoke: protocol.InvokeFunction{FunctionID: "t::wrapped"},
			errBody: &protocol.ErrorBody{Code: "E_INNER", Message: "inner"}},
		{name: "plain error", invoke: protocol.InvokeFunction{FunctionID: "t::plain"},
			errBody: &protocol.ErrorBody{Code: protocol.CodeInvocationFailed, Message: "boom"}},
		{name: "panic", invoke: protocol.InvokeFunction{FunctionID: "t::panic"},
			errBody: &protocol.ErrorBody{Code: protocol.CodeInvocationFailed}, errLike: "handler of t::panic panicked: kaput"},
		{name: "invalid raw json", invoke: protocol.InvokeFunction{FunctionID: "t::badjson"},
			errBody: &protocol.ErrorBody{Code: CodeSerialization}, errLike: "the result of t::badjson cannot be encoded"},
		{name: "unencodable result", invoke: protocol.InvokeFunction{FunctionID: "t::unencodable"},
			errBody: &protocol.ErrorBody{Code: CodeSerialization}, errLike: "the result of t::unencodable cannot be encoded"},
		{name: "unknown function", invoke: protocol.InvokeFunction{FunctionID: "t::nope"},
			errBody: &protocol.ErrorBody{Code: protocol.CodeFunctionNotFound, Message: "Function t::nope is not served by this worker"}},
		{name: "http function", invoke: protocol.InvokeFunction{FunctionID: "t::http"},
			errBody: &protocol.ErrorBody{Code: protocol.CodeFunctionNotInvokable}, errLike: "Function t::http is HTTP-invoked"},
		{name: "invocation fields", invoke: protocol.InvokeFunction{FunctionID: "t::meta", Metadata: json.RawMessage(`{"k":"v"}`),
			Traceparent: "00-abc", Namespace: &ns},
			result: `{"fn":"t::meta","id":"inv-11","meta":{"k":"v"},"ns":"orders","tp":"00-abc"}`},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv := tc.invoke
			inv.InvocationID = fmt.Sprintf("inv-%d", i)
			pc.send(t, &inv)
			res := expect[*protocol.InvocationResult](t, pc)
			assert.Equal(t, res.InvocationID, inv.InvocationID)
			assert.Equal(t, res.FunctionID, inv.FunctionID)
			if tc.errBody == nil {
				assert.Assert(t, res.Error == nil, "%+v", res.Error)
				got := string(res.Result)
				if got == "null" {
					got = ""
				}
				assert.Equal(t, got, tc.result)
				return
			}
			assert.Assert(t, res.Error != nil)
			assert.Equal(t, res.Error.Code, tc.errBody.Code)
			if tc.errLike != "" {
				assert.Assert(t, strings.HasPrefix(res.Error.Message, tc.errLike), res.Error.Message)
			} else {
				assert.Equal(t, res.Error.Message, tc.errBody.Message)
				assert.Equal(t, res.Error.Stacktrace, tc.errBody.Stacktrace)
			}
			if tc.name == "panic" {
				assert.Assert(t, is.Contains(res.Error.Stacktrace, "goroutine"))
			}
		})
	}

	t.Run("void invocation gets no reply", func(t *testing.T) {
		pc.send(t, &protocol.InvokeFunction{FunctionID: "t::plain", Action: &protocol.TriggerAction{Type: protocol.ActionVoid}})
		pc.send(t, &protocol.InvokeFunction{FunctionID: "t::nope"})
		// The engine's ping is answered on the read loop; had either void
		// invocation produced a frame it would come first (the handler of
		// the first is the only asynchronous part, so ping after it ran).
		pc.send(t, &protocol.Ping{})
		expect[*protocol.Pong](t, pc)
		pc.send(t, &protocol.InvokeFunction{InvocationID: "after-void", FunctionID: "t::nil"})
		assert.Equal(t, expect[*protocol.InvocationResult](t, pc).InvocationID, "after-void")
	})

	t.Run("undecodable invocation answered with invalid_frame", func(t *testing.T) {
		pc.sendRaw(t, `{"type":"invokefunction","invocation_id":"bad-1","function_id":"t::echo","data":{},"action":7}`)
		res := expect[*protocol.InvocationResult](t, pc)
		assert.Equal(t, res.InvocationID, "bad-1")
		assert.Equal(t, res.Error.Code, protocol.CodeInvalidFrame)
		pc.sendRaw(t, `{"type":"nonsense"}`)
		pc.sendRaw(t, `[1,2`)
		pc.send(t, &protocol.Ping{})
		expect[*protocol.Pong](t, pc)
	})
}

func TestHandlerContextEndsWithConnection(t *testing.T) {
	p := newPeer(t)
	c, pc := connect(t, p, testOptions())
	started := make(chan struct{})
	ended := make(chan error, 1)
	_, err := c.RegisterFunction(FunctionDef{ID: "t::block"}, func(ctx context.Context, _ *Invocation) (any, error) {
		close(started)
		<-ctx.Done()
		ended <- ctx.Err()
		return nil, ctx.Err()
	})
	assert.NilError(t, err)
	expect[*protocol.RegisterFunction](t, pc)
	pc.send(t, &protocol.InvokeFunction{InvocationID: "i", FunctionID: "t::block"})
	waitfor.Closed(t, started, waitLimit, "the handler to start")
	assert.NilError(t, pc.conn.CloseNow())
	select {
	case err := <-ended:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(waitLimit):
		t.Fatal("handler context not cancelled")
	}
	waitfor.Closed(t, c.Done(), waitLimit, "the client to end with its connection")
}

func TestCallNamespaces(t *testing.T) {
	tests := []struct {
		name      string
		workerNS  string
		fn        string
		opts      []CallOption
		wantNS    *string
		wantNoNS  bool
		explicitN string
	}{
		{name: "no worker namespace", fn: "math::add", wantNoNS: true},
		{name: "worker namespace carried", workerNS: "orders", fn: "math::add", explicitN: "orders"},
		{name: "engine calls stay default", workerNS: "orders", fn: "engine::functions::list", wantNoNS: true},
		{name: "explicit wins", workerNS: "orders", fn: "math::add", opts: []CallOption{WithNamespace("billing")}, explicitN: "billing"},
		{name: "explicit on engine call", workerNS: "orders", fn: "engine::functions::info", opts: []CallOption{WithNamespace("x")}, explicitN: "x"},
		{name: "explicit without worker namespace", fn: "a::b", opts: []CallOption{WithNamespace("dev")}, explicitN: "dev"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPeer(t)
			o := testOptions()
			o.Namespace = tc.workerNS
			c, pc := connect(t, p, o)
			ch := callAsync(c, tc.fn, map[string]int{"a": 1}, tc.opts...)
			inv := expect[*protocol.InvokeFunction](t, pc)
			assert.Equal(t, inv.FunctionID, tc.fn)
			assert.Equal(t, string(inv.Data), `{"a":1}`)
			assert.Assert(t, inv.InvocationID != "")
			assert.Assert(t, inv.Action == nil)
			if tc.wantNoNS {
				assert.Assert(t, inv.Namespace == nil, "namespace %v", inv.Namespace)
			} else {
				assert.Assert(t, inv.Namespace != nil)
				assert.Equal(t, *inv.Namespace, tc.explicitN)
			}
			pc.send(t, &protocol.InvocationResult{InvocationID: inv.InvocationID, FunctionID: tc.fn, Result: json.RawMessage(`{"ok":true}`)})
			r := waitCall(t, ch)
			assert.NilError(t, r.err)
			assert.Equal(t, string(r.res), `{"ok":true}`)
		})
	}
}

func TestCallOutcomes(t *testing.T) {
	p := newPeer(t)
	c, pc := connect(t, p, testOptions())

	t.Run("remote error", func(t *testing.T) {
		ch := callAsync(c, "x::fail", nil)
		inv := expect[*protocol.InvokeFunction](t, pc)
		assert.Assert(t, inv.Data == nil)
		pc.send(t, &protocol.InvocationResult{InvocationID: inv.InvocationID, FunctionID: "x::fail",
			Error: &protocol.ErrorBody{Code: "function_not_found", Message: "Function x::fail not found in namespace default."}})
		r := waitCall(t, ch)
		var eb *protocol.ErrorBody
		assert.Assert(t, errors.As(r.err, &eb))
		assert.DeepEqual(t, *eb, protocol.ErrorBody{Code: "function_not_found", Message: "Function x::fail not found in namespace default."})
		assert.Equal(t, CodeOf(r.err), "function_not_found")
	})

	t.Run("null result", func(t *testing.T) {
		ch := callAsync(c, "x::null", json.RawMessage(`[1]`))
		inv := expect[*protocol.InvokeFunction](t, pc)
		assert.Equal(t, string(inv.Data), `[1]`)
		pc.sendRaw(t, fmt.Sprintf(`{"type":"invocationresult","invocation_id":%q,"function_id":"x::null","result":null}`, inv.InvocationID))
		r := waitCall(t, ch)
		assert.NilError(t, r.err)
		assert.Assert(t, r.res == nil)
	})

	t.Run("void", func(t *testing.T) {
		res, err := c.Call(context.Background(), "x::fire", "hi", Void())
		assert.NilError(t, err)
		assert.Assert(t, res == nil)
		inv := expect[*protocol.InvokeFunction](t, pc)
		assert.Equal(t, inv.InvocationID, "")
		assert.Equal(t, inv.Action.Type, protocol.ActionVoid)
		assert.Equal(t, string(inv.Data), `"hi"`)
	})

	t.Run("metadata", func(t *testing.T) {
		ch := callAsync(c, "x::m", nil, WithMetadata(json.RawMessage(`{"m":1}`)))
		inv := expect[*protocol.InvokeFunction](t, pc)
		assert.Equal(t, string(inv.Metadata), `{"m":1}`)
		pc.send(t, &protocol.InvocationResult{InvocationID: inv.InvocationID, Result: json.RawMessage(`2`)})
		assert.Equal(t, string(waitCall(t, ch).res), `2`)
	})

	t.Run("timeout then late result dropped", func(t *testing.T) {
		_, err := c.Call(context.Background(), "x::slow", nil, WithTimeout(20*time.Millisecond))
		assert.Equal(t, CodeOf(err), CodeTimeout)
		assert.Equal(t, err.Error(), "no result from x::slow within 20 ms")
		inv := expect[*protocol.InvokeFunction](t, pc)
		pc.send(t, &protocol.InvocationResult{InvocationID: inv.InvocationID, Result: json.RawMessage(`1`)})
		// The client is still healthy afterwards.
		ch := callAsync(c, "x::after", nil)
		inv = expect[*protocol.InvokeFunction](t, pc)
		pc.send(t, &protocol.InvocationResult{InvocationID: inv.InvocationID, Result: json.RawMessage(`3`)})
		assert.Equal(t, string(waitCall(t, ch).res), `3`)
	})

	t.Run("context cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		ch := make(chan error, 1)
		go func() {
			_, err := c.Call(ctx, "x::hang", nil)
			ch <- err
		}()
		expect[*protocol.InvokeFunction](t, pc)
		cancel()
		select {
		case err := <-ch:
			assert.ErrorIs(t, err, context.Canceled)
		case <-time.After(waitLimit):
			t.Fatal("Call ignored its context")
		}
	})

	t.Run("bad arguments", func(t *testing.T) {
		_, err := c.Call(context.Background(), "", nil)
		assert.Equal(t, CodeOf(err), CodeInvalidArgument)
		_, err = c.Call(context.Background(), "x::y", func() {})
		assert.Equal(t, CodeOf(err), CodeSerialization)
		_, err = c.Call(context.Background(), "x::y", json.RawMessage(`{`))
		assert.Equal(t, CodeOf(err), CodeSerialization)
	})

	t.Run("concurrent calls", func(t *testing.T) {
		const n = 50
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := c.Call(context.Background(), "x::sq", i)
				if err != nil {
					errs <- err
					return
				}
				if string(res) != fmt.Sprint(i*i) {
					errs <- fmt.Errorf("call %d got %s", i, res)
				}
			}()
		}
		for range n {
			inv := expect[*protocol.InvokeFunction](t, pc)
			var v int
			assert.NilError(t, json.Unmarshal(inv.Data, &v))
			pc.send(t, &protocol.InvocationResult{InvocationID: inv.InvocationID, Result: json.RawMessage(fmt.Sprint(v * v))})
		}
		waitfor.Group(t, &wg, waitLimit, "the concurrent calls to return")
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

func TestDisconnectFailsWrittenCalls(t *testing.T) {
	p := newPeer(t)
	c, pc := connect(t, p, testOptions())
	ch := callAsync(c, "x::pending", nil)
	expect[*protocol.InvokeFunction](t, pc)
	assert.NilError(t, pc.conn.CloseNow())

	r := waitCall(t, ch)
	assert.Equal(t, CodeOf(r.err), CodeConnectionLost)
	assert.ErrorContains(t, r.err, "connection to the engine lost before x::pending answered")

	waitfor.Closed(t, c.Done(), waitLimit, "the client to end once reconnecting gave up")
	assert.Equal(t, CodeOf(c.Err()), CodeConnectionLost)
	_, err := c.Call(context.Background(), "x::later", nil)
	assert.Equal(t, CodeOf(err), CodeConnectionLost)
	_, err = c.RegisterFunction(FunctionDef{ID: "late"}, func(context.Context, *Invocation) (any, error) { return nil, nil })
	assert.Equal(t, CodeOf(err), CodeConnectionLost)
}

func TestReconnectReattachesAndReregisters(t *testing.T) {
	p := newPeer(t)
	o := testOptions()
	o.Reconnect = ReconnectPolicy{Initial: time.Millisecond, Max: 5 * time.Millisecond}
	o.Namespace = "orders"
	c, pc := connect(t, p, o)

	h := func(_ context.Context, inv *Invocation) (any, error) { return inv.Data, nil }
	_, err := c.RegisterTriggerType(TriggerTypeDef{ID: "tick"}, nopTrigger{})
	assert.NilError(t, err)
	expect[*protocol.RegisterTriggerType](t, pc)
	_, err = c.RegisterFunction(FunctionDef{ID: "f::one"}, h)
	assert.NilError(t, err)
	expect[*protocol.RegisterFunction](t, pc)
	_, err = c.RegisterTrigger(TriggerDef{ID: "tr-1", TriggerType: "tick", FunctionID: "f::one"})
	assert.NilError(t, err)
	expect[*protocol.RegisterTrigger](t, pc)

	inFlight := callAsync(c, "x::inflight", nil)
	expect[*protocol.InvokeFunction](t, pc)

	assert.NilError(t, pc.conn.CloseNow())
	r := waitCall(t, inFlight)
	assert.Equal(t, CodeOf(r.err), CodeConnectionLost)

	// The client is now dialling again; the peer holds the greeting back, so
	// the client is disconnected while these happen.
	pc2 := p.accept(t)
	assert.Assert(t, !c.Connected())
	unregisterTwo, err := c.RegisterFunction(FunctionDef{ID: "f::two"}, h)
	assert.NilError(t, err)
	_, err = c.RegisterFunction(FunctionDef{ID: "f::three"}, h)
	assert.NilError(t, err)
	unregisterTwo()
	queuedLen := func(n int) poll.Check {
		return func(poll.LogT) poll.Result {
			c.mu.Lock()
			defer c.mu.Unlock()
			if len(c.queue) == n {
				return poll.Success()
			}
			return poll.Continue("%d frames queued", len(c.queue))
		}
	}
	queued := callAsync(c, "x::queued", map[string]bool{"q": true})
	poll.WaitOn(t, queuedLen(1))
	queuedVoid := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), "x::queued-void", nil, Void())
		queuedVoid <- err
	}()
	poll.WaitOn(t, queuedLen(2))

	pc2.greet(t, "w-2", "tok-2")
	re := expect[*protocol.Reattach](t, pc2)
	assert.DeepEqual(t, *re, protocol.Reattach{PreviousWorkerID: "w-1", ReattachToken: "tok-1"})
	assert.Equal(t, expect[*protocol.RegisterTriggerType](t, pc2).ID, "tick")
	assert.Equal(t, expect[*protocol.RegisterFunction](t, pc2).ID, "f::one")
	assert.Equal(t, expect[*protocol.RegisterFunction](t, pc2).ID, "f::three")
	tr := expect[*protocol.RegisterTrigger](t, pc2)
	assert.Equal(t, tr.ID, "tr-1")
	assert.Equal(t, *tr.Namespace, "orders")
	meta := expectRegister(t, pc2)
	assert.Equal(t, meta["namespace"], "orders")

	// Calls that never reached the engine go out after the handshake, in order.
	inv := expect[*protocol.InvokeFunction](t, pc2)
	assert.Equal(t, inv.FunctionID, "x::queued")
	assert.Equal(t, *inv.Namespace, "orders")
	void := expect[*protocol.InvokeFunction](t, pc2)
	assert.Equal(t, void.FunctionID, "x::queued-void")
	assert.NilError(t, waitfor.Recv(t, queuedVoid, waitLimit, "the queued void call to return"))
	pc2.send(t, &protocol.InvocationResult{InvocationID: inv.InvocationID, Result: json.RawMessage(`"again"`)})
	r = waitCall(t, queued)
	assert.NilError(t, r.err)
	assert.Equal(t, string(r.res), `"again"`)
	assert.Equal(t, c.WorkerID(), "w-2")
	assert.Assert(t, c.Connected())

	// A third connection reattaches with the second one's credentials.
	assert.NilError(t, pc2.conn.CloseNow())
	pc3 := p.accept(t)
	pc3.greet(t, "w-3", "tok-3")
	assert.DeepEqual(t, *expect[*protocol.Reattach](t, pc3), protocol.Reattach{PreviousWorkerID: "w-2", ReattachToken: "tok-2"})
}

type nopTrigger struct{}

func (nopTrigger) RegisterTrigger(context.Context, TriggerRegistration) error   { return nil }
func (nopTrigger) UnregisterTrigger(context.Context, TriggerRegistration) error { return nil }

func TestReconnectGivesUp(t *testing.T) {
	p := newPeer(t)
	o := testOptions()
	o.Reconnect = ReconnectPolicy{Initial: time.Millisecond, Max: 2 * time.Millisecond, MaxAttempts: 2}
	c, pc := connect(t, p, o)
	// Every later attempt is refused.
	p.refuse.Store(true)
	assert.NilError(t, pc.conn.CloseNow())
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if c.Connected() {
			return poll.Continue("still connected")
		}
		return poll.Success()
	})
	queued := callAsync(c, "x::y", nil)
	select {
	case <-c.Done():
	case <-time.After(waitLimit):
		t.Fatal("the client never gave up")
	}
	assert.Equal(t, CodeOf(c.Err()), CodeConnectionLost)
	assert.ErrorContains(t, c.Err(), "gave up reconnecting to the engine at "+p.url()+" after 2 attempts")
	assert.Equal(t, CodeOf(waitCall(t, queued).err), CodeConnectionLost)
}

func TestWorkerNamespaceConflictStops(t *testing.T) {
	p := newPeer(t)
	o := testOptions()
	o.Reconnect = ReconnectPolicy{Initial: time.Millisecond}
	reported := make(chan error, 1)
	o.OnRegistrationError = func(err error) { reported <- err }
	c, pc := connect(t, p, o)
	pending := callAsync(c, "x::y", nil)
	expect[*protocol.InvokeFunction](t, pc)

	pc.send(t, &protocol.RegistrationRejected{Code: protocol.CodeWorkerNamespaceConflict, Namespace: "default",
		WorkerName: "test-worker", OwnerWorkerID: "w-0"})
	waitfor.Closed(t, c.Done(), waitLimit, "the rejected client to end")
	var re *RejectionError
	assert.Assert(t, errors.As(c.Err(), &re))
	assert.Equal(t, re.Code, protocol.CodeWorkerNamespaceConflict)
	assert.Equal(t, c.Err().Error(), `WORKER_NAMESPACE_CONFLICT: worker name "test-worker" is already in use in namespace "default" (by worker w-0); stop that worker or choose another name`)
	assert.Assert(t, errors.As(waitCall(t, pending).err, &re))
	assert.Assert(t, errors.As(waitfor.Recv(t, reported, waitLimit, "the rejection to be reported"), &re))
	pc.waitClosed(t)

	closeClient(t, c)
	// Close waited for the supervisor, so no reconnect can come any more.
	assert.Equal(t, len(p.conns), 0, "the client reconnected after WORKER_NAMESPACE_CONFLICT")
}

func TestFunctionNamespaceConflictReported(t *testing.T) {
	p := newPeer(t)
	o := testOptions()
	reported := make(chan error, 1)
	o.OnRegistrationError = func(err error) { reported <- err }
	c, pc := connect(t, p, o)
	_, err := c.RegisterFunction(FunctionDef{ID: "state::get"}, func(context.Context, *Invocation) (any, error) { return nil, nil })
	assert.NilError(t, err)
	expect[*protocol.RegisterFunction](t, pc)
	pc.send(t, &protocol.RegistrationRejected{Code: protocol.CodeFuncNamespaceConflict, Namespace: "orders",
		FunctionID: "state::get", OwnerWorkerID: "w-9"})

	got := waitfor.Recv(t, reported, waitLimit, "the function rejection to be reported")
	assert.Equal(t, got.Error(), `FUNCTION_NAMESPACE_CONFLICT: function "state::get" is already registered in namespace "orders" by worker w-9`)
	assert.Equal(t, CodeOf(c.RegistrationError("state::get")), protocol.CodeFuncNamespaceConflict)
	assert.NilError(t, c.RegistrationError("other"))

	// The connection stays usable.
	ch := callAsync(c, "x::y", nil)
	inv := expect[*protocol.InvokeFunction](t, pc)
	pc.send(t, &protocol.InvocationResult{InvocationID: inv.InvocationID, Result: json.RawMessage(`1`)})
	assert.NilError(t, waitCall(t, ch).err)
	assert.Assert(t, c.Err() == nil)

	pc.send(t, &protocol.RegistrationRejected{Code: protocol.CodeFuncNamespaceConflict, Namespace: "x", FunctionID: "engine::mine"})
	assert.Equal(t, waitfor.Recv(t, reported, waitLimit, "the engine::* rejection to be reported").Error(), `FUNCTION_NAMESPACE_CONFLICT: the engine refused function "engine::mine" in namespace "x" (engine::* ids belong to namespace "default")`)
}

func TestConfirmRegistration(t *testing.T) {
	t.Run("accepted", func(t *testing.T) {
		p := newPeer(t)
		o := testOptions()
		o.ConfirmRegistration = true
		ch := dialAsync(t, p.url(), o)
		pc := p.accept(t)
		pc.greet(t, "w-1", "tok-1")
		inv := expect[*protocol.InvokeFunction](t, pc)
		assert.Equal(t, inv.FunctionID, fnRegisterWorker)
		assert.Assert(t, inv.InvocationID != "" && inv.Action == nil)
		pc.send(t, &protocol.InvocationResult{InvocationID: inv.InvocationID, Result: json.RawMessage(`{"success":true}`)})
		_, err := waitDial(t, ch)
		assert.NilError(t, err)
	})
	t.Run("name taken", func(t *testing.T) {
		p := newPeer(t)
		o := testOptions()
		o.ConfirmRegistration = true
		o.Reconnect = ReconnectPolicy{Initial: time.Millisecond}
		ch := dialAsync(t, p.url(), o)
		pc := p.accept(t)
		pc.greet(t, "w-1", "tok-1")
		expect[*protocol.InvokeFunction](t, pc)
		pc.send(t, &protocol.RegistrationRejected{Code: protocol.CodeWorkerNamespaceConflict, WorkerName: "test-worker", OwnerWorkerID: "w-0"})
		_, err := waitDial(t, ch)
		assert.Equal(t, CodeOf(err), protocol.CodeWorkerNamespaceConflict)
		assert.Equal(t, len(p.conns), 0)
	})
	t.Run("engine error", func(t *testing.T) {
		p := newPeer(t)
		o := testOptions()
		o.ConfirmRegistration = true
		ch := dialAsync(t, p.url(), o)
		pc := p.accept(t)
		pc.greet(t, "w-1", "tok-1")
		inv := expect[*protocol.InvokeFunction](t, pc)
		pc.send(t, &protocol.InvocationResult{InvocationID: inv.InvocationID, Error: &protocol.ErrorBody{Code: "INVALID_NAMESPACE", Message: "no"}})
		_, err := waitDial(t, ch)
		assert.Equal(t, CodeOf(err), "INVALID_NAMESPACE")
	})
}

func TestUnregisterFunction(t *testing.T) {
	p := newPeer(t)
	c, pc := connect(t, p, testOptions())
	unregister, err := c.RegisterFunction(FunctionDef{ID: "f::x", Description: "d", RequestSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *Invocation) (any, error) { return 1, nil })
	assert.NilError(t, err)
	reg := expect[*protocol.RegisterFunction](t, pc)
	assert.Equal(t, reg.Description, "d")
	assert.Equal(t, string(reg.RequestFormat), `{"type":"object"}`)

	_, err = c.RegisterFunction(FunctionDef{ID: "f::x"}, func(context.Context, *Invocation) (any, error) { return 1, nil })
	assert.Equal(t, CodeOf(err), CodeInvalidArgument)

	unregister()
	unregister() // idempotent
	assert.Equal(t, expect[*protocol.UnregisterFunction](t, pc).ID, "f::x")
	pc.send(t, &protocol.InvokeFunction{InvocationID: "i", FunctionID: "f::x"})
	assert.Equal(t, expect[*protocol.InvocationResult](t, pc).Error.Code, protocol.CodeFunctionNotFound)

	bad := []FunctionDef{{}, {ID: "x", RequestSchema: json.RawMessage(`{`)}, {ID: "y", Metadata: json.RawMessage(`nope`)}}
	for _, def := range bad {
		_, err := c.RegisterFunction(def, func(context.Context, *Invocation) (any, error) { return nil, nil })
		assert.Equal(t, CodeOf(err), CodeInvalidArgument)
	}
	_, err = c.RegisterFunction(FunctionDef{ID: "z"}, nil)
	assert.Equal(t, CodeOf(err), CodeInvalidArgument)
}

type recordingTrigger struct {
	mu     sync.Mutex
	seen   []string
	refuse error
}

func (r *recordingTrigger) RegisterTrigger(_ context.Context, t TriggerRegistration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, "+"+t.ID+":"+t.FunctionID+":"+string(t.Config)+":"+t.Namespace)
	return r.refuse
}

func (r *recordingTrigger) UnregisterTrigger(_ context.Context, t TriggerRegistration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, "-"+t.ID)
	return nil
}

func (r *recordingTrigger) events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen...)
}

func TestTriggers(t *testing.T) {
	p := newPeer(t)
	o := testOptions()
	reported := make(chan error, 1)
	o.OnRegistrationError = func(err error) { reported <- err }
	c, pc := connect(t, p, o)

	rec := &recordingTrigger{}
	unregisterType, err := c.RegisterTriggerType(TriggerTypeDef{ID: "cron", Description: "every so often",
		TriggerRequestSchema: json.RawMessage(`{"type":"object"}`), Namespace: "sched"}, rec)
	assert.NilError(t, err)
	rt := expect[*protocol.RegisterTriggerType](t, pc)
	assert.Equal(t, rt.ID, "cron")
	assert.Equal(t, *rt.Namespace, "sched")
	assert.Equal(t, string(rt.TriggerRequestFormat), `{"type":"object"}`)

	ns := "orders"
	pc.send(t, &protocol.RegisterTrigger{ID: "t1", TriggerType: "cron", FunctionID: "f::a", Config: json.RawMessage(`{"every":1}`), Namespace: &ns})
	ack := expect[*protocol.TriggerRegistrationResult](t, pc)
	assert.DeepEqual(t, *ack, protocol.TriggerRegistrationResult{ID: "t1", TriggerType: "cron", FunctionID: "f::a"})

	rec.mu.Lock()
	rec.refuse = errors.New("bad schedule")
	rec.mu.Unlock()
	pc.send(t, &protocol.RegisterTrigger{ID: "t2", TriggerType: "cron", FunctionID: "f::b"})
	ack = expect[*protocol.TriggerRegistrationResult](t, pc)
	assert.DeepEqual(t, ack.Error, &protocol.ErrorBody{Code: "trigger_registration_failed", Message: "bad schedule"})

	pc.send(t, &protocol.RegisterTrigger{ID: "t3", TriggerType: "other", FunctionID: "f::c"})
	assert.Equal(t, expect[*protocol.TriggerRegistrationResult](t, pc).Error.Code, "trigger_type_not_found")

	pc.send(t, &protocol.UnregisterTrigger{ID: "t1", TriggerType: "cron"})
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if len(rec.events()) == 3 {
			return poll.Success()
		}
		return poll.Continue("events %v", rec.events())
	})
	assert.DeepEqual(t, rec.events(), []string{`+t1:f::a:{"every":1}:orders`, `+t2:f::b::`, `-t1`})

	unregisterType()
	assert.Equal(t, expect[*protocol.UnregisterTriggerType](t, pc).ID, "cron")

	unregisterTrigger, err := c.RegisterTrigger(TriggerDef{ID: "mine", TriggerType: "http", FunctionID: "f::a",
		Config: json.RawMessage(`{"api_path":"/a"}`), TriggerNamespace: "web"})
	assert.NilError(t, err)
	tr := expect[*protocol.RegisterTrigger](t, pc)
	assert.Equal(t, tr.ID, "mine")
	assert.Assert(t, tr.Namespace == nil)
	assert.Equal(t, *tr.TriggerNamespace, "web")
	pc.send(t, &protocol.TriggerRegistrationResult{ID: "mine", TriggerType: "http", FunctionID: "f::a",
		Error: &protocol.ErrorBody{Code: "bad_config", Message: "no such path"}})
	var te *TriggerError
	assert.Assert(t, errors.As(waitfor.Recv(t, reported, waitLimit, "the trigger error to be reported"), &te))
	assert.Equal(t, te.Error(), `trigger "mine" (http → f::a): bad_config: no such path`)
	unregisterTrigger()
	ut := expect[*protocol.UnregisterTrigger](t, pc)
	assert.DeepEqual(t, *ut, protocol.UnregisterTrigger{ID: "mine", TriggerType: "http"})

	_, err = c.RegisterTrigger(TriggerDef{TriggerType: "http"})
	assert.Equal(t, CodeOf(err), CodeInvalidArgument)
	_, err = c.RegisterTriggerType(TriggerTypeDef{ID: "x", Namespace: "Bad"}, rec)
	assert.Equal(t, CodeOf(err), CodeInvalidNamespace)
}

func TestPingPongAndIdleReconnect(t *testing.T) {
	p := newPeer(t)
	o := testOptions()
	o.PingInterval = 10 * time.Millisecond
	o.IdleTimeout = 200 * time.Millisecond
	o.Reconnect = ReconnectPolicy{Initial: time.Millisecond}
	_, pc := connect(t, p, o)

	pc.send(t, &protocol.Ping{})
	// Client pings may come first; the pong must come.
	for {
		m := pc.next(t)
		if _, ok := m.(*protocol.Pong); ok {
			break
		}
		_, isPing := m.(*protocol.Ping)
		assert.Assert(t, isPing, "unexpected %T", m)
	}
	// The peer now stays silent: the client pings, then drops the idle
	// connection and comes back on a new one.
	expect[*protocol.Ping](t, pc)
	pc2 := p.accept(t)
	pc.waitClosed(t)
	pc2.greet(t, "w-2", "tok-2")
	assert.Equal(t, expect[*protocol.Reattach](t, pc2).PreviousWorkerID, "w-1")
}

func TestCloseWaitsForHandlers(t *testing.T) {
	p := newPeer(t)
	c, pc := connect(t, p, testOptions())
	started := make(chan struct{})
	var finished bool
	_, err := c.RegisterFunction(FunctionDef{ID: "f::slow"}, func(ctx context.Context, _ *Invocation) (any, error) {
		close(started)
		<-ctx.Done()
		finished = true
		return nil, nil
	})
	assert.NilError(t, err)
	expect[*protocol.RegisterFunction](t, pc)
	pending := callAsync(c, "x::never", nil)
	expect[*protocol.InvokeFunction](t, pc)
	pc.send(t, &protocol.InvokeFunction{InvocationID: "i", FunctionID: "f::slow"})
	waitfor.Closed(t, started, waitLimit, "the slow handler to start")

	closeClient(t, c)
	assert.Assert(t, finished, "Close returned before the handler did")
	assert.Equal(t, CodeOf(waitCall(t, pending).err), CodeClientClosed)
	assert.Equal(t, CodeOf(c.Err()), CodeClientClosed)
	_, err = c.Call(context.Background(), "x", nil)
	assert.Equal(t, CodeOf(err), CodeClientClosed)
	pc.waitClosed(t)
	closeClient(t, c) // idempotent
}

func TestCodeOf(t *testing.T) {
	assert.Equal(t, CodeOf(nil), "")
	assert.Equal(t, CodeOf(errors.New("x")), "")
	assert.Equal(t, CodeOf(fmt.Errorf("w: %w", &protocol.ErrorBody{Code: "A"})), "A")
	assert.Equal(t, CodeOf(&Error{Code: "B"}), "B")
	assert.Equal(t, CodeOf(&RejectionError{Code: "C"}), "C")
}

// A frame that takes longer than IdleTimeout to arrive is not silence: as
// long as its bytes keep coming the connection stays; silence after it
// still drops it.
func TestSlowLargeFrameIsNotIdle(t *testing.T) {
	p := newPeer(t)
	o := testOptions()
	o.PingInterval = time.Hour
	o.IdleTimeout = 300 * time.Millisecond
	o.Reconnect = ReconnectPolicy{Initial: time.Millisecond}
	c, pc := connect(t, p, o)
	got := make(chan json.RawMessage, 1)
	_, err := c.RegisterFunction(FunctionDef{ID: "f::big"}, func(_ context.Context, inv *Invocation) (any, error) {
		got <- inv.Data
		return nil, nil
	})
	assert.NilError(t, err)
	expect[*protocol.RegisterFunction](t, pc)

	// One invocation frame trickled over about four idle windows.
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	w, err := pc.conn.Writer(ctx, websocket.MessageText)
	assert.NilError(t, err)
	_, err = w.Write([]byte(`{"type":"invokefunction","function_id":"f::big","data":"`))
	assert.NilError(t, err)
	for range 60 {
		_, err = w.Write(bytes.Repeat([]byte("x"), 1024))
		assert.NilError(t, err)
		time.Sleep(20 * time.Millisecond)
	}
	_, err = w.Write([]byte(`"}`))
	assert.NilError(t, err)
	assert.NilError(t, w.Close())
	select {
	case data := <-got:
		assert.Equal(t, len(data), 60*1024+2)
	case <-time.After(waitLimit):
		t.Fatal("the slow frame was not delivered")
	}
	// Silence now: dropped, and back on a new connection.
	pc2 := p.accept(t)
	pc.waitClosed(t)
	pc2.greet(t, "w-2", "tok-2")
	assert.Equal(t, expect[*protocol.Reattach](t, pc2).PreviousWorkerID, "w-1")
}
