package engine

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/protocol"
)

func enqueueMsg(id, data string) *protocol.InvokeFunction {
	m := &protocol.InvokeFunction{InvocationID: id, FunctionID: "jobs::run",
		Action: &protocol.TriggerAction{Type: protocol.ActionEnqueue, Queue: "jobs"}}
	if data != "" {
		m.Data = json.RawMessage(data)
	}
	return m
}

// answer answers an invokefunction the client received.
func (rc *rawClient) answer(f frame, result string) {
	rc.t.Helper()
	rc.send(&protocol.InvocationResult{InvocationID: f.str("invocation_id"), FunctionID: f.str("function_id"), Result: json.RawMessage(result)})
}

// TestEnqueueBudget: an enqueue waiting on the queue provider is charged
// to the connection that enqueued it (count and bytes, void or not) under
// its in-flight budget; past it the enqueue is answered LIMIT_EXCEEDED,
// another connection still enqueues, and what was held is released when
// the hand-over ends.
func TestEnqueueBudget(t *testing.T) {
	te := startEngine(t, Options{})
	provider := te.dialAdmin(t)
	provider.registerIn("", "queue", EnqueueProviderFunctionID)
	url := te.listen(t, ListenerPolicy{Name: "tight", LoopbackHostOnly: true,
		Limits: Limits{InflightPerConnection: 3, InflightBytesPerConnection: 8000}})

	t.Run("count", func(t *testing.T) {
		c := te.dialURL(t, url, nil)
		c.send(enqueueMsg("", `{"void":true}`)) // a void enqueue is held as well
		var held []frame
		for i := range 3 {
			if i > 0 {
				c.send(enqueueMsg(fmt.Sprint("e", i), `{}`))
			}
			held = append(held, provider.expect("invokefunction"))
		}
		assert.Equal(t, te.inbound.inflight.Load(), int64(3))
		c.send(enqueueMsg("over", `{}`))
		res := c.expect("invocationresult")
		assert.Equal(t, res.str("invocation_id"), "over")
		code, msg := errBody(t, res)
		assert.Equal(t, code, CodeLimitExceeded, msg)
		assert.Assert(t, strings.Contains(msg, "inflight_per_connection"), msg)

		// Another connection still enqueues.
		other := te.dialURL(t, url, nil)
		other.send(enqueueMsg("o0", `{}`))
		provider.answer(provider.expect("invokefunction"), `{}`)
		res = other.expect("invocationresult")
		assert.Assert(t, res["error"] == nil, "%v", res)
		assert.Assert(t, res.obj("result").str("messageReceiptId") != "", "%v", res)

		// An ended hand-over gives its room back.
		provider.answer(held[1], `{}`)
		res = c.expect("invocationresult")
		assert.Equal(t, res.str("invocation_id"), "e1")
		assert.Assert(t, res["error"] == nil, "%v", res)
		c.send(enqueueMsg("e3", `{}`))
		held = append(held, provider.expect("invokefunction"))
		for _, f := range []frame{held[0], held[2], held[3]} {
			provider.answer(f, `{}`)
		}
		pollUntil(t, "the hand-overs to be released", func() bool { return te.inbound.inflight.Load() == 0 })
	})

	t.Run("bytes", func(t *testing.T) {
		c := te.dialURL(t, url, nil)
		big := `"` + strings.Repeat("p", 5000) + `"`
		c.send(enqueueMsg("", big))
		f := provider.expect("invokefunction")
		c.send(enqueueMsg("b1", big))
		res := c.expect("invocationresult")
		code, msg := errBody(t, res)
		assert.Equal(t, code, CodeLimitExceeded, msg)
		assert.Assert(t, strings.Contains(msg, "inflight_bytes_per_connection"), msg)
		// A small one still fits.
		c.send(enqueueMsg("b2", `{}`))
		g := provider.expect("invokefunction")
		provider.answer(f, `{}`)
		provider.answer(g, `{}`)
		res = c.expect("invocationresult")
		assert.Equal(t, res.str("invocation_id"), "b2")
		pollUntil(t, "the hand-overs to be released", func() bool { return te.inbound.inflight.Load() == 0 })
	})

	t.Run("caller leaves", func(t *testing.T) {
		c := te.dialURL(t, url, nil)
		for i := range 3 {
			c.send(enqueueMsg(fmt.Sprint("l", i), `{}`))
			provider.expect("invokefunction")
		}
		_ = c.c.CloseNow()
		// The enqueues are not lost with their caller: they stay charged
		// until the provider took or refused them.
		_ = provider.c.CloseNow()
		pollUntil(t, "the hand-overs to be released", func() bool { return te.inbound.inflight.Load() == 0 })
	})
}

