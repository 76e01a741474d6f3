package client

// Integration tests: the client against the real engine (host/engine) over
// real loopback WebSockets.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// startEngine serves a fresh engine on 127.0.0.1 and returns its ws URL.
func startEngine(t *testing.T) string {
	t.Helper()
	eng := engine.New(engine.Options{Version: "test"})
	srv := httptest.NewServer(eng.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		assert.NilError(t, eng.Close(ctx))
		srv.Close()
	})
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// dialEngine connects a worker and closes it at the end of the test.
func dialEngine(t *testing.T, u string, o Options) *Client {
	t.Helper()
	o.IgnoreEnv = true
	if o.Name == "" {
		o.Name = t.Name()
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c, err := Dial(ctx, u, o)
	assert.NilError(t, err)
	t.Cleanup(func() { closeClient(t, c) })
	return c
}

// callEventually retries a call until the engine routes it: registrations
// are asynchronous (no acknowledgement in the protocol), so the first call
// after RegisterFunction may race the registration.
func callEventually(t *testing.T, c *Client, fn string, payload any, opts ...CallOption) json.RawMessage {
	t.Helper()
	var res json.RawMessage
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		var err error
		res, err = c.Call(context.Background(), fn, payload, opts...)
		if CodeOf(err) == protocol.CodeFunctionNotFound {
			return poll.Continue("%v", err)
		}
		if err != nil {
			return poll.Error(err)
		}
		return poll.Success()
	}, poll.WithTimeout(waitLimit))
	return res
}

type addIn struct {
	A, B int
}

func addHandler(_ context.Context, inv *Invocation) (any, error) {
	var in addIn
	if err := json.Unmarshal(inv.Data, &in); err != nil {
		return nil, &protocol.ErrorBody{Code: "BAD_INPUT", Message: err.Error()}
	}
	return map[string]int{"sum": in.A + in.B}, nil
}

