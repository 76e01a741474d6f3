package httpworker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// streamingWorker is an http worker with streaming on, on a real engine,
// and an app worker whose routes are bound with trigger type http.
func streamingWorker(t *testing.T, timeoutMS int) (url string, app *client.Client) {
	t.Helper()
	url, app, _, _ = streamingWorkerEnv(t, timeoutMS)
	return url, app
}

// streamingWorkerEnv is streamingWorker, with the engine's environment and
// the worker's channels.
func streamingWorkerEnv(t *testing.T, timeoutMS int) (url string, app *client.Client, env *enginetest.Env, cs *ClientStreams) {
	t.Helper()
	return streamingWorkerMode(t, timeoutMS, true)
}

// channelModes are the two ways a worker gets its request channels.
var channelModes = []struct {
	name   string
	minted bool
}{{"minted", true}, {"created", false}}

// streamingWorkerMode is streamingWorkerEnv with the request channels
// minted under the connection's lease, or (minted false) created, as with
// an engine that gives no lease.
func streamingWorkerMode(t *testing.T, timeoutMS int, minted bool) (url string, app *client.Client, env *enginetest.Env, cs *ClientStreams) {
	t.Helper()
	env = enginetest.Start(t, enginetest.Options{ClientName: "test", Wait: waitfor.Default, CallTimeout: waitfor.Default})
	hc := env.Anonymous(t, "http")
	cfg, err := ParseConfig(json.RawMessage(fmt.Sprintf(`{"port":0,"default_timeout":%d}`, timeoutMS)))
	assert.NilError(t, err)
	assert.Check(t, cfg.StreamingOn(), "streaming is on by default")
	w := New(cfg, Options{Invoker: ClientInvoker{C: hc}})
	cs = NewClientStreams(hc, nil)
	if !minted {
		cs.noLease = time.Now().Add(time.Hour)
	}
	w.SetStreams(cs)
	assert.NilError(t, w.Listen())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
		defer cancel()
		assert.Check(t, w.Close(ctx))
	})
	assert.NilError(t, w.Register(hc, "http"))
	return "http://" + w.Addr().String(), env.Anonymous(t, "app"), env, cs
}

func route(t *testing.T, app *client.Client, fn, path, method string, h client.Handler) {
	t.Helper()
	_, err := app.RegisterFunction(client.FunctionDef{ID: fn}, h)
	assert.NilError(t, err)
	cfg, _ := json.Marshal(map[string]string{"api_path": path, "http_method": method})
	_, err = app.RegisterTrigger(client.TriggerDef{TriggerType: TriggerType, FunctionID: fn, Config: cfg})
	assert.NilError(t, err)
}

// do sends a request until its route exists, and returns the response
// with its body read.
func do(t *testing.T, method, url, body string) (*http.Response, string) {
	t.Helper()
	c := &http.Client{Timeout: waitfor.Default}
	var resp *http.Response
	var b []byte
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		r, err := c.Do(req)
		if err != nil {
			return poll.Error(err)
		}
		b, _ = io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode == http.StatusNotFound {
			return poll.Continue("the route is not there yet")
		}
		resp = r
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(20*time.Millisecond))
	return resp, string(b)
}

// A function reads the raw request body from request_body and answers
// through its response channel, as upstream's http() helper does: status
// and headers as text messages, then the body in binary pieces, the
// writer's close ending it. Status or headers after the body are ignored.
func TestStreamingResponse(t *testing.T) {
	for _, mode := range channelModes {
		t.Run(mode.name, func(t *testing.T) { testStreamingResponse(t, mode.minted) })
	}
}

