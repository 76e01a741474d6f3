package engine

import (
	"fmt"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/protocol"
)

// TestCallerBudgets: ids, unanswered calls and registrations are charged
// to the connection that sent them, each cap answered LIMIT_EXCEEDED; what
// a connection held is released when it leaves.
func TestCallerBudgets(t *testing.T) {
	te := startEngine(t, Options{})
	url := te.listen(t, ListenerPolicy{Name: "tight", LoopbackHostOnly: true,
		Limits: Limits{IDBytes: 64, InflightPerConnection: 3, InflightBytesPerConnection: 4000,
			RegistrationBytes: 2000, RegistrationBytesPerConnection: 5000}})

	t.Run("ids", func(t *testing.T) {
		c := te.dialURL(t, url, nil)
		f := c.call(strings.Repeat("i", 65), "engine::functions::list", nil, "")
		code, _ := errBody(t, f)
		assert.Equal(t, code, CodeLimitExceeded)
		c.send(&protocol.RegisterFunction{ID: "x::" + strings.Repeat("f", 70)})
		f = c.expect("error")
		assert.Equal(t, f.obj("error").str("code"), CodeLimitExceeded)
		c.sync() // the socket stays
	})

	t.Run("unanswered calls", func(t *testing.T) {
		c := te.dialURL(t, url, nil)
		c.registerIn("", "sink", "sink::f")
		for i := range 3 {
			c.send(&protocol.InvokeFunction{InvocationID: fmt.Sprint("c", i), FunctionID: "sink::f"})
			c.expect("invokefunction") // delivered to itself, never answered
		}
		f := c.call("c3", "sink::f", nil, "")
		code, msg := errBody(t, f)
		assert.Equal(t, code, CodeLimitExceeded, msg)
		assert.Assert(t, strings.Contains(msg, "inflight_per_connection"), msg)
		assert.Equal(t, te.inbound.inflight.Load(), int64(3))
		_ = c.c.CloseNow()
		pollUntil(t, "the unanswered calls to be released", func() bool { return te.inbound.inflight.Load() == 0 })
	})

	t.Run("unanswered bytes", func(t *testing.T) {
		c := te.dialURL(t, url, nil)
		c.registerIn("", "sink2", "sink2::f")
		big := `"` + strings.Repeat("p", 3000) + `"`
		c.send(&protocol.InvokeFunction{InvocationID: "b0", FunctionID: "sink2::f", Data: []byte(big)})
		c.expect("invokefunction")
		f := c.call("b1", "sink2::f", nil, big)
		code, msg := errBody(t, f)
		assert.Equal(t, code, CodeLimitExceeded, msg)
		assert.Assert(t, strings.Contains(msg, "inflight_bytes_per_connection"), msg)
	})

	t.Run("registration bytes", func(t *testing.T) {
		c := te.dialURL(t, url, nil)
		c.send(&protocol.RegisterFunction{ID: "r::huge", Description: strings.Repeat("d", 2100)})
		f := c.expect("error")
		assert.Equal(t, f.obj("error").str("code"), CodeLimitExceeded)
		c.sync()
		// Re-registering replaces its cost; an unregistration frees it.
		for range 5 {
			c.send(&protocol.RegisterFunction{ID: "r::same", Description: strings.Repeat("d", 1500)})
		}
		c.send(&protocol.UnregisterFunction{ID: "r::same"})
		c.sync()
		before := te.inbound.regBytes.Load()
		for i := range 4 {
			c.send(&protocol.RegisterFunction{ID: fmt.Sprint("r::f", i), Description: strings.Repeat("d", 1500)})
		}
		f = c.expect("error")
		assert.Equal(t, f.obj("error").str("code"), CodeLimitExceeded)
		_ = c.waitClosed()
		pollUntil(t, "the registrations' bytes to be released", func() bool { return te.inbound.regBytes.Load() < before+1 })
	})
}

// TestChannelsPerConnection: one connection cannot take every channel;
// another still gets one.
func TestChannelsPerConnection(t *testing.T) {
	te := startEngine(t, Options{})
	c := te.dial(t)
	for i := range MaxChannelsPerConnection {
		f := c.call(fmt.Sprint("ch", i), FnChannelsCreate, nil, `{}`)
		assert.Assert(t, f["error"] == nil, "channel %d: %v", i, f)
	}
	f := c.call("over", FnChannelsCreate, nil, `{}`)
	code, _ := errBody(t, f)
	assert.Equal(t, code, CodeLimitExceeded)
	other := te.dial(t)
	f = other.call("mine", FnChannelsCreate, nil, `{}`)
	assert.Assert(t, f["error"] == nil, "%v", f)
}

// TestOutboundHogDropped: when the engine-wide room for outbound queues
// runs out, the connection holding the most of it is dropped, and the
// connection that needed room gets it once that is released.
func TestOutboundHogDropped(t *testing.T) {
	te := startEngine(t, Options{})
	hog, other := te.dial(t), te.dial(t)
	hc, oc := te.conn(t, hog.workerID), te.conn(t, other.workerID)
	assert.Assert(t, te.inbound.outAll.TryAcquire(QueuedBytesTotal))
	hc.qBytes.Store(2 << 20) // as if its unread frames held the room
	go func() {
		_ = hog.waitClosed()
		hc.qBytes.Store(0)
		te.inbound.outAll.Release(QueuedBytesTotal)
	}()
	assert.Assert(t, oc.outBytes.TryAcquire(100))
	assert.Assert(t, oc.reserveEngine(100), "the connection that reads did not get room")
	oc.unreserve(make([]byte, 100))
	other.sync()
}
