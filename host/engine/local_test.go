package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

func TestLocalWorkerLeases(t *testing.T) {
	te := startEngine(t, Options{})
	a, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "configuration", Runtime: "engine"})
	assert.NilError(t, err)

	_, err = te.AttachLocalWorker(LocalWorkerSpec{Name: "configuration"})
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, protocol.CodeWorkerNamespaceConflict)
	assert.Check(t, is.Contains(eb.Message, a.ID()))

	// A socket worker cannot take the name either.
	w := te.dial(t)
	w.register(map[string]any{"name": "configuration"})
	rej := w.expect("registrationrejected")
	assert.Equal(t, rej.str("owner_worker_id"), a.ID())

	other, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "configuration", Namespace: "tenant"})
	assert.NilError(t, err, "another namespace is another identity")
	defer other.Detach()

	_, err = te.AttachLocalWorker(LocalWorkerSpec{Name: "x", Namespace: "Bad"})
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, protocol.CodeInvalidNamespace)

	h := func(ctx context.Context, call *Call) (json.RawMessage, error) { return json.RawMessage(`1`), nil }
	assert.NilError(t, a.RegisterFunction(FunctionDef{ID: "configuration::get"}, h))
	err = other.RegisterFunction(FunctionDef{ID: "configuration::get"}, h)
	assert.NilError(t, err, "function leases are per namespace")
	err = other.RegisterFunction(FunctionDef{ID: "engine::nope"}, h)
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, protocol.CodeFuncNamespaceConflict)

	b, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "b"})
	assert.NilError(t, err)
	err = b.RegisterFunction(FunctionDef{ID: "configuration::get"}, h)
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, protocol.CodeFuncNamespaceConflict)

	a.Detach()
	assert.NilError(t, b.RegisterFunction(FunctionDef{ID: "configuration::get"}, h), "detach releases function leases")
	again, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "configuration"})
	assert.NilError(t, err, "detach releases the name")
	again.Detach()
	b.UnregisterFunction("configuration::get")
	_, err = te.Invoke(context.Background(), "", "configuration::get", nil)
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, protocol.CodeFunctionNotFound)
	b.Detach()
	b.Detach() // idempotent
}