func testStreamingResponse(t *testing.T, minted bool) {
	url, app, _, cs := streamingWorkerMode(t, 5000, minted)
	route(t, app, "app::echo", "/echo", "POST", func(ctx context.Context, inv *client.Invocation) (any, error) {
		var req Request
		if err := json.Unmarshal(inv.Data, &req); err != nil {
			return nil, err
		}
		if req.RequestBody == nil || req.Response == nil {
			return nil, fmt.Errorf("no channel refs in %s", inv.Data)
		}
		r, err := app.OpenChannelReader(ctx, *req.RequestBody)
		if err != nil {
			return nil, err
		}
		raw, err := io.ReadAll(r)
		_ = r.Close()
		if err != nil {
			return nil, err
		}
		w, err := app.OpenChannelWriter(ctx, *req.Response)
		if err != nil {
			return nil, err
		}
		// Written before returning, read by the worker as it arrives.
		go func() {
			defer w.Close()
			_ = w.SendText(context.Background(), `{"type":"set_status","status_code":201}`)
			_ = w.SendText(context.Background(), `{"type":"set_headers","headers":{"content-type":"text/plain","x-streamed":"yes"}}`)
			_, _ = w.Write([]byte("hello "))
			_, _ = w.Write(raw)
			_ = w.SendText(context.Background(), `{"type":"set_status","status_code":500}`)
		}()
		return nil, nil
	})
	resp, body := do(t, "POST", url+"/echo", "raw, not JSON")
	assert.Check(t, is.Equal(resp.StatusCode, 201))
	assert.Check(t, is.Equal(resp.Header.Get("Content-Type"), "text/plain"))
	assert.Check(t, is.Equal(resp.Header.Get("X-Streamed"), "yes"))
	assert.Check(t, is.Equal(body, "hello raw, not JSON"))
	cs.mu.Lock()
	leased := cs.lease != nil
	cs.mu.Unlock()
	assert.Check(t, is.Equal(leased, minted))
}

// A function that returns null and never writes gets 504 after
// default_timeout; one that opens nothing but answers an envelope is
// answered as before, and the channels of every request are dropped: a
// connection's 256 channel slots would run out after 128 requests.
func TestStreamingChannelsDropped(t *testing.T) {
	url, app := streamingWorker(t, 300)
	route(t, app, "app::silent", "/silent", "GET", func(context.Context, *client.Invocation) (any, error) { return nil, nil })
	route(t, app, "app::plain", "/plain/:n", "GET", func(_ context.Context, inv *client.Invocation) (any, error) {
		var req Request
		_ = json.Unmarshal(inv.Data, &req)
		return map[string]any{"status_code": 200, "body": map[string]string{"n": req.PathParams["n"]}}, nil
	})
	resp, body := do(t, "GET", url+"/silent", "")
	assert.Check(t, is.Equal(resp.StatusCode, http.StatusGatewayTimeout), body)
	assert.Check(t, is.Contains(body, "wrote nothing within default_timeout"))

	c := &http.Client{Timeout: waitfor.Default}
	do(t, "GET", url+"/plain/0", "")
	for i := range 300 {
		r, err := c.Get(fmt.Sprintf("%s/plain/%d", url, i))
		assert.NilError(t, err)
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		assert.Assert(t, r.StatusCode == 200, "request %d: %d %s", i, r.StatusCode, b)
		assert.Check(t, is.Equal(string(b), fmt.Sprintf(`{"n":"%d"}`, i)))
	}
}

func TestApplyControl(t *testing.T) {
	for _, tc := range []struct {
		msg, err string
		status   int
		header   string
	}{
		{msg: `{"type":"set_status","status_code":418}`, status: 418},
		{msg: `{"type":"set_headers","headers":{"x-a":"1"}}`, status: 200, header: "1"},
		{msg: `{"type":"set_headers","headers":["X-A: 1"]}`, status: 200, header: "1"},
		{msg: `{"type":"set_status","status_code":42}`, err: "not an HTTP status"},
		{msg: `{"type":"set_headers"}`, err: "without headers"},
		{msg: `{"type":"set_headers","headers":{"bad name":"x"}}`, err: "not valid"},
		{msg: `{"type":"set_headers","headers":{"x-a":"1\r\nx-b: 2"}}`, err: "line break"},
		{msg: `{"type":"nope"}`, err: "unknown control message"},
		{msg: `not json`, err: "not a JSON control message"},
		{msg: `{"type":"set_headers","headers":{"x":"` + strings.Repeat("a", maxStreamHeaders) + `"}}`, err: "at most"},
	} {
		h, status := http.Header{}, 200
		err := applyControl(h, &status, []byte(tc.msg))
		if tc.err != "" {
			assert.Check(t, is.ErrorContains(err, tc.err), tc.msg)
			continue
		}
		assert.NilError(t, err, tc.msg)
		assert.Check(t, is.Equal(status, tc.status), tc.msg)
		assert.Check(t, is.Equal(h.Get("X-A"), tc.header), tc.msg)
	}
}

