package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

func TestWorkerRegisteredSentAtOnce(t *testing.T) {
	te := startEngine(t, Options{})
	a := te.dial(t) // dial asserts the greeting carries an id and a token
	b := te.dial(t)
	assert.Assert(t, a.workerID != b.workerID)
	assert.Assert(t, a.token != b.token)
	assert.Assert(t, a.token != a.workerID)
}

func TestCallRoundTrip(t *testing.T) {
	te := startEngine(t, Options{})
	owner := te.dial(t)
	owner.registerIn("", "math", "math::add")
	caller := te.dial(t)

	caller.send(&protocol.InvokeFunction{InvocationID: "inv-1", FunctionID: "math::add",
		Data: json.RawMessage(`{"a":2,"b":3}`), Traceparent: "00-abc-def-01", Metadata: json.RawMessage(`{"k":"v"}`)})

	in := owner.expect("invokefunction")
	assert.Equal(t, in.str("invocation_id"), "inv-1", "the caller's invocation id is reused")
	assert.Equal(t, in.str("function_id"), "math::add")
	assert.Equal(t, in.str("traceparent"), "00-abc-def-01")
	assert.DeepEqual(t, in.obj("metadata"), frame{"k": "v"})
	_, hasNS := in["namespace"]
	assert.Assert(t, !hasNS, "namespace is not forwarded to the owner")
	assert.DeepEqual(t, in.obj("data"), frame{"a": 2.0, "b": 3.0, "_caller_worker_id": caller.workerID})

	owner.send(&protocol.InvocationResult{InvocationID: "inv-1", FunctionID: "math::add", Result: json.RawMessage(`{"c":5}`)})
	res := caller.expect("invocationresult")
	assert.Equal(t, res.str("invocation_id"), "inv-1")
	assert.Equal(t, res.str("function_id"), "math::add")
	assert.DeepEqual(t, res.obj("result"), frame{"c": 5.0})

	// Worker-defined error codes pass through verbatim.
	caller.send(&protocol.InvokeFunction{InvocationID: "inv-2", FunctionID: "math::add", Data: json.RawMessage(`1`)})
	in = owner.expect("invokefunction")
	assert.Equal(t, string(mustJSON(t, in["data"])), `1`, "non-object data is forwarded untouched")
	owner.send(&protocol.InvocationResult{InvocationID: "inv-2", FunctionID: "math::add",
		Error: &protocol.ErrorBody{Code: "MY_CODE", Message: "boom", Stacktrace: "at x"}})
	res = caller.expect("invocationresult")
	code, msg := errBody(t, res)
	assert.Equal(t, code, "MY_CODE")
	assert.Equal(t, msg, "boom")
	assert.Equal(t, res.obj("error").str("stacktrace"), "at x")
}

func TestCallerWorkerIDInjection(t *testing.T) {
	te := startEngine(t, Options{})
	owner := te.dial(t)
	owner.registerIn("", "echo", "echo")
	caller := te.dial(t)

	cases := []struct {
		name string
		data string
		want string // the data the owner receives; "" = absent
	}{
		{"empty object", `{}`, `{"_caller_worker_id":"ID"}`},
		{"empty object with spaces", `{ }`, `{"_caller_worker_id":"ID"}`},
		{"object", `{"x":[1,{"y":"}"}]}`, `{"_caller_worker_id":"ID","x":[1,{"y":"}"}]}`},
		{"forged id is overridden", `{"_caller_worker_id":"forged"}`, `{"_caller_worker_id":"ID"}`},
		{"array", `[1,2]`, `[1,2]`},
		{"string", `"s"`, `"s"`},
		{"null", `null`, ""},
		{"absent", ``, ""},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("inj-%d", i)
			m := &protocol.InvokeFunction{InvocationID: id, FunctionID: "echo"}
			if tc.data != "" {
				m.Data = json.RawMessage(tc.data)
			}
			caller.send(m)
			raw := owner.nextRaw()
			var got struct {
				Data json.RawMessage `json:"data"`
			}
			assert.NilError(t, json.Unmarshal(raw, &got))
			if tc.want == "" {
				assert.Equal(t, len(got.Data), 0, "frame: %s", raw)
			} else {
				var gotV, wantV any
				assert.NilError(t, json.Unmarshal(got.Data, &gotV))
				assert.NilError(t, json.Unmarshal([]byte(replaceID(tc.want, caller.workerID)), &wantV))
				assert.DeepEqual(t, gotV, wantV)
			}
			owner.send(&protocol.InvocationResult{InvocationID: id, FunctionID: "echo", Result: json.RawMessage(`true`)})
			caller.expect("invocationresult")
		})
	}
}