func TestLocalWorkerCalls(t *testing.T) {
	te := startEngine(t, Options{})
	lw, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "router", Namespace: "default"})
	assert.NilError(t, err)
	defer lw.Detach()

	calls := make(chan *Call, 10)
	assert.NilError(t, lw.RegisterFunction(FunctionDef{ID: "sandbox::exec"}, func(ctx context.Context, call *Call) (json.RawMessage, error) {
		calls <- call
		var in struct{ Fail string }
		_ = json.Unmarshal(call.Data, &in)
		switch in.Fail {
		case "coded":
			return nil, &protocol.ErrorBody{Code: "S301", Message: "adapter not running"}
		case "plain":
			return nil, errors.New("plain failure")
		case "panic":
			panic("handler bug")
		}
		return json.RawMessage(`{"ok":true}`), nil
	}))

	// From a socket worker.
	c := te.dial(t)
	c.send(&protocol.InvokeFunction{InvocationID: "l1", FunctionID: "sandbox::exec", Data: json.RawMessage(`{"cmd":"ls"}`),
		Metadata: json.RawMessage(`{"m":1}`), Traceparent: "tp", Baggage: "bg"})
	res := c.expect("invocationresult")
	assert.DeepEqual(t, res.obj("result"), frame{"ok": true})
	call := waitfor.Recv(t, calls, waitFor, "the call from the socket worker to reach the handler")
	assert.Equal(t, call.InvocationID, "l1")
	assert.Equal(t, call.CallerWorkerID, c.workerID)
	assert.Equal(t, call.Namespace, DefaultNamespace)
	assert.Equal(t, call.Traceparent, "tp")
	assert.Equal(t, call.Baggage, "bg")
	assert.Equal(t, string(call.Metadata), `{"m":1}`)
	assert.Equal(t, string(call.Data), `{"cmd":"ls","_caller_worker_id":"`+c.workerID+`"}`)

	for _, tc := range []struct{ fail, code, msg string }{
		{"coded", "S301", "adapter not running"},
		{"plain", protocol.CodeInvocationFailed, "plain failure"},
		{"panic", protocol.CodeInvocationFailed, "handler for sandbox::exec panicked: handler bug"},
	} {
		res := c.call("l-"+tc.fail, "sandbox::exec", nil, `{"fail":"`+tc.fail+`"}`)
		code, msg := errBody(t, res)
		assert.Equal(t, code, tc.code)
		assert.Equal(t, msg, tc.msg)
		waitfor.Recv(t, calls, waitFor, "the failing call to reach the handler")
	}

	// Void from a socket worker: run, not answered.
	c.send(&protocol.InvokeFunction{FunctionID: "sandbox::exec", Action: &protocol.TriggerAction{Type: protocol.ActionVoid}})
	call = waitfor.Recv(t, calls, waitFor, "the void call to reach the handler")
	assert.Equal(t, call.InvocationID, "")
	c.sync()

	// In-process.
	out, err := te.Invoke(context.Background(), "", "sandbox::exec", json.RawMessage(`{}`))
	assert.NilError(t, err)
	assert.Equal(t, string(out), `{"ok":true}`)
	call = waitfor.Recv(t, calls, waitFor, "the in-process call to reach the handler")
	assert.Equal(t, call.CallerWorkerID, "")
	assert.Equal(t, string(call.Data), `{}`)
	_, err = te.Invoke(context.Background(), "", "sandbox::exec", json.RawMessage(`{"fail":"coded"}`))
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, "S301")
	waitfor.Recv(t, calls, waitFor, "the failing in-process call to reach the handler")

	// A remote error reaches an in-process caller as *protocol.ErrorBody.
	owner := te.dial(t)
	owner.registerIn("", "remote", "remote::f")
	go func() {
		in := owner.next()
		owner.send(&protocol.InvocationResult{InvocationID: in.str("invocation_id"), FunctionID: "remote::f",
			Error: &protocol.ErrorBody{Code: "invocation_failed", Message: "remote boom"}})
	}()
	rctx, rcancel := context.WithTimeout(context.Background(), waitFor)
	defer rcancel()
	_, err = te.Invoke(rctx, "", "remote::f", json.RawMessage(`{}`))
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, "invocation_failed")
	assert.Equal(t, eb.Message, "remote boom")
}

func TestLocalWorkerDetachStopsInFlight(t *testing.T) {
	te := startEngine(t, Options{})
	lw, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "slow"})
	assert.NilError(t, err)
	started := make(chan struct{}, 2)
	cancelled := make(chan struct{}, 2)
	assert.NilError(t, lw.RegisterFunction(FunctionDef{ID: "slow::f"}, func(ctx context.Context, call *Call) (json.RawMessage, error) {
		started <- struct{}{}
		<-ctx.Done()
		cancelled <- struct{}{}
		return json.RawMessage(`"too late"`), nil
	}))

	c := te.dial(t)
	c.send(&protocol.InvokeFunction{InvocationID: "d1", FunctionID: "slow::f"})
	waitfor.Recv(t, started, waitFor, "the socket call to start")
	inproc := make(chan error, 1)
	go func() {
		_, err := te.Invoke(context.Background(), "", "slow::f", nil)
		inproc <- err
	}()
	waitfor.Recv(t, started, waitFor, "the in-process call to start")

	lw.Detach()
	res := c.expect("invocationresult")
	code, _ := errBody(t, res)
	assert.Equal(t, code, protocol.CodeInvocationStopped)
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(waitfor.Recv(t, inproc, waitFor, "the in-process call to be stopped"), &eb))
	assert.Equal(t, eb.Code, protocol.CodeInvocationStopped)
	waitfor.Recv(t, cancelled, waitFor, "the first handler to be cancelled")
	waitfor.Recv(t, cancelled, waitFor, "the second handler to be cancelled")
	c.sync() // the handlers' late results went nowhere

	assert.ErrorContains(t, lw.RegisterFunction(FunctionDef{ID: "x"}, func(context.Context, *Call) (json.RawMessage, error) { return nil, nil }), "detached")
}

