package engine

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/protocol"
)

// TestListenerLimits: each cap a listener sets is enforced with its coded
// error, and the engine's other connections are untouched.
func TestListenerLimits(t *testing.T) {
	te := startEngine(t, Options{})
	url := te.listen(t, ListenerPolicy{Name: "tight", LoopbackHostOnly: true,
		Limits: Limits{Connections: 2, RegistrationsPerConnection: 3, FrameBytes: 4096}})
	bystander := te.dial(t)
	bystander.registerIn("", "bystander", "by::echo")
	bystander.serveEcho()

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	t.Run("registrations", func(t *testing.T) {
		c := te.dialURL(t, url, nil)
		// Three fit; the fourth closes the connection (a fifth could
		// meet a closed socket).
		for i := range 4 {
			c.send(&protocol.RegisterFunction{ID: "r::f" + string(rune('a'+i))})
		}
		var gotLimit bool
		for !gotLimit {
			f := c.next()
			gotLimit = f.typ() == "error" && f.obj("error").str("code") == CodeLimitExceeded
		}
		// waitClosed fails the test unless the engine closes it.
		_ = c.waitClosed()
		assert.Assert(t, !hasFn(te, DefaultNamespace, "r::fd"))
	})

	t.Run("frame size", func(t *testing.T) {
		c, _, err := websocket.Dial(ctx, url, nil)
		assert.NilError(t, err)
		defer c.CloseNow()
		_ = c.Write(ctx, websocket.MessageText, bytes.Repeat([]byte(" "), 5000))
		for err == nil {
			_, _, err = c.Read(ctx)
		}
		assert.Equal(t, websocket.CloseStatus(err), websocket.StatusMessageTooBig)
	})

	t.Run("connections", func(t *testing.T) {
		// The earlier subtests' sockets are released by the engine after
		// their client side closes; wait until both places are free.
		var a, b *websocket.Conn
		pollUntil(t, "both places free", func() bool {
			var err error
			if a == nil {
				if a, _, err = websocket.Dial(ctx, url, nil); err != nil {
					a = nil
					return false
				}
			}
			if b, _, err = websocket.Dial(ctx, url, nil); err != nil {
				b = nil
				return false
			}
			return true
		})
		defer a.CloseNow()
		defer b.CloseNow()
		_, resp, err := websocket.Dial(ctx, url, nil)
		assert.Assert(t, err != nil)
		assert.Equal(t, resp.StatusCode, http.StatusServiceUnavailable)
		// Closing one makes room again.
		_ = a.Close(websocket.StatusNormalClosure, "")
		pollUntil(t, "room for another", func() bool {
			c, _, err := websocket.Dial(ctx, url, nil)
			if err != nil {
				return false
			}
			c.CloseNow()
			return true
		})
	})

	// Through it all the default listener's worker is served.
	caller := te.dial(t)
	f := caller.call("ok", "by::echo", nil, `{"x":1}`)
	assert.Check(t, is.Equal(f.obj("result").obj("echo")["x"], 1.0))
}