func TestEngineRegisterAndCall(t *testing.T) {
	u := startEngine(t)
	worker := dialEngine(t, u, Options{Name: "math", Reconnect: ReconnectPolicy{Disable: true}})
	_, err := worker.RegisterFunction(FunctionDef{ID: "math::add", Description: "Add two numbers",
		RequestSchema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"integer"}}}`)}, addHandler)
	assert.NilError(t, err)
	_, err = worker.RegisterFunction(FunctionDef{ID: "math::fail"}, func(context.Context, *Invocation) (any, error) {
		return nil, &protocol.ErrorBody{Code: "E_MATH", Message: "division by zero", Stacktrace: "here"}
	})
	assert.NilError(t, err)

	caller := dialEngine(t, u, Options{Name: "caller", ConfirmRegistration: true, Reconnect: ReconnectPolicy{Disable: true}})
	res := callEventually(t, caller, "math::add", map[string]int{"a": 2, "b": 3})
	assert.Equal(t, string(res), `{"sum":5}`)

	_, err = caller.Call(context.Background(), "math::fail", nil)
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb), "%v", err)
	assert.DeepEqual(t, *eb, protocol.ErrorBody{Code: "E_MATH", Message: "division by zero", Stacktrace: "here"})

	_, err = caller.Call(context.Background(), "math::nope", nil)
	assert.Equal(t, CodeOf(err), protocol.CodeFunctionNotFound)

	// The engine's own view of what the worker registered.
	info, err := caller.Call(context.Background(), "engine::functions::info", map[string]string{"function_id": "math::add"})
	assert.NilError(t, err)
	var detail struct {
		FunctionID    string          `json:"function_id"`
		Namespace     string          `json:"namespace"`
		WorkerName    string          `json:"worker_name"`
		Description   string          `json:"description"`
		RequestSchema json.RawMessage `json:"request_schema"`
	}
	assert.NilError(t, json.Unmarshal(info, &detail))
	assert.Equal(t, detail.FunctionID, "math::add")
	assert.Equal(t, detail.Namespace, "default")
	assert.Equal(t, detail.WorkerName, "math")
	assert.Equal(t, detail.Description, "Add two numbers")
	assert.Equal(t, string(detail.RequestSchema), `{"type":"object","properties":{"a":{"type":"integer"}}}`)

	// A void call reaches the handler and returns at once.
	got := make(chan json.RawMessage, 1)
	_, err = worker.RegisterFunction(FunctionDef{ID: "math::sink"}, func(_ context.Context, inv *Invocation) (any, error) {
		got <- inv.Data
		return nil, nil
	})
	assert.NilError(t, err)
	callEventually(t, caller, "math::sink", map[string]int{"warmup": 1})
	waitfor.Recv(t, got, waitLimit, "the warm-up void call to reach the handler")
	_, err = caller.Call(context.Background(), "math::sink", map[string]int{"n": 7}, Void())
	assert.NilError(t, err)
	select {
	case data := <-got:
		var v map[string]any
		assert.NilError(t, json.Unmarshal(data, &v))
		assert.Equal(t, v["n"], float64(7))
	case <-time.After(waitLimit):
		t.Fatal("void call never reached the handler")
	}
}

func TestEngineNamespaces(t *testing.T) {
	u := startEngine(t)
	worker := dialEngine(t, u, Options{Name: "orders-worker", Namespace: "orders", Reconnect: ReconnectPolicy{Disable: true}})
	_, err := worker.RegisterFunction(FunctionDef{ID: "orders::count"}, func(context.Context, *Invocation) (any, error) { return 42, nil })
	assert.NilError(t, err)

	plain := dialEngine(t, u, Options{Name: "plain", Reconnect: ReconnectPolicy{Disable: true}})
	res := callEventually(t, plain, "orders::count", nil, WithNamespace("orders"))
	assert.Equal(t, string(res), `42`)

	// Strict routing: without a namespace the call resolves in default.
	_, err = plain.Call(context.Background(), "orders::count", nil)
	assert.Equal(t, CodeOf(err), protocol.CodeFunctionNotFound)
	assert.ErrorContains(t, err, "orders")

	// A worker of the namespace reaches it without saying so, and still
	// reaches engine builtins in default.
	sibling := dialEngine(t, u, Options{Name: "sibling", Namespace: "orders", Reconnect: ReconnectPolicy{Disable: true}})
	assert.Equal(t, string(callEventually(t, sibling, "orders::count", nil)), `42`)
	list, err := sibling.Call(context.Background(), "engine::workers::list", map[string]any{})
	assert.NilError(t, err)
	assert.Assert(t, strings.Contains(string(list), `"orders-worker"`), string(list))
}

func TestEngineWorkerNameConflict(t *testing.T) {
	u := startEngine(t)
	dialEngine(t, u, Options{Name: "unique", ConfirmRegistration: true, Reconnect: ReconnectPolicy{Disable: true}})

	// Confirmed registration: Dial itself reports the conflict.
	_, err := Dial(context.Background(), u, Options{Name: "unique", IgnoreEnv: true, ConfirmRegistration: true,
		Reconnect: ReconnectPolicy{Initial: time.Millisecond}})
	assert.Equal(t, CodeOf(err), protocol.CodeWorkerNamespaceConflict, "%v", err)

	// Fire-and-forget registration: the client learns it afterwards and
	// stops without reconnecting.
	c, err := Dial(context.Background(), u, Options{Name: "unique", IgnoreEnv: true, Reconnect: ReconnectPolicy{Initial: time.Millisecond}})
	assert.NilError(t, err)
	select {
	case <-c.Done():
	case <-time.After(waitLimit):
		t.Fatal("the conflicting worker kept running")
	}
	assert.Equal(t, CodeOf(c.Err()), protocol.CodeWorkerNamespaceConflict)
	closeClient(t, c)

	// The same name in another namespace is fine.
	dialEngine(t, u, Options{Name: "unique", Namespace: "elsewhere", ConfirmRegistration: true, Reconnect: ReconnectPolicy{Disable: true}})
}

func TestEngineChannels(t *testing.T) {
	u := startEngine(t)
	c := dialEngine(t, u, Options{Reconnect: ReconnectPolicy{Disable: true}})
	ctx := context.Background()
	wref, rref, err := c.CreateChannel(ctx, 4)
	assert.NilError(t, err)
	assert.Equal(t, wref.Direction, protocol.DirectionWrite)
	assert.Equal(t, rref.Direction, protocol.DirectionRead)

	payload := bytes.Repeat([]byte("iii channel "), 20000) // ~240 KiB: several chunks
	writeErr := make(chan error, 1)
	go func() {
		w, err := c.OpenChannelWriter(ctx, wref)
		if err != nil {
			writeErr <- err
			return
		}
		if _, err := w.Write(payload); err != nil {
			writeErr <- err
			return
		}
		if err := w.SendText(ctx, "done"); err != nil {
			writeErr <- err
			return
		}
		writeErr <- w.Close()
	}()

	var texts []string
	r, err := c.OpenChannelReader(ctx, rref, WithTextHandler(func(s string) { texts = append(texts, s) }))
	assert.NilError(t, err)
	defer r.Close()
	var got []byte
	waitfor.Func(t, waitLimit, "the channel's bytes to end", func() { got, err = io.ReadAll(r) })
	assert.NilError(t, err)
	assert.NilError(t, waitfor.Recv(t, writeErr, waitLimit, "the channel writer to finish"))
	assert.Assert(t, bytes.Equal(got, payload), "got %d bytes, want %d", len(got), len(payload))
	assert.DeepEqual(t, texts, []string{"done"})

	// A used-up or unknown channel is refused before the upgrade.
	_, err = c.OpenChannelReader(ctx, protocol.StreamChannelRef{ChannelID: "nope", AccessKey: "x", Direction: "read"})
	assert.Equal(t, CodeOf(err), CodeChannelUnavailable)
}

// cutProxy forwards TCP between the client and the engine and can cut the
// client's side while the engine's side stays open, the way a dead network
// path looks to the engine.
type cutProxy struct {
	t      testing.TB
	l      net.Listener
	target string
	mu     sync.Mutex
	client []net.Conn
	engine []net.Conn
	wg     sync.WaitGroup
}

func newCutProxy(t *testing.T, engineURL string) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	p := &cutProxy{t: t, l: l, target: strings.TrimPrefix(engineURL, "ws://")}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *cutProxy) url() string { return "ws://" + p.l.Addr().String() }

func (p *cutProxy) serve() {
	defer p.wg.Done()
	for {
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		p.client = append(p.client, in)
		p.engine = append(p.engine, out)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); _, _ = io.Copy(out, in) }()
		go func() { defer p.wg.Done(); _, _ = io.Copy(in, out) }()
	}
}

// cutClients closes every client-side socket; the engine sees nothing.
func (p *cutProxy) cutClients() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.client {
		_ = c.Close()
	}
	p.client = nil
}

func (p *cutProxy) close() {
	_ = p.l.Close()
	p.mu.Lock()
	for _, c := range append(p.client, p.engine...) {
		_ = c.Close()
	}
	p.mu.Unlock()
	waitfor.Group(p.t, &p.wg, waitLimit, "the proxy's copy goroutines to end")
}

func TestEngineReconnectReattach(t *testing.T) {
	u := startEngine(t)
	proxy := newCutProxy(t, u)
	caller := dialEngine(t, u, Options{Name: "caller", Reconnect: ReconnectPolicy{Disable: true}})

	// ConfirmRegistration makes each reconnect prove that the engine gave the
	// name back: without a working reattach the old, half-open connection
	// would still hold it and the reconnect would be refused.
	worker := dialEngine(t, proxy.url(), Options{Name: "flaky", ConfirmRegistration: true,
		Reconnect: ReconnectPolicy{Initial: time.Millisecond, Max: 10 * time.Millisecond}})
	_, err := worker.RegisterFunction(FunctionDef{ID: "flaky::echo"}, addHandler)
	assert.NilError(t, err)
	assert.Equal(t, string(callEventually(t, caller, "flaky::echo", map[string]int{"a": 1, "b": 1})), `{"sum":2}`)
	firstID := worker.WorkerID()

	for round := range 3 {
		proxy.cutClients()
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if worker.Connected() && worker.WorkerID() != firstID {
				return poll.Success()
			}
			return poll.Continue("round %d: waiting for the reconnect", round)
		}, poll.WithTimeout(waitLimit))
		assert.Assert(t, worker.Err() == nil, "%v", worker.Err())
		firstID = worker.WorkerID()
		res := callEventually(t, caller, "flaky::echo", map[string]int{"a": round, "b": 10})
		var out map[string]int
		assert.NilError(t, json.Unmarshal(res, &out))
		assert.Equal(t, out["sum"], round+10)
	}

	// Exactly one live worker named "flaky": the half-open ones were evicted.
	list, err := caller.Call(context.Background(), "engine::workers::list", map[string]any{"search": "flaky"})
	assert.NilError(t, err)
	var workers struct {
		Workers []struct {
			Name string `json:"name"`
			ID   string `json:"id"`
		} `json:"workers"`
	}
	assert.NilError(t, json.Unmarshal(list, &workers))
	var ids []string
	for _, w := range workers.Workers {
		if w.Name == "flaky" {
			ids = append(ids, w.ID)
		}
	}
	assert.DeepEqual(t, ids, []string{worker.WorkerID()})
}

func TestEngineInFlightCallFailsWhenOwnerDrops(t *testing.T) {
	u := startEngine(t)
	owner := dialEngine(t, u, Options{Name: "owner", Reconnect: ReconnectPolicy{Disable: true}})
	started := make(chan struct{}, 1)
	_, err := owner.RegisterFunction(FunctionDef{ID: "slow::op"}, func(ctx context.Context, inv *Invocation) (any, error) {
		if strings.Contains(string(inv.Data), "block") {
			started <- struct{}{}
			<-ctx.Done()
		}
		return "ok", nil
	})
	assert.NilError(t, err)
	caller := dialEngine(t, u, Options{Name: "caller", Reconnect: ReconnectPolicy{Disable: true}})
	callEventually(t, caller, "slow::op", map[string]string{"mode": "warm"})

	ch := callAsync(caller, "slow::op", map[string]string{"mode": "block"})
	waitfor.Recv(t, started, waitLimit, "the blocking call to reach its handler")
	closeClient(t, owner)
	r := waitCall(t, ch)
	assert.Equal(t, CodeOf(r.err), protocol.CodeInvocationStopped, "%v", r.err)
}

// BenchmarkEngineRoundTrip measures one call caller → engine → worker →
// engine → caller through the client on both ends, over loopback.
func BenchmarkEngineRoundTrip(b *testing.B) {
	eng := engine.New(engine.Options{})
	srv := httptest.NewServer(eng.Handler())
	defer func() {
		_ = eng.Close(context.Background())
		srv.Close()
	}()
	u := "ws" + strings.TrimPrefix(srv.URL, "http")
	ctx := context.Background()
	worker, err := Dial(ctx, u, Options{Name: "bench-worker", IgnoreEnv: true, Reconnect: ReconnectPolicy{Disable: true}})
	if err != nil {
		b.Fatal(err)
	}
	defer worker.Close(ctx)
	if _, err := worker.RegisterFunction(FunctionDef{ID: "bench::echo"}, func(_ context.Context, inv *Invocation) (any, error) {
		return inv.Data, nil
	}); err != nil {
		b.Fatal(err)
	}
	caller, err := Dial(ctx, u, Options{Name: "bench-caller", IgnoreEnv: true, Reconnect: ReconnectPolicy{Disable: true}})
	if err != nil {
		b.Fatal(err)
	}
	defer caller.Close(ctx)
	payload := json.RawMessage(`{"n":1}`)
	for {
		if _, err := caller.Call(ctx, "bench::echo", payload); err == nil {
			break
		} else if CodeOf(err) != protocol.CodeFunctionNotFound {
			b.Fatal(err)
		}
	}

	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			if _, err := caller.Call(ctx, "bench::echo", payload); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := caller.Call(ctx, "bench::echo", payload); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// TestEngineRefusedTokenOnReconnect: after the engine changes its token, a
// client whose TokenSource finds the new one reconnects with it; one whose
// token the engine now refuses stops with AUTH_ERROR instead of retrying
// forever.
func TestEngineRefusedTokenOnReconnect(t *testing.T) {
	var current atomic.Value
	current.Store("token-one")
	eng := engine.New(engine.Options{Version: "test", AdminToken: func() string { return current.Load().(string) }})
	srv := httptest.NewServer(eng.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		assert.NilError(t, eng.Close(ctx))
		srv.Close()
	})
	proxy := newCutProxy(t, "ws"+strings.TrimPrefix(srv.URL, "http"))
	fast := ReconnectPolicy{Initial: time.Millisecond, Max: 10 * time.Millisecond}
	follows := dialEngine(t, proxy.url(), Options{Name: "follows", Token: "token-one", Reconnect: fast,
		TokenSource: func() string { return current.Load().(string) }})
	stale := dialEngine(t, proxy.url(), Options{Name: "stale", Token: "token-one", Reconnect: fast})

	current.Store("token-two")
	proxy.cutClients()
	select {
	case <-stale.Done():
	case <-time.After(waitLimit):
		t.Fatal("the client with a refused token kept retrying")
	}
	assert.Equal(t, CodeOf(stale.Err()), "AUTH_ERROR")
	assert.ErrorContains(t, stale.Err(), "refuses this client's token")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if follows.Connected() {
			return poll.Success()
		}
		return poll.Continue("waiting for the reconnect with the new token")
	}, poll.WithTimeout(waitLimit))
	assert.NilError(t, follows.Err())
}

// TestEngineCreateChannels: several channels in one call, one filled with
// its whole stream (its reader reads it and the end; its writer is used),
// one as CreateChannel makes; DropChannels removes them.
func TestEngineCreateChannels(t *testing.T) {
	u := startEngine(t)
	c := dialEngine(t, u, Options{Reconnect: ReconnectPolicy{Disable: true}})
	ctx := context.Background()
	_, err := c.CreateChannels(ctx, ChannelSpec{Filled: true, Content: make([]byte, MaxChannelContent+1)})
	assert.Equal(t, CodeOf(err), CodeInvalidArgument)

	pairs, err := c.CreateChannels(ctx, ChannelSpec{Filled: true, Content: []byte("body")}, ChannelSpec{BufferSize: 2})
	assert.NilError(t, err)
	assert.Equal(t, len(pairs), 2)
	r, err := c.OpenChannelReader(ctx, pairs[0].Reader)
	assert.NilError(t, err)
	var got []byte
	waitfor.Func(t, waitLimit, "the filled channel to end", func() { got, err = io.ReadAll(r) })
	assert.NilError(t, err)
	assert.Equal(t, string(got), "body")
	assert.NilError(t, r.Close())

	w, err := c.OpenChannelWriter(ctx, pairs[1].Writer)
	assert.NilError(t, err)
	defer w.Close()
	r2, err := c.OpenChannelReader(ctx, pairs[1].Reader)
	assert.NilError(t, err)
	defer r2.Close()
	assert.NilError(t, c.DropChannels(ctx, pairs[0].Writer, pairs[1].Writer))
	rctx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	_, err = r2.ReadMessage(rctx)
	assert.ErrorContains(t, err, "channel removed", "a dropped channel's open end closes")
	_, err = c.OpenChannelReader(ctx, pairs[1].Reader)
	assert.Equal(t, CodeOf(err), CodeChannelUnavailable)
}