func TestInvokeContextCancelsLocalHandler(t *testing.T) {
	te := startEngine(t, Options{})
	lw, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "ctx"})
	assert.NilError(t, err)
	defer lw.Detach()
	handlerDone := make(chan error, 1)
	assert.NilError(t, lw.RegisterFunction(FunctionDef{ID: "ctx::wait"}, func(ctx context.Context, call *Call) (json.RawMessage, error) {
		<-ctx.Done()
		handlerDone <- ctx.Err()
		return nil, ctx.Err()
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = te.Invoke(ctx, "", "ctx::wait", nil)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Assert(t, waitfor.Recv(t, handlerDone, waitFor, "the handler to see its context end") != nil)
}

func TestCloseFailsInFlightAndClosesSockets(t *testing.T) {
	e := New(Options{})
	srvURL, stop := serve(t, e)
	defer stop()
	te := &testEngine{Engine: e, url: srvURL}

	owner := te.dial(t)
	owner.registerIn("", "o", "f")
	caller := te.dial(t)
	caller.send(&protocol.InvokeFunction{InvocationID: "c1", FunctionID: "f"})
	owner.expect("invokefunction")
	inproc := make(chan error, 1)
	go func() {
		_, err := e.Invoke(context.Background(), "", "f", nil)
		inproc <- err
	}()
	owner.expect("invokefunction")

	lw, err := e.AttachLocalWorker(LocalWorkerSpec{Name: "l"})
	assert.NilError(t, err)
	handlerCtx := make(chan context.Context, 1)
	assert.NilError(t, lw.RegisterFunction(FunctionDef{ID: "l::f"}, func(ctx context.Context, call *Call) (json.RawMessage, error) {
		handlerCtx <- ctx
		<-ctx.Done()
		return nil, ctx.Err()
	}))
	go func() { _, _ = e.Invoke(context.Background(), "", "l::f", nil) }()
	hctx := waitfor.Recv(t, handlerCtx, waitFor, "the in-process handler to start")

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	assert.NilError(t, e.Close(ctx))

	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(waitfor.Recv(t, inproc, waitFor, "the in-process call to be stopped by Close"), &eb))
	assert.Equal(t, eb.Code, protocol.CodeInvocationStopped)
	assert.Assert(t, hctx.Err() != nil, "in-process handlers are cancelled")
	// The socket caller hears invocation_stopped or just the close.
	assert.Assert(t, caller.waitClosed() != nil)
	assert.Assert(t, owner.waitClosed() != nil)

	_, err = e.Invoke(context.Background(), "", "f", nil)
	assert.ErrorIs(t, err, ErrClosed)
	_, err = e.AttachLocalWorker(LocalWorkerSpec{Name: "late"})
	assert.ErrorIs(t, err, ErrClosed)
	assert.NilError(t, e.Close(ctx), "Close is idempotent")
	assert.Equal(t, httpStatus(t, srvURL), http.StatusServiceUnavailable, "new workers are refused")
}

// TestLocalHandlerHandsReadingOver: an in-process handler runs on the
// goroutine that read its frame, and one that runs long hands the
// connection's reading to a new goroutine. While calls block, later frames
// on the same connection are still read and answered, in any number; the
// worker can go away mid-call; and nothing is left running once the engine
// closes (goleak checks the package).
func TestLocalHandlerHandsReadingOver(t *testing.T) {
	te := startEngine(t, Options{})
	lw, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "slow", Namespace: "default"})
	assert.NilError(t, err)
	defer lw.Detach()
	release := make(chan struct{})
	entered := make(chan struct{}, 10)
	assert.NilError(t, lw.RegisterFunction(FunctionDef{ID: "slow::wait"}, func(ctx context.Context, call *Call) (json.RawMessage, error) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return json.RawMessage(`{"waited":true}`), nil
	}))
	assert.NilError(t, lw.RegisterFunction(FunctionDef{ID: "slow::now"}, func(context.Context, *Call) (json.RawMessage, error) {
		return json.RawMessage(`{"now":true}`), nil
	}))

	c := te.dial(t)
	for i := range 3 {
		c.send(&protocol.InvokeFunction{InvocationID: fmt.Sprintf("w%d", i), FunctionID: "slow::wait", Data: json.RawMessage(`{}`)})
		waitfor.Recv(t, entered, waitFor, fmt.Sprintf("call w%d to enter its handler", i))
	}
	for i := range 5 {
		res := c.call(fmt.Sprintf("n%d", i), "slow::now", nil, `{}`)
		assert.DeepEqual(t, res.obj("result"), frame{"now": true})
	}
	close(release)
	got := map[string]bool{}
	for range 3 {
		res := c.expect("invocationresult")
		got[res.str("invocation_id")] = true
	}
	assert.DeepEqual(t, got, map[string]bool{"w0": true, "w1": true, "w2": true})

	// A caller that goes away while its call runs.
	block := make(chan struct{})
	assert.NilError(t, lw.RegisterFunction(FunctionDef{ID: "slow::block"}, func(ctx context.Context, call *Call) (json.RawMessage, error) {
		entered <- struct{}{}
		<-block
		return json.RawMessage(`{}`), nil
	}))
	gone := te.dial(t)
	gone.send(&protocol.InvokeFunction{InvocationID: "b1", FunctionID: "slow::block", Data: json.RawMessage(`{}`)})
	waitfor.Recv(t, entered, waitFor, "the blocking call to enter its handler")
	_ = gone.c.CloseNow()
	waitfor.Closed(t, gone.closed, waitFor, "the departed caller's read loop to end")
	close(block)
}