// TestMiddlewareBudget: a call waiting in the listener's middleware is
// charged to its caller like a direct call (count and bytes); past it the
// call is answered LIMIT_EXCEEDED, and what was held is released when the
// caller leaves.
func TestMiddlewareBudget(t *testing.T) {
	te := startEngine(t, Options{})
	mw := te.dialAdmin(t)
	mw.registerIn("", "mw", "mw::gate")
	url := te.listen(t, ListenerPolicy{Name: "gated", LoopbackHostOnly: true, MiddlewareFunctionID: "mw::gate",
		Limits: Limits{InflightPerConnection: 3, InflightBytesPerConnection: 8000}})

	t.Run("count", func(t *testing.T) {
		c := te.dialURL(t, url, nil)
		var held []frame
		for i := range 3 {
			c.send(&protocol.InvokeFunction{InvocationID: fmt.Sprint("m", i), FunctionID: "api::echo", Data: json.RawMessage(`{}`)})
			f := mw.expect("invokefunction")
			assert.Equal(t, f.str("function_id"), "mw::gate")
			held = append(held, f)
		}
		assert.Equal(t, te.inbound.inflight.Load(), int64(3))
		f := c.call("over", "api::echo", nil, `{}`)
		code, msg := errBody(t, f)
		assert.Equal(t, code, CodeLimitExceeded, msg)
		assert.Assert(t, strings.Contains(msg, "inflight_per_connection"), msg)

		// Another caller still goes through; an answered call gives its
		// room back.
		other := te.dialURL(t, url, nil)
		other.send(&protocol.InvokeFunction{InvocationID: "o0", FunctionID: "api::echo", Data: json.RawMessage(`{}`)})
		mw.answer(mw.expect("invokefunction"), `{"ok":true}`)
		res := other.expect("invocationresult")
		assert.Assert(t, res["error"] == nil, "%v", res)
		mw.answer(held[0], `{"ok":true}`)
		res = c.expect("invocationresult")
		assert.Equal(t, res.str("invocation_id"), "m0")
		c.send(&protocol.InvokeFunction{InvocationID: "m3", FunctionID: "api::echo", Data: json.RawMessage(`{}`)})
		mw.expect("invokefunction")

		_ = c.c.CloseNow()
		pollUntil(t, "the caller's calls to be released", func() bool { return te.inbound.inflight.Load() == 0 })
	})

	t.Run("bytes", func(t *testing.T) {
		c := te.dialURL(t, url, nil)
		big := `"` + strings.Repeat("p", 5000) + `"`
		c.send(&protocol.InvokeFunction{InvocationID: "b0", FunctionID: "api::echo", Data: json.RawMessage(big)})
		mw.expect("invokefunction")
		f := c.call("b1", "api::echo", nil, big)
		code, msg := errBody(t, f)
		assert.Equal(t, code, CodeLimitExceeded, msg)
		assert.Assert(t, strings.Contains(msg, "inflight_bytes_per_connection"), msg)
		_ = c.c.CloseNow()
		pollUntil(t, "the caller's calls to be released", func() bool { return te.inbound.inflight.Load() == 0 })
	})
}

// TestEnqueuesPerConnection: one connection cannot take every hand-over to
// the queue provider: past maxEnqueuesPerConnection its enqueue is answered
// LIMIT_EXCEEDED, and another connection's still goes.
func TestEnqueuesPerConnection(t *testing.T) {
	te := startEngine(t, Options{})
	provider := te.dialAdmin(t)
	provider.registerIn("", "queue", EnqueueProviderFunctionID)
	c := te.dial(t)
	for i := range maxEnqueuesPerConnection {
		c.send(enqueueMsg(fmt.Sprint("e", i), `{}`))
	}
	pollUntil(t, "the hand-overs to wait on the provider", func() bool { return len(te.enqueues) == maxEnqueuesPerConnection })
	c.send(enqueueMsg("over", `{}`))
	res := c.expect("invocationresult")
	assert.Equal(t, res.str("invocation_id"), "over")
	code, msg := errBody(t, res)
	assert.Equal(t, code, CodeLimitExceeded, msg)
	assert.Assert(t, strings.Contains(msg, "enqueues waiting"), msg)

	other := te.dial(t)
	other.send(enqueueMsg("o0", `{}`))
	pollUntil(t, "the other connection's hand-over", func() bool { return len(te.enqueues) == maxEnqueuesPerConnection+1 })
	_ = provider.c.CloseNow()
	pollUntil(t, "the hand-overs to be released", func() bool { return len(te.enqueues) == 0 && te.inbound.inflight.Load() == 0 })
}