func replaceID(s, id string) string {
	out := []byte{}
	for i := 0; i < len(s); i++ {
		if i+1 < len(s) && s[i] == 'I' && s[i+1] == 'D' {
			out = append(out, id...)
			i++
			continue
		}
		out = append(out, s[i])
	}
	return string(out)
}

func TestStrictNamespaceRouting(t *testing.T) {
	te := startEngine(t, Options{})
	orders := te.dial(t)
	orders.registerIn("orders", "svc", "state::get")
	billing := te.dial(t)
	billing.registerIn("billing", "svc", "state::get")
	caller := te.dial(t)

	// No namespace: default only, and the miss names where it does live.
	res := caller.call("r1", "state::get", nil, `{}`)
	code, msg := errBody(t, res)
	assert.Equal(t, code, protocol.CodeFunctionNotFound)
	assert.Equal(t, msg, "Function state::get not found in namespace default. It is registered in namespace(s): billing, orders.")

	// JSON null namespace counts as absent.
	caller.sendRaw(`{"type":"invokefunction","invocation_id":"r2","function_id":"state::get","namespace":null}`)
	res = caller.expect("invocationresult")
	code, _ = errBody(t, res)
	assert.Equal(t, code, protocol.CodeFunctionNotFound)

	// Nowhere at all: only the first sentence.
	res = caller.call("r3", "nope::x", ptr("orders"), ``)
	_, msg = errBody(t, res)
	assert.Equal(t, msg, "Function nope::x not found in namespace orders.")

	// Present: exactly that namespace's owner gets it.
	caller.send(&protocol.InvokeFunction{InvocationID: "r4", FunctionID: "state::get", Namespace: ptr("billing")})
	in := billing.expect("invokefunction")
	assert.Equal(t, in.str("invocation_id"), "r4")
	billing.send(&protocol.InvocationResult{InvocationID: "r4", FunctionID: "state::get", Result: json.RawMessage(`"billing"`)})
	res = caller.expect("invocationresult")
	assert.Equal(t, res["result"], "billing")
	orders.sync() // orders saw nothing

	for _, bad := range []string{"", "  ", "Orders", "a.b"} {
		res = caller.call("bad-"+bad, "state::get", ptr(bad), ``)
		code, _ = errBody(t, res)
		assert.Equal(t, code, protocol.CodeInvalidNamespace, "namespace %q", bad)
	}
}

func TestEngineFunctionsResolveInDefault(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	w.registerIn("orders", "svc", "x::y")
	res := w.call("e1", FnFunctionsList, nil, `{}`)
	assert.Assert(t, res["result"] != nil, "engine builtins answer from default: %v", res)
	res = w.call("e2", FnFunctionsList, ptr("orders"), `{}`)
	code, msg := errBody(t, res)
	assert.Equal(t, code, protocol.CodeFunctionNotFound)
	assert.Equal(t, msg, "Function engine::functions::list not found in namespace orders. It is registered in namespace(s): default.")
}

func TestVoidCall(t *testing.T) {
	te := startEngine(t, Options{})
	owner := te.dial(t)
	owner.registerIn("", "n", "notify")
	caller := te.dial(t)

	caller.send(&protocol.InvokeFunction{InvocationID: "v1", FunctionID: "notify", Data: json.RawMessage(`{"m":1}`),
		Action: &protocol.TriggerAction{Type: protocol.ActionVoid}})
	in := owner.expect("invokefunction")
	_, hasID := in["invocation_id"]
	assert.Assert(t, !hasID, "a void call reaches the owner without an invocation id: %v", in)
	assert.Equal(t, in.obj("data").str("_caller_worker_id"), caller.workerID)
	caller.sync() // no answer for a void call

	// A void call to a missing function is not answered either.
	caller.send(&protocol.InvokeFunction{FunctionID: "missing", Action: &protocol.TriggerAction{Type: protocol.ActionVoid}})
	caller.sync()
}