// Without streaming (streaming: false) a request carries no channels.
func TestStreamingOff(t *testing.T) {
	cfg, err := ParseConfig(json.RawMessage(`{"streaming":false}`))
	assert.NilError(t, err)
	assert.Check(t, !cfg.StreamingOn())
	var req Request
	b, err := marshalRequest(Request{Body: json.RawMessage(`1`)})
	assert.NilError(t, err)
	assert.NilError(t, json.Unmarshal(b, &req))
	assert.Check(t, req.RequestBody == nil && req.Response == nil)
	b, err = marshalRequest(Request{Body: json.RawMessage(`1`), Response: &protocol.StreamChannelRef{ChannelID: "c", AccessKey: "k", Direction: "write"}})
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), `"response":{"channel_id":"c","access_key":"k","direction":"write"}`))
}

// A function reads request_body whatever the body's size: served on demand
// when minted; when created, a body larger than a channel's creation
// content (64 KiB) reaches it through the writer socket, a smaller one is
// created with its channel. A function that writes more messages than the response
// channel buffers before it returns null is drained once it has run for
// openResponseAfter, and its response is whole.
func TestStreamingBodiesAndEarlyWrites(t *testing.T) {
	for _, mode := range channelModes {
		t.Run(mode.name, func(t *testing.T) { testStreamingBodiesAndEarlyWrites(t, mode.minted) })
	}
}

