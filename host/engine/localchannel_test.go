package engine

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// The in-process endpoints are tested against real WebSocket peers on a
// real loopback server, so both kinds of end are seen to keep the same
// rules. Helpers here are prefixed lc to stay apart from the other test
// files of the package.

const lcWait = 10 * time.Second // a hang guard, not a timing assertion

type lcEngine struct {
	*Engine
	url string
}

func lcStart(t *testing.T, opts Options) *lcEngine {
	t.Helper()
	e := New(opts)
	srv := httptest.NewServer(e.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), lcWait)
		defer cancel()
		assert.NilError(t, e.Close(ctx))
		srv.Close()
	})
	return &lcEngine{Engine: e, url: "ws" + strings.TrimPrefix(srv.URL, "http")}
}

func (le *lcEngine) dial(t *testing.T, ref protocol.StreamChannelRef) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), lcWait)
	defer cancel()
	u := le.url + "/ws/channels/" + ref.ChannelID + "?key=" + url.QueryEscape(ref.AccessKey) + "&dir=" + ref.Direction
	c, _, err := websocket.Dial(ctx, u, nil)
	assert.NilError(t, err)
	c.SetReadLimit(readLimit)
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

func lcCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), lcWait)
	t.Cleanup(cancel)
	return ctx
}

func lcGone(t *testing.T, le *lcEngine, id string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if le.channels.get(id) == nil {
			return poll.Success()
		}
		return poll.Continue("channel %s still in the table", id)
	}, poll.WithTimeout(lcWait), poll.WithDelay(5*time.Millisecond))
}

func TestLocalWriterToSocketReader(t *testing.T) {
	le := lcStart(t, Options{})
	ctx := lcCtx(t)
	wref, rref := le.CreateChannel(2)
	w, err := le.OpenChannelWriter(wref)
	assert.NilError(t, err)
	rc := le.dial(t, rref)

	big := bytes.Repeat([]byte("0123456789"), 20_000)
	sent := []struct {
		text bool
		data []byte
	}{
		{true, []byte(`{"meta":1}`)},
		{false, []byte{0, 1, 2}},
		{false, big},
		{true, []byte("tail")},
		{false, []byte("last")},
	}
	// More items than the buffer holds: the writer waits, it is not failed.
	writeErr := make(chan error, 1)
	go func() {
		for _, s := range sent {
			var err error
			if s.text {
				err = w.WriteText(ctx, string(s.data))
			} else {
				_, err = w.WriteContext(ctx, s.data)
			}
			if err != nil {
				writeErr <- err
				return
			}
		}
		writeErr <- w.Close()
	}()
	for i, s := range sent {
		typ, data, err := rc.Read(ctx)
		assert.NilError(t, err, "item %d", i)
		want := websocket.MessageBinary
		if s.text {
			want = websocket.MessageText
		}
		assert.Equal(t, typ, want, "item %d", i)
		assert.Assert(t, bytes.Equal(data, s.data), "item %d", i)
	}
	assert.NilError(t, waitfor.Recv(t, writeErr, waitFor, "the writer to finish"))
	_, _, err = rc.Read(ctx)
	assert.Equal(t, websocket.CloseStatus(err), websocket.StatusNormalClosure, "%v", err)
	lcGone(t, le, wref.ChannelID)

	// Writing after Close fails; Close again is harmless.
	_, err = w.Write([]byte("late"))
	assert.ErrorIs(t, err, ErrChannelEndClosed)
	assert.NilError(t, w.Close())
}

func TestSocketWriterToLocalReader(t *testing.T) {
	for _, tc := range []struct {
		name  string
		items bool // read with ReadItem instead of Read
	}{{"Read skips text", false}, {"ReadItem surfaces every item", true}} {
		t.Run(tc.name, func(t *testing.T) {
			le := lcStart(t, Options{})
			ctx := lcCtx(t)
			wref, rref := le.CreateChannel(0)
			r, err := le.OpenChannelReader(rref)
			assert.NilError(t, err)
			wc := le.dial(t, wref)
			go func() {
				_ = wc.Write(ctx, websocket.MessageBinary, []byte("hello "))
				_ = wc.Write(ctx, websocket.MessageText, []byte("a text item"))
				_ = wc.Write(ctx, websocket.MessageBinary, []byte("world"))
				_ = wc.Close(websocket.StatusNormalClosure, "stream_complete")
			}()
			if tc.items {
				var got []ChannelItem
				for {
					it, err := r.ReadItem(ctx)
					if errors.Is(err, io.EOF) {
						break
					}
					assert.NilError(t, err)
					got = append(got, it)
				}
				assert.DeepEqual(t, got, []ChannelItem{
					{Data: []byte("hello ")}, {Text: true, Data: []byte("a text item")}, {Data: []byte("world")},
				})
			} else {
				data, err := io.ReadAll(r)
				assert.NilError(t, err)
				assert.Equal(t, string(data), "hello world")
			}
			assert.NilError(t, r.Close())
			lcGone(t, le, wref.ChannelID)
			// What the socket writer's items were charged to the
			// engine-wide channel budget comes back once they are read:
			// kept, each fs::write would shrink it until all channels stall.
			poll.WaitOn(t, func(poll.LogT) poll.Result {
				if le.inbound.chanBytes.TryAcquire(ChannelBytesTotal) {
					le.inbound.chanBytes.Release(ChannelBytesTotal)
					return poll.Success()
				}
				return poll.Continue("the channel budget is still charged")
			}, poll.WithTimeout(lcWait), poll.WithDelay(5*time.Millisecond))
		})
	}
}