// An enqueue goes to the queue provider (engine::queue::enqueue) with a
// receipt id, as in iii 0.26; without a provider the caller is told how to
// install one; the caller's right to call the target is checked first.
func TestEnqueue(t *testing.T) {
	te := startEngine(t, Options{})
	owner := te.dial(t)
	owner.registerIn("", "q", "job")
	caller := te.dial(t)
	enqueue := func(id, fn string, ns *string) frame {
		caller.send(&protocol.InvokeFunction{InvocationID: id, FunctionID: fn, Namespace: ns, Data: json.RawMessage(`{"n":1}`),
			Action: &protocol.TriggerAction{Type: protocol.ActionEnqueue, Queue: "jobs"}})
		return caller.expect("invocationresult")
	}

	// No provider: enqueue_error naming the fix.
	code, msg := errBody(t, enqueue("q1", "job", nil))
	assert.Equal(t, code, CodeEnqueueError)
	assert.Assert(t, strings.Contains(msg, "iii worker add queue"), msg)
	assert.Assert(t, strings.Contains(msg, "engine token"), "the message says what this engine needs of the provider: %s", msg)

	// Only the engine token's holder may be the provider.
	impostor := te.dial(t)
	impostor.send(&protocol.RegisterFunction{ID: EnqueueProviderFunctionID})
	impostor.sync()
	assert.Assert(t, len(te.FunctionIDs(DefaultNamespace, EnqueueProviderFunctionID)) == 0)

	provider := te.dialAdmin(t)
	provider.registerIn("", "queue", EnqueueProviderFunctionID)
	owner.send(&protocol.RegisterFunction{ID: "secret", Metadata: json.RawMessage(`{"privileged":true}`)})
	owner.sync()
	got := make(chan frame, 4)
	go func() {
		for {
			var m inbound
			select {
			case m = <-provider.in:
			case <-provider.closed:
				return
			}
			if m.f.typ() != "invokefunction" {
				continue
			}
			got <- m.f
			b := appendResultFrame(nil, m.f.str("invocation_id"), m.f.str("function_id"), json.RawMessage(`{"ok":true}`), nil, "", "")
			_ = provider.c.Write(context.Background(), websocket.MessageText, b)
		}
	}()

	res := enqueue("q2", "job", nil)
	receipt, _ := res.obj("result")["messageReceiptId"].(string)
	assert.Assert(t, receipt != "", "%v", res)
	in := waitfor.Recv(t, got, waitFor, "the provider to be asked to enqueue job").obj("data")
	assert.Equal(t, in.str("queue"), "jobs")
	assert.Equal(t, in.str("function_id"), "job")
	assert.Equal(t, in.str("messageReceiptId"), receipt)
	assert.DeepEqual(t, in["data"], map[string]any{"n": float64(1)})
	_, hasNS := in["namespace"]
	assert.Assert(t, !hasNS, "the default namespace is left out for providers that predate namespaces")

	// Another namespace travels with it.
	res = enqueue("q3", "later", ptr("team-a"))
	assert.Assert(t, res.obj("result")["messageReceiptId"] != nil, "%v", res)
	assert.Equal(t, waitfor.Recv(t, got, waitFor, "the provider to be asked to enqueue later").obj("data").str("namespace"), "team-a")

	// A caller may not enqueue what it may not call: the provider would
	// call it with its own rights.
	code, _ = errBody(t, enqueue("q4", "secret", nil))
	assert.Equal(t, code, CodeUnauthorized)
	select {
	case f := <-got:
		t.Fatalf("the provider got a refused enqueue: %v", f)
	case <-time.After(100 * time.Millisecond):
	}
	owner.sync() // the target itself is never called by the engine

	// Nor what is not there yet under a reserved prefix: the provider would
	// deliver it with its rights once something privileged registers it.
	for i, id := range []string{"compose::later", "sandbox-libkrun::worker::start", "sandbox-libkrun::host::h1::worker::start", "stream::set"} {
		code, _ = errBody(t, enqueue(fmt.Sprintf("q4b%d", i), id, nil))
		assert.Equal(t, code, CodeForbidden, id)
	}
	select {
	case f := <-got:
		t.Fatalf("the provider got a refused enqueue: %v", f)
	case <-time.After(100 * time.Millisecond):
	}

	caller.sendRaw(`{"type":"invokefunction","invocation_id":"q5","function_id":"job","action":{"type":"later"}}`)
	code, _ = errBody(t, caller.expect("invocationresult"))
	assert.Equal(t, code, protocol.CodeInvalidFrame)
}

