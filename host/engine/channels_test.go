package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/protocol"
)

func channelURL(te *testEngine, ref protocol.StreamChannelRef) string {
	return te.url + "/ws/channels/" + ref.ChannelID + "?key=" + url.QueryEscape(ref.AccessKey) + "&dir=" + ref.Direction
}

func dialChannel(t *testing.T, te *testEngine, ref protocol.StreamChannelRef) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, _, err := websocket.Dial(ctx, channelURL(te, ref), nil)
	assert.NilError(t, err)
	c.SetReadLimit(readLimit)
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

func createChannel(t *testing.T, w *rawClient, data string) (writer, reader protocol.StreamChannelRef) {
	t.Helper()
	res := w.call("ch-"+data, FnChannelsCreate, nil, data)
	var out struct {
		Writer protocol.StreamChannelRef `json:"writer"`
		Reader protocol.StreamChannelRef `json:"reader"`
	}
	assert.NilError(t, json.Unmarshal(mustJSON(t, res["result"]), &out), "%v", res)
	return out.Writer, out.Reader
}

func TestChannelRelay(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	writer, reader := createChannel(t, w, `{"buffer_size":2}`)
	assert.Equal(t, writer.ChannelID, reader.ChannelID)
	assert.Equal(t, writer.AccessKey, reader.AccessKey)
	assert.Equal(t, writer.Direction, "write")
	assert.Equal(t, reader.Direction, "read")

	wc := dialChannel(t, te, writer)
	rc := dialChannel(t, te, reader)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	sent := []struct {
		typ  websocket.MessageType
		data string
	}{
		{websocket.MessageText, `{"line":1}`},
		{websocket.MessageBinary, "\x00\x01\x02"},
		{websocket.MessageText, "plain text"},
		{websocket.MessageBinary, string(make([]byte, 70_000))},
		{websocket.MessageText, "last"},
	}
	// More items than the buffer holds: the writer is held back, not failed.
	go func() {
		for _, m := range sent {
			if wc.Write(ctx, m.typ, []byte(m.data)) != nil {
				return
			}
		}
		_ = wc.Close(websocket.StatusNormalClosure, "stream_complete")
	}()
	for i, m := range sent {
		typ, data, err := rc.Read(ctx)
		assert.NilError(t, err, "item %d", i)
		assert.Equal(t, typ, m.typ, "item %d", i)
		assert.Equal(t, string(data), m.data, "item %d", i)
	}
	_, _, err := rc.Read(ctx)
	assert.Equal(t, websocket.CloseStatus(err), websocket.StatusNormalClosure, "reader gets a normal close once the writer is done: %v", err)
	pollUntil(t, "finished channel forgotten", func() bool { return te.channels.get(writer.ChannelID) == nil })
}

func TestChannelRefusals(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	writer, reader := createChannel(t, w, `{}`)

	bad := writer
	bad.AccessKey = "wrong"
	unknown := writer
	unknown.ChannelID = "no-such-channel"
	assert.Equal(t, httpStatus(t, channelURL(te, bad)), http.StatusNotFound)
	assert.Equal(t, httpStatus(t, channelURL(te, unknown)), http.StatusNotFound)
	noKey := te.url + "/ws/channels/" + writer.ChannelID + "?dir=write"
	assert.Equal(t, httpStatus(t, noKey), http.StatusNotFound)
	badDir := writer
	badDir.Direction = "sideways"
	assert.Equal(t, httpStatus(t, channelURL(te, badDir)), http.StatusBadRequest)

	// One take per side: whichever taker comes second is closed at once
	// (the two dials race to take the end, so either may be second).
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	closed := make(chan error, 2)
	for range 2 {
		c := dialChannel(t, te, reader)
		go func() {
			_, _, err := c.Read(ctx)
			closed <- err
		}()
	}
	err := <-closed
	assert.Equal(t, websocket.CloseStatus(err), websocket.StatusPolicyViolation, "%v", err)
}