// TestLocalHandlerAwaitsItsCaller: an in-process handler that calls a
// function of the very worker whose frame it runs for needs that
// connection read while it waits; running in place must not deadlock it.
func TestLocalHandlerAwaitsItsCaller(t *testing.T) {
	te := startEngine(t, Options{})
	lw, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "asker", Namespace: "default"})
	assert.NilError(t, err)
	defer lw.Detach()
	assert.NilError(t, lw.RegisterFunction(FunctionDef{ID: "asker::ask"}, func(ctx context.Context, call *Call) (json.RawMessage, error) {
		return te.Invoke(ctx, "", "caller::answer", json.RawMessage(`{"q":1}`))
	}))

	c := te.dial(t)
	c.registerIn("", "caller", "caller::answer")
	c.send(&protocol.InvokeFunction{InvocationID: "ask-1", FunctionID: "asker::ask", Data: json.RawMessage(`{}`)})
	in := c.expect("invokefunction")
	assert.Equal(t, in.str("function_id"), "caller::answer")
	c.send(&protocol.InvocationResult{InvocationID: in.str("invocation_id"), FunctionID: "caller::answer", Result: json.RawMessage(`{"a":42}`)})
	res := c.expect("invocationresult")
	assert.Equal(t, res.str("invocation_id"), "ask-1")
	assert.DeepEqual(t, res.obj("result"), frame{"a": float64(42)})
}

// TestLocalHandlerBurstHandsOffOnce: a burst of slow in-process calls on
// one connection hands its reading off once, for the first call; the
// others each get a goroutine at once while it runs, so none waits for a
// hand-off of its own.
func TestLocalHandlerBurstHandsOffOnce(t *testing.T) {
	te := startEngine(t, Options{})
	lw, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "burst", Namespace: "default"})
	assert.NilError(t, err)
	defer lw.Detach()
	release := make(chan struct{})
	const burst = 20
	entered := make(chan struct{}, burst)
	assert.NilError(t, lw.RegisterFunction(FunctionDef{ID: "burst::wait"}, func(ctx context.Context, call *Call) (json.RawMessage, error) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return json.RawMessage(`{}`), nil
	}))

	c := te.dial(t)
	conn := te.conn(t, c.workerID)

	for i := range burst {
		c.send(&protocol.InvokeFunction{InvocationID: fmt.Sprintf("b%d", i), FunctionID: "burst::wait", Data: json.RawMessage(`{}`)})
	}
	for i := range burst {
		waitfor.Recv(t, entered, waitFor, fmt.Sprintf("call b%d of the burst to enter its handler", i))
	}
	assert.Equal(t, conn.handOffs.Load(), int64(1))
	close(release)
	for range burst {
		c.expect("invocationresult")
	}
}