func TestBadFrames(t *testing.T) {
	te := startEngine(t, Options{})
	owner := te.dial(t)
	owner.registerIn("", "o", "f")
	c := te.dial(t)

	answered := []struct {
		name, frame, id, mentions string
	}{
		{"wrong field type", `{"type":"invokefunction","invocation_id":"b1","function_id":5}`, "b1", "function_id"},
		{"unknown type", `{"type":"frobnicate","invocation_id":"b2"}`, "b2", "unknown frame type"},
		{"truncated json", `{"type":"invokefunction","invocation_id":"b3","function_id":"f","data":{`, "b3", "invalid frame"},
		{"bad action", `{"type":"invokefunction","invocation_id":"b4","function_id":"f","action":"void"}`, "b4", "action"},
	}
	for _, tc := range answered {
		t.Run(tc.name, func(t *testing.T) {
			c.sendRaw(tc.frame)
			res := c.expect("invocationresult")
			assert.Equal(t, res.str("invocation_id"), tc.id)
			code, msg := errBody(t, res)
			assert.Equal(t, code, protocol.CodeInvalidFrame)
			assert.Check(t, is.Contains(msg, tc.mentions))
		})
	}
	silent := []struct{ name, frame string }{
		{"not json", `hello`},
		{"array", `[1,2,3]`},
		{"no type", `{"invocation_id":5}`},
		{"unknown type without id", `{"type":"frobnicate"}`},
		{"numeric invocation id", `{"type":"invokefunction","invocation_id":7,"function_id":"f"}`},
		{"whitespace", "   "},
		{"engine-only frame", `{"type":"workerregistered","worker_id":"x"}`},
		{"result nobody waits for", `{"type":"invocationresult","invocation_id":"zzz","function_id":"f","result":1}`},
	}
	for _, tc := range silent {
		t.Run(tc.name, func(t *testing.T) {
			c.sendRaw(tc.frame)
			c.sync() // nothing was answered, and the connection lives
		})
	}

	t.Run("binary frame decodes like text", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		assert.NilError(t, c.c.Write(ctx, websocket.MessageBinary, []byte(`{"type":"ping"}`)))
		c.expect("pong")
	})

	t.Run("undecodable result fails the waiting call", func(t *testing.T) {
		c.send(&protocol.InvokeFunction{InvocationID: "b9", FunctionID: "f"})
		owner.expect("invokefunction")
		owner.sendRaw(`{"type":"invocationresult","invocation_id":"b9","function_id":"f","error":"not an object"}`)
		res := c.expect("invocationresult")
		code, _ := errBody(t, res)
		assert.Equal(t, code, protocol.CodeInvalidFrame)
		owner.sync()
	})
}

func TestPingPong(t *testing.T) {
	te := startEngine(t, Options{})
	c := te.dial(t)
	c.sendRaw(`{"type":"ping"}`)
	c.expect("pong")
	c.sendRaw(`{"type":"pong"}`) // unsolicited pong: ignored
	c.sync()

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	assert.NilError(t, c.c.Ping(ctx), "WebSocket control pings are answered")
}

func TestInvocationStoppedWhenOwnerDies(t *testing.T) {
	te := startEngine(t, Options{})
	owner := te.dial(t)
	owner.registerIn("", "slow", "slow")
	caller := te.dial(t)

	caller.send(&protocol.InvokeFunction{InvocationID: "s1", FunctionID: "slow"})
	caller.send(&protocol.InvokeFunction{InvocationID: "s2", FunctionID: "slow"})
	owner.expect("invokefunction")
	owner.expect("invokefunction")

	// Without the owner's death ending them, these invocations would never
	// answer (they have no timeout) and expect would fail at its deadline;
	// no timing is asserted.
	assert.NilError(t, owner.c.CloseNow()) // abrupt: no close handshake
	got := map[string]bool{}
	for range 2 {
		res := caller.expect("invocationresult")
		code, _ := errBody(t, res)
		assert.Equal(t, code, protocol.CodeInvocationStopped)
		got[res.str("invocation_id")] = true
	}
	assert.DeepEqual(t, got, map[string]bool{"s1": true, "s2": true})

	// The function went with its owner.
	res := caller.call("s3", "slow", nil, ``)
	code, _ := errBody(t, res)
	assert.Equal(t, code, protocol.CodeFunctionNotFound)
}