func TestChannelSweepAndOwnerCleanup(t *testing.T) {
	te := startEngine(t, Options{ChannelTTL: 10 * time.Millisecond, ChannelSweepInterval: 5 * time.Millisecond})

	t.Run("TTL sweep removes channels not fully taken", func(t *testing.T) {
		w, _ := te.CreateChannel(0)
		pollUntil(t, "stale channel swept", func() bool { return te.channels.get(w.ChannelID) == nil })
		assert.Equal(t, httpStatus(t, channelURL(te, w)), http.StatusNotFound)
	})

	t.Run("fully taken channels are not swept", func(t *testing.T) {
		writer, reader := te.CreateChannel(4)
		wc := dialChannel(t, te, writer)
		rc := dialChannel(t, te, reader)
		// A channel made after it and never taken is swept once it is past
		// the TTL: by then the taken one is too, and a sweep has passed
		// over it.
		canary, _ := te.CreateChannel(0)
		pollUntil(t, "the untaken canary channel swept", func() bool { return te.channels.get(canary.ChannelID) == nil })
		assert.Assert(t, te.channels.get(writer.ChannelID) != nil, "the fully taken channel was swept")
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		assert.NilError(t, wc.Write(ctx, websocket.MessageText, []byte("still here")))
		_, data, err := rc.Read(ctx)
		assert.NilError(t, err)
		assert.Equal(t, string(data), "still here")
	})

	t.Run("removed when the creating worker disconnects", func(t *testing.T) {
		long := startEngine(t, Options{})
		w := long.dial(t)
		writer, reader := createChannel(t, w, `{"buffer_size":5000}`)
		assert.Equal(t, cap(long.channels.get(writer.ChannelID).items), maxChannelBuffer, "buffer_size is capped")
		rc := dialChannel(t, long, reader)
		assert.NilError(t, w.c.CloseNow())
		pollUntil(t, "owned channel removed", func() bool { return long.channels.get(writer.ChannelID) == nil })
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		_, _, err := rc.Read(ctx)
		assert.Assert(t, err != nil, "the taken end is closed")
		assert.Equal(t, httpStatus(t, channelURL(long, writer)), http.StatusNotFound)
	})
}

func TestChannelCreateValidation(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	for _, in := range []string{`{"buffer_size":0}`, `{"buffer_size":-3}`, `{"buffer_size":"big"}`, `[1]`} {
		res := w.call("cv"+in, FnChannelsCreate, nil, in)
		code, _ := errBody(t, res)
		assert.Equal(t, code, CodeInvalidArgument, "input %s", in)
	}
	writer, _ := createChannel(t, w, ``)
	assert.Equal(t, cap(te.channels.get(writer.ChannelID).items), defaultChannelBuffer)
}

// TestChannelDrop: engine::channels::drop removes a channel at once, given
// its id and key: its slot is free again (a connection at its limit
// creates another), an open end closes as going away, and a wrong key or
// an unknown id answer dropped:false and touch nothing.
func TestChannelDrop(t *testing.T) {
	te := startEngine(t, Options{})
	c := te.dial(t)
	var last protocol.StreamChannelRef
	for i := range MaxChannelsPerConnection {
		last, _ = createChannel(t, c, fmt.Sprintf(`{"buffer_size":%d}`, i%1000+1))
	}
	f := c.call("over", FnChannelsCreate, nil, `{}`)
	code, _ := errBody(t, f)
	assert.Equal(t, code, CodeLimitExceeded)

	writer, reader := createChannel(t, te.dial(t), `{}`)
	open := dialChannel(t, te, reader)
	for _, tc := range []struct {
		in      string
		dropped bool
	}{
		{`{"channel_id":"` + writer.ChannelID + `","access_key":"wrong"}`, false},
		{`{"channel_id":"nope","access_key":"` + writer.AccessKey + `"}`, false},
		{string(mustJSON(t, writer)), true},
		{string(mustJSON(t, writer)), false}, // gone already
	} {
		f := c.call("drop", FnChannelsDrop, nil, tc.in)
		assert.Assert(t, f["error"] == nil, "%s: %v", tc.in, f)
		assert.DeepEqual(t, f["result"], map[string]any{"dropped": tc.dropped})
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, _, err := open.Read(ctx)
	assert.Equal(t, websocket.CloseStatus(err), statusGoingAway, "%v", err)

	f = c.call("bad", FnChannelsDrop, nil, `{"channel_id":"x"}`)
	code, _ = errBody(t, f)
	assert.Equal(t, code, CodeInvalidArgument)

	// The connection at its limit drops one and creates one.
	f = c.call("drop-last", FnChannelsDrop, nil, string(mustJSON(t, last)))
	assert.DeepEqual(t, f["result"], map[string]any{"dropped": true})
	f = c.call("again", FnChannelsCreate, nil, `{}`)
	assert.Assert(t, f["error"] == nil, "%v", f)
}