func TestLocalChannelOneTakePerSide(t *testing.T) {
	le := lcStart(t, Options{})
	ctx := lcCtx(t)
	wref, rref := le.CreateChannel(0)

	_, err := le.OpenChannelWriter(rref)
	assert.ErrorIs(t, err, ErrChannelDirection, "the reader ref does not open the write end")
	bad := wref
	bad.AccessKey = "wrong"
	_, err = le.OpenChannelWriter(bad)
	assert.ErrorIs(t, err, ErrChannelNotFound)
	unknown := rref
	unknown.ChannelID = "no-such-channel"
	_, err = le.OpenChannelReader(unknown)
	assert.ErrorIs(t, err, ErrChannelNotFound)

	w, err := le.OpenChannelWriter(wref)
	assert.NilError(t, err)
	_, err = le.OpenChannelWriter(wref)
	assert.ErrorIs(t, err, ErrChannelEndTaken, "a second in-process taker is refused")
	// A socket coming second is refused too, as between two sockets.
	late := le.dial(t, wref)
	_, _, err = late.Read(ctx)
	assert.Equal(t, websocket.CloseStatus(err), websocket.StatusPolicyViolation, "%v", err)

	// And the other way round: a socket reader first, then in-process.
	rc := le.dial(t, rref)
	assert.NilError(t, w.WriteText(ctx, "ping")) // the socket end is taken once it reads
	_, data, err := rc.Read(ctx)
	assert.NilError(t, err)
	assert.Equal(t, string(data), "ping")
	_, err = le.OpenChannelReader(rref)
	assert.ErrorIs(t, err, ErrChannelEndTaken)
	assert.NilError(t, w.Close())
}