func TestLateResultDropped(t *testing.T) {
	te := startEngine(t, Options{})
	owner := te.dial(t)
	owner.registerIn("", "o", "f")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := te.Invoke(ctx, "", "f", json.RawMessage(`{}`))
		done <- err
	}()
	in := owner.expect("invokefunction")
	cancel()
	assert.ErrorIs(t, waitfor.Recv(t, done, waitFor, "the cancelled Invoke to return"), context.Canceled)
	// The answer arrives after the caller gave up: dropped, nothing breaks.
	owner.send(&protocol.InvocationResult{InvocationID: in.str("invocation_id"), FunctionID: "f", Result: json.RawMessage(`1`)})
	owner.sync()

	// A caller that disconnects mid-call: its answer is dropped too.
	caller := te.dial(t)
	caller.send(&protocol.InvokeFunction{InvocationID: "l1", FunctionID: "f"})
	owner.expect("invokefunction")
	assert.NilError(t, caller.c.CloseNow())
	pollUntil(t, "caller gone", func() bool { return te.lookupWorker(caller.workerID) == nil })
	owner.send(&protocol.InvocationResult{InvocationID: "l1", FunctionID: "f", Result: json.RawMessage(`1`)})
	owner.sync()
}

func TestOnlyTheTargetMayAnswer(t *testing.T) {
	te := startEngine(t, Options{})
	owner := te.dial(t)
	owner.registerIn("", "o", "f")
	caller := te.dial(t)
	intruder := te.dial(t)

	caller.send(&protocol.InvokeFunction{InvocationID: "t1", FunctionID: "f"})
	owner.expect("invokefunction")
	intruder.send(&protocol.InvocationResult{InvocationID: "t1", FunctionID: "f", Result: json.RawMessage(`"forged"`)})
	intruder.sync()
	owner.send(&protocol.InvocationResult{InvocationID: "t1", FunctionID: "f", Result: json.RawMessage(`"real"`)})
	res := caller.expect("invocationresult")
	assert.Equal(t, res["result"], "real")
}

func TestDuplicateInvocationID(t *testing.T) {
	te := startEngine(t, Options{})
	owner := te.dial(t)
	owner.registerIn("", "o", "f")
	caller := te.dial(t)
	caller.send(&protocol.InvokeFunction{InvocationID: "d1", FunctionID: "f"})
	owner.expect("invokefunction")
	caller.send(&protocol.InvokeFunction{InvocationID: "d1", FunctionID: "f"})
	res := caller.expect("invocationresult")
	code, _ := errBody(t, res)
	assert.Equal(t, code, codeInvocationError)
	owner.send(&protocol.InvocationResult{InvocationID: "d1", FunctionID: "f", Result: json.RawMessage(`1`)})
	res = caller.expect("invocationresult")
	assert.Equal(t, res["result"], 1.0)
}