func testStreamingBodiesAndEarlyWrites(t *testing.T, minted bool) {
	url, app, _, _ := streamingWorkerMode(t, 5000, minted)
	route(t, app, "app::len", "/len", "POST", func(ctx context.Context, inv *client.Invocation) (any, error) {
		var req Request
		if err := json.Unmarshal(inv.Data, &req); err != nil {
			return nil, err
		}
		r, err := app.OpenChannelReader(ctx, *req.RequestBody)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		raw, err := io.ReadAll(r)
		if err != nil {
			return nil, err
		}
		return map[string]any{"status_code": 200, "body": map[string]any{"n": len(raw), "same": strings.Repeat("x", len(raw)) == string(raw)}}, nil
	})
	for _, n := range []int{0, 10, client.MaxChannelContent, client.MaxChannelContent + 1, 300 << 10} {
		_, body := do(t, "POST", url+"/len", strings.Repeat("x", n))
		assert.Check(t, is.Equal(body, fmt.Sprintf(`{"n":%d,"same":true}`, n)), "a body of %d bytes", n)
	}

	const msgs = 200 // > the channel's 64 items
	route(t, app, "app::early", "/early", "GET", func(ctx context.Context, inv *client.Invocation) (any, error) {
		var req Request
		if err := json.Unmarshal(inv.Data, &req); err != nil {
			return nil, err
		}
		w, err := app.OpenChannelWriter(ctx, *req.Response)
		if err != nil {
			return nil, err
		}
		defer w.Close()
		for i := range msgs {
			if _, err := w.WriteContext(ctx, []byte(fmt.Sprintf("%d,", i))); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	resp, body := do(t, "GET", url+"/early", "")
	assert.Check(t, is.Equal(resp.StatusCode, 200))
	var want strings.Builder
	for i := range msgs {
		fmt.Fprintf(&want, "%d,", i)
	}
	assert.Check(t, is.Equal(body, want.String()))
}

// More requests at once than one connection may hold channels for (the
// engine's 256, two a request). Minted, they are all in flight together:
// channels nobody opens do not count. Created, the ones past it wait for
// earlier requests' channels to be dropped instead of failing with
// LIMIT_EXCEEDED.
func TestStreamingManyRequestsAtOnce(t *testing.T) {
	assert.Equal(t, 2*maxRequestsWithChannels, engine.MaxChannelsPerConnection)
	t.Run("minted", func(t *testing.T) { testStreamingManyRequestsAtOnce(t, true, engine.MaxChannelsPerConnection+30) })
	t.Run("created", func(t *testing.T) { testStreamingManyRequestsAtOnce(t, false, maxRequestsWithChannels) })
}

// testStreamingManyRequestsAtOnce sends together maxRequestsWithChannels+30
// requests, or more when atOnce is larger, whose functions each wait until
// atOnce of them have arrived.
func testStreamingManyRequestsAtOnce(t *testing.T, minted bool, atOnce int) {
	url, app, _, _ := streamingWorkerMode(t, 10000, minted)
	var mu sync.Mutex
	arrived := 0
	all := make(chan struct{})
	route(t, app, "app::wait", "/wait", "GET", func(ctx context.Context, inv *client.Invocation) (any, error) {
		var req Request
		if err := json.Unmarshal(inv.Data, &req); err != nil || req.QueryParams["warm"] != "" {
			return map[string]any{"status_code": 200}, err
		}
		mu.Lock()
		if arrived++; arrived == atOnce {
			close(all)
		}
		mu.Unlock()
		select { // every slot is taken before any request ends
		case <-all:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return map[string]any{"status_code": 200, "body": "ok"}, nil
	})
	do(t, "GET", url+"/wait?warm=1", "") // the route is there
	n := max(maxRequestsWithChannels+30, atOnce)
	c := &http.Client{Timeout: waitfor.Default, Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer c.CloseIdleConnections()
	errs := make(chan error, n)
	for range n {
		go func() {
			r, err := c.Get(url + "/wait")
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode != 200 {
				err = fmt.Errorf("%d %s", r.StatusCode, b)
			}
			errs <- err
		}()
	}
	for range n {
		assert.Check(t, waitfor.Recv(t, errs, waitfor.Default, "a response"))
	}
}

// waitRetired waits until the worker has no request in flight and the
// engine has retired every ref it minted.
func waitRetired(t *testing.T, cs *ClientStreams) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if cs.watching || len(cs.live) > 0 || cs.retired != cs.next {
			return poll.Continue("%d requests in flight, refs retired below %d of %d", len(cs.live), cs.retired, cs.next)
		}
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(10*time.Millisecond))
}

// requestRefs is the channel refs one request's function received.
type requestRefs struct{ body, response protocol.StreamChannelRef }

// recordRefs is a function that sends its request's refs to got and
// answers 200 "ok" without using them.
func recordRefs(got chan<- requestRefs) client.Handler {
	return func(_ context.Context, inv *client.Invocation) (any, error) {
		var req Request
		if err := json.Unmarshal(inv.Data, &req); err != nil || req.RequestBody == nil || req.Response == nil {
			return nil, fmt.Errorf("no channel refs in %s (%v)", inv.Data, err)
		}
		got <- requestRefs{*req.RequestBody, *req.Response}
		return map[string]any{"status_code": 200, "body": "ok"}, nil
	}
}

// streamAfter waits for release, then answers through the response
// channel with text, as a function that streams its answer late does.
func streamAfter(ctx context.Context, app *client.Client, response protocol.StreamChannelRef, release <-chan struct{}, text string) (any, error) {
	select {
	case <-release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	w, err := app.OpenChannelWriter(ctx, response)
	if err != nil {
		return nil, err
	}
	go func() {
		defer w.Close()
		_, _ = w.Write([]byte(text))
	}()
	return nil, nil
}

// requestInBackground sends a request from another goroutine; the channel
// gets "<status> <body>", or the client's error.
func requestInBackground(method, url, body string) <-chan string {
	answered := make(chan string, 1)
	go func() {
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			answered <- err.Error()
			return
		}
		if body != "" {
			req.Header.Set("Content-Type", "text/plain")
		}
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- err.Error()
			return
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		answered <- fmt.Sprintf("%d %s", r.StatusCode, b)
	}()
	return answered
}

// A request whose function uses neither channel leaves nothing behind: once
// it is answered, its refs open nothing (the worker retired its minted
// refs; the engine had never made their channels).
func TestStreamingUnusedChannelsCleanedUp(t *testing.T) {
	url, app, _, cs := streamingWorkerEnv(t, 5000)
	got := make(chan requestRefs, 10)
	route(t, app, "app::plain", "/plain", "GET", recordRefs(got))
	resp, body := do(t, "GET", url+"/plain", "")
	assert.Assert(t, resp.StatusCode == 200, body)
	var refs requestRefs
	for len(got) > 0 {
		refs = <-got // the last request's (do may have retried)
	}
	waitRetired(t, cs)
	assert.Check(t, is.Equal(len(cs.slots), 0), "no channels were created")
	ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
	defer cancel()
	_, err := app.OpenChannelReader(ctx, refs.body)
	assert.Check(t, is.Equal(client.CodeOf(err), client.CodeChannelUnavailable), "%v", err)
	_, err = app.OpenChannelWriter(ctx, refs.response)
	assert.Check(t, is.Equal(client.CodeOf(err), client.CodeChannelUnavailable), "%v", err)
	worker := refs.response // the worker's end, which it never opened
	worker.Direction = protocol.DirectionRead
	_, err = app.OpenChannelReader(ctx, worker)
	assert.Check(t, is.Equal(client.CodeOf(err), client.CodeChannelUnavailable), "%v", err)
}

// While a request runs, another caller that did not get its refs cannot use
// its channels: a guessed key, or another request's key with this id, is
// refused like an unknown channel, and does not take the end from the
// function, which then streams its response as usual.
func TestStreamingForeignCallerRefused(t *testing.T) {
	url, app, env, _ := streamingWorkerEnv(t, 5000)
	intruder := env.Anonymous(t, "intruder")
	got := make(chan requestRefs, 10)
	proceed := make(chan struct{})
	route(t, app, "app::slow", "/slow", "POST", func(ctx context.Context, inv *client.Invocation) (any, error) {
		var req Request
		if err := json.Unmarshal(inv.Data, &req); err != nil || req.RequestBody == nil || req.Response == nil {
			return nil, fmt.Errorf("no channel refs in %s (%v)", inv.Data, err)
		}
		got <- requestRefs{*req.RequestBody, *req.Response}
		return streamAfter(ctx, app, *req.Response, proceed, "streamed")
	})
	route(t, app, "app::other", "/other", "GET", recordRefs(got))
	// Both routes exist before the slow request is sent once.
	resp, body := do(t, "GET", url+"/other", "")
	assert.Assert(t, resp.StatusCode == 200, body)
	other := <-got
	answered := requestInBackground("POST", url+"/slow", "x")
	var refs requestRefs
	select {
	case refs = <-got:
	case <-time.After(waitfor.Default):
		t.Fatal("the slow route was not called")
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
	defer cancel()
	for _, ref := range []protocol.StreamChannelRef{
		{ChannelID: refs.response.ChannelID, AccessKey: "00000000-0000-4000-8000-000000000000", Direction: protocol.DirectionWrite},
		{ChannelID: refs.response.ChannelID, AccessKey: other.response.AccessKey, Direction: protocol.DirectionWrite},
	} {
		_, err := intruder.OpenChannelWriter(ctx, ref)
		assert.Check(t, is.Equal(client.CodeOf(err), client.CodeChannelUnavailable), "%v", err)
	}
	bad := refs.body
	bad.AccessKey = other.body.AccessKey
	_, err := intruder.OpenChannelReader(ctx, bad)
	assert.Check(t, is.Equal(client.CodeOf(err), client.CodeChannelUnavailable), "%v", err)
	close(proceed)
	select {
	case a := <-answered:
		assert.Check(t, is.Equal(a, "200 streamed"))
	case <-time.After(waitfor.Default):
		t.Fatal("the slow request was not answered")
	}
}

// A long request in flight does not keep ended requests' refs alive: the
// worker's watch calls retire every counter but those of requests in
// flight, so a short request's refs open nothing soon after it is
// answered, while the long request still streams its response.
func TestStreamingRetiresAroundLongRequest(t *testing.T) {
	url, app, _, _ := streamingWorkerEnv(t, 10000)
	release := make(chan struct{})
	route(t, app, "app::long", "/long", "GET", func(ctx context.Context, inv *client.Invocation) (any, error) {
		var req Request
		if err := json.Unmarshal(inv.Data, &req); err != nil {
			return nil, err
		}
		if req.QueryParams["warm"] != "" {
			return map[string]any{"status_code": 200}, nil
		}
		return streamAfter(ctx, app, *req.Response, release, "late")
	})
	got := make(chan requestRefs, 10)
	route(t, app, "app::short", "/short", "GET", recordRefs(got))
	do(t, "GET", url+"/long?warm=1", "")
	do(t, "GET", url+"/short", "")
	for len(got) > 0 {
		<-got
	}
	answered := requestInBackground("GET", url+"/long", "")
	resp, body := do(t, "GET", url+"/short", "")
	assert.Assert(t, resp.StatusCode == 200, body)
	refs := <-got
	ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
	defer cancel()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		w, err := app.OpenChannelWriter(ctx, refs.response)
		if err == nil {
			_ = w.Close()
			return poll.Continue("the short request's response ref still opens")
		}
		if client.CodeOf(err) != client.CodeChannelUnavailable {
			return poll.Error(err)
		}
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(20*time.Millisecond))
	_, err := app.OpenChannelReader(ctx, refs.body)
	assert.Check(t, is.Equal(client.CodeOf(err), client.CodeChannelUnavailable), "%v", err)
	close(release)
	select {
	case a := <-answered:
		assert.Check(t, is.Equal(a, "200 late"))
	case <-time.After(waitfor.Default):
		t.Fatal("the long request was not answered")
	}
}

// Many requests at once whose functions all read their bodies: each gets
// its own body, served on demand through the watch call.
func TestStreamingManyBodiesServed(t *testing.T) {
	url, app := streamingWorker(t, 10000)
	route(t, app, "app::body", "/body", "POST", func(ctx context.Context, inv *client.Invocation) (any, error) {
		var req Request
		if err := json.Unmarshal(inv.Data, &req); err != nil {
			return nil, err
		}
		r, err := app.OpenChannelReader(ctx, *req.RequestBody)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		raw, err := io.ReadAll(r)
		if err != nil {
			return nil, err
		}
		return map[string]any{"status_code": 200, "body": string(raw)}, nil
	})
	do(t, "POST", url+"/body", "warm")
	const n = 150
	c := &http.Client{Timeout: waitfor.Default, Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer c.CloseIdleConnections()
	errs := make(chan error, n)
	for i := range n {
		go func() {
			want := fmt.Sprintf("body of request %d", i)
			r, err := c.Post(url+"/body", "text/plain", strings.NewReader(want))
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode != 200 || string(b) != fmt.Sprintf("%q", want) {
				err = fmt.Errorf("request %d: %d %s", i, r.StatusCode, b)
			}
			errs <- err
		}()
	}
	for range n {
		assert.Check(t, waitfor.Recv(t, errs, waitfor.Default, "a response"))
	}
}