func TestLocalChannelEarlyEnds(t *testing.T) {
	t.Run("writer abort reaches a socket reader as going away", func(t *testing.T) {
		le := lcStart(t, Options{})
		ctx := lcCtx(t)
		wref, rref := le.CreateChannel(0)
		w, err := le.OpenChannelWriter(wref)
		assert.NilError(t, err)
		rc := le.dial(t, rref)
		_, err = w.WriteContext(ctx, []byte("partial"))
		assert.NilError(t, err)
		_, _, err = rc.Read(ctx)
		assert.NilError(t, err)
		w.Abort()
		_, _, err = rc.Read(ctx)
		assert.Equal(t, websocket.CloseStatus(err), websocket.StatusGoingAway, "a broken stream is not a complete one: %v", err)
		lcGone(t, le, wref.ChannelID)
		assert.ErrorIs(t, w.Close(), nil, "Close after Abort is a no-op")
	})

	t.Run("socket writer that leaves early ends the local stream", func(t *testing.T) {
		le := lcStart(t, Options{})
		ctx := lcCtx(t)
		wref, rref := le.CreateChannel(0)
		r, err := le.OpenChannelReader(rref)
		assert.NilError(t, err)
		wc := le.dial(t, wref)
		assert.NilError(t, wc.Write(ctx, websocket.MessageBinary, []byte("x")))
		_ = wc.CloseNow()
		data, err := io.ReadAll(r)
		// The WebSocket endpoint ends the stream when its writer goes,
		// however it went; what was sent arrives.
		assert.NilError(t, err)
		assert.Equal(t, string(data), "x")
	})

	t.Run("local reader that leaves early releases a socket writer", func(t *testing.T) {
		le := lcStart(t, Options{})
		ctx := lcCtx(t)
		wref, rref := le.CreateChannel(1)
		r, err := le.OpenChannelReader(rref)
		assert.NilError(t, err)
		wc := le.dial(t, wref)
		assert.NilError(t, r.Close())
		// The socket is closed by the engine; a write or a read sees it.
		var werr error
		for i := 0; i < 100 && werr == nil; i++ {
			werr = wc.Write(ctx, websocket.MessageBinary, []byte("nobody reads this"))
		}
		if werr == nil {
			_, _, werr = wc.Read(ctx)
		}
		assert.Assert(t, werr != nil, "the writer was released")
		_, err = r.Read(make([]byte, 4))
		assert.ErrorIs(t, err, ErrChannelEndClosed)
		lcGone(t, le, wref.ChannelID)
	})

	t.Run("local reader that leaves early releases a local writer", func(t *testing.T) {
		le := lcStart(t, Options{})
		ctx := lcCtx(t)
		wref, rref := le.CreateChannel(1)
		w, err := le.OpenChannelWriter(wref)
		assert.NilError(t, err)
		r, err := le.OpenChannelReader(rref)
		assert.NilError(t, err)
		_, err = w.WriteContext(ctx, []byte("fills the buffer"))
		assert.NilError(t, err)
		blocked := make(chan error, 1)
		go func() {
			_, err := w.WriteContext(ctx, []byte("waits for room"))
			blocked <- err
		}()
		assert.NilError(t, r.Close())
		assert.ErrorIs(t, waitfor.Recv(t, blocked, waitFor, "the blocked write to fail once the reader closed"), ErrChannelClosed)
		assert.ErrorIs(t, w.Close(), ErrChannelClosed, "Close reports the items may not have been read")
		lcGone(t, le, wref.ChannelID)
	})

	t.Run("contexts bound blocked reads and writes", func(t *testing.T) {
		le := lcStart(t, Options{})
		wref, rref := le.CreateChannel(1)
		w, err := le.OpenChannelWriter(wref)
		assert.NilError(t, err)
		r, err := le.OpenChannelReader(rref)
		assert.NilError(t, err)
		gone, cancel := context.WithCancel(context.Background())
		cancel()
		_, err = r.ReadContext(gone, make([]byte, 8))
		assert.ErrorIs(t, err, context.Canceled)
		_, err = w.WriteContext(context.Background(), []byte("a"))
		assert.NilError(t, err)
		_, err = w.WriteContext(gone, []byte("b"))
		assert.ErrorIs(t, err, context.Canceled)
		// Neither end is spoilt by a cancelled call.
		assert.NilError(t, w.Close())
		data, err := io.ReadAll(r)
		assert.NilError(t, err)
		assert.Equal(t, string(data), "a")
	})

	t.Run("engine close ends blocked endpoints", func(t *testing.T) {
		e := New(Options{})
		wref, rref := e.CreateChannel(1)
		w, err := e.OpenChannelWriter(wref)
		assert.NilError(t, err)
		r, err := e.OpenChannelReader(rref)
		assert.NilError(t, err)
		readErr := make(chan error, 1)
		go func() {
			_, err := r.Read(make([]byte, 8))
			readErr <- err
		}()
		ctx := lcCtx(t)
		assert.NilError(t, e.Close(ctx))
		assert.ErrorIs(t, waitfor.Recv(t, readErr, waitFor, "the blocked read to fail once the engine closed"), ErrChannelClosed)
		_, err = w.Write([]byte("after close"))
		assert.ErrorIs(t, err, ErrChannelClosed)
		_, err = e.OpenChannelReader(rref)
		assert.ErrorIs(t, err, ErrClosed)
	})
}

// TestLocalReadChunk: ReadChunk hands items of at least max/2 bytes over as
// they are (split at max), gathers smaller ones up to max, skips text
// items, and ends as Read does; the bytes come out in order.
func TestLocalReadChunk(t *testing.T) {
	le := lcStart(t, Options{})
	ctx := lcCtx(t)
	wref, rref := le.CreateChannel(0)
	w, err := le.OpenChannelWriter(wref)
	assert.NilError(t, err)
	r, err := le.OpenChannelReader(rref)
	assert.NilError(t, err)

	const max = 1000
	items := []int{1000, 2500, 499, 10, 200, 500, 1, 0, 999, 3}
	var want []byte
	go func() {
		for i, n := range items {
			p := bytes.Repeat([]byte{byte('a' + i)}, n)
			want = append(want, p...)
			if i == 3 {
				_ = w.WriteText(ctx, "skipped")
			}
			if _, err := w.WriteContext(ctx, p); err != nil {
				return
			}
		}
		_ = w.Close()
	}()
	var got []byte
	var sizes []int
	for {
		c, err := r.ReadChunk(ctx, max)
		if errors.Is(err, io.EOF) {
			break
		}
		assert.NilError(t, err)
		assert.Assert(t, len(c) > 0 && cap(c) <= max, "len %d cap %d", len(c), cap(c))
		sizes = append(sizes, len(c))
		got = append(got, c...)
	}
	assert.Assert(t, bytes.Equal(got, want), "%d bytes, want %d", len(got), len(want))
	// 1000 as is; 2500 split 1000, 1000, 500 (500 >= max/2: handed over);
	// 499 + 10 + 200 + 291 of 500 gathered; 209 + 1 + 790 of 999 gathered
	// (the rest of 500 is small); 209 + 3 gathered until the end.
	assert.DeepEqual(t, sizes, []int{1000, 1000, 1000, 500, 1000, 1000, 212})
	_, err = r.ReadChunk(ctx, max)
	assert.Equal(t, err, io.EOF, "the end stays")
}