func TestThousandConcurrentCalls(t *testing.T) {
	te := startEngine(t, Options{})
	owner := te.dial(t)
	owner.registerIn("", "echo", "echo")
	owner.serveEcho()

	const callers, perCaller = 4, 250
	var wg sync.WaitGroup
	errs := make(chan error, callers*perCaller)
	for ci := range callers {
		c := te.dial(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := range perCaller {
				b := appendInvokeFrame(nil, fmt.Sprintf("c%d-%d", ci, i), "echo", json.RawMessage(fmt.Sprintf(`{"n":%d}`, ci*perCaller+i)), nil, "", "")
				if err := c.c.Write(ctx, websocket.MessageText, b); err != nil {
					errs <- err
					return
				}
			}
			seen := map[string]bool{}
			for range perCaller {
				var m inbound
				select {
				case m = <-c.in:
				case <-time.After(waitFor):
					errs <- fmt.Errorf("caller %d: missing results", ci)
					return
				}
				id := m.f.str("invocation_id")
				var i int
				if _, err := fmt.Sscanf(id, fmt.Sprintf("c%d-%%d", ci), &i); err != nil || seen[id] {
					errs <- fmt.Errorf("unexpected or duplicate result %s", m.raw)
					continue
				}
				seen[id] = true
				echo := m.f.obj("result").obj("echo")
				if echo["n"] != float64(ci*perCaller+i) || echo.str("_caller_worker_id") != c.workerID {
					errs <- fmt.Errorf("wrong result for %s: %s", id, m.raw)
				}
			}
		}()
	}
	waitfor.Group(t, &wg, waitFor, "the callers to collect their results")
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestInProcessInvoke(t *testing.T) {
	te := startEngine(t, Options{})
	owner := te.dial(t)
	owner.registerIn("orders", "o", "f")
	owner.serveEcho()

	out, err := te.Invoke(context.Background(), "orders", "f", json.RawMessage(`{"x":1}`))
	assert.NilError(t, err)
	assert.Equal(t, string(out), `{"echo":{"x":1}}`, "in-process callers carry no _caller_worker_id")

	_, err = te.Invoke(context.Background(), "", "f", nil)
	var eb *protocol.ErrorBody
	assert.Assert(t, is.ErrorType(err, eb))
	assert.ErrorContains(t, err, "It is registered in namespace(s): orders.")

	_, err = te.Invoke(context.Background(), "Bad", "f", nil)
	assert.Assert(t, is.ErrorType(err, eb))
	assert.ErrorContains(t, err, protocol.CodeInvalidNamespace)
}

func TestPeerThatStopsReadingIsDropped(t *testing.T) {
	e := newEngine(Options{}, 200*time.Millisecond)
	url, stop := serve(t, e)
	defer stop()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		assert.NilError(t, e.Close(ctx))
	}()
	te := &testEngine{Engine: e, url: url}

	owner := te.dial(t)
	owner.registerIn("", "big", "big::blob")
	blob := json.RawMessage(`"` + strings.Repeat("x", 1<<20) + `"`)
	go func() {
		for {
			select {
			case m := <-owner.in:
				if id := m.f.str("invocation_id"); id != "" {
					b := appendResultFrame(nil, id, "big::blob", blob, nil, "", "")
					if owner.c.Write(context.Background(), websocket.MessageText, b) != nil {
						return
					}
				}
			case <-owner.closed:
				return
			}
		}
	}()

	// A caller that asks for megabytes and never reads them: the engine's
	// writes to it block once the socket buffers are full.
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	deaf, _, err := websocket.Dial(ctx, url, nil)
	assert.NilError(t, err)
	defer deaf.CloseNow()
	go func() {
		// 40 MiB of answers: far beyond what loopback socket buffers hold.
		for i := range 40 {
			b := appendInvokeFrame(nil, fmt.Sprintf("deaf-%d", i), "big::blob", nil, nil, "", "")
			if deaf.Write(ctx, websocket.MessageText, b) != nil {
				return
			}
		}
	}()
	pollUntil(t, "the deaf caller is dropped", func() bool {
		for _, w := range e.snapshotWorkers() {
			if w.conn != nil && w.id != owner.workerID {
				return false
			}
		}
		return true
	})
	// The owner, whose read loop was the one writing to the deaf caller, is
	// unharmed: its read loop answers a ping.
	pctx, pcancel := context.WithTimeout(context.Background(), waitFor)
	defer pcancel()
	assert.NilError(t, owner.c.Ping(pctx))
}

// Enqueues waiting on a provider that does not answer are capped: the one
// past the cap is refused at once, and the slots come back when the
// provider goes.
func TestEnqueueInFlightCap(t *testing.T) {
	te := startEngine(t, Options{})
	provider := te.dialAdmin(t)
	provider.registerIn("", "queue", EnqueueProviderFunctionID)
	// One connection holds at most maxEnqueuesPerConnection of them.
	var callers []*rawClient
	for c := range maxEnqueuesInFlight / maxEnqueuesPerConnection {
		caller := te.dial(t)
		callers = append(callers, caller)
		for i := range maxEnqueuesPerConnection {
			caller.send(&protocol.InvokeFunction{InvocationID: fmt.Sprintf("e%d-%d", c, i), FunctionID: "job",
				Action: &protocol.TriggerAction{Type: protocol.ActionEnqueue, Queue: "jobs"}})
		}
	}
	pollUntil(t, "every hand-over to wait on the provider", func() bool { return len(te.enqueues) == maxEnqueuesInFlight })
	caller := te.dial(t)
	caller.send(&protocol.InvokeFunction{InvocationID: "over", FunctionID: "job", Action: &protocol.TriggerAction{Type: protocol.ActionEnqueue, Queue: "jobs"}})
	res := caller.expect("invocationresult")
	assert.Equal(t, res.str("invocation_id"), "over")
	code, msg := errBody(t, res)
	assert.Equal(t, code, CodeEnqueueError)
	assert.Assert(t, strings.Contains(msg, "already waiting"), msg)

	_ = provider.c.CloseNow()
	for _, caller := range callers {
		for range maxEnqueuesPerConnection {
			code, _ := errBody(t, caller.expect("invocationresult"))
			assert.Equal(t, code, CodeEnqueueError)
		}
	}
	pollUntil(t, "the slots to come back", func() bool { return len(te.enqueues) == 0 })
}
