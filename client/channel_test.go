package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// channelEnd is what the scripted engine saw on a channel socket.
type channelEnd struct {
	msgs   []ChannelMessage
	status websocket.StatusCode
}

// scriptChannels makes p serve channel "ch-1" with key "k": a write end
// that records what arrives, and a read end that plays out.
func scriptChannels(t *testing.T, p *peer, out []ChannelMessage) <-chan channelEnd {
	t.Helper()
	got := make(chan channelEnd, 1)
	p.channelHandler = func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ws/channels/ch-1" || r.URL.Query().Get("key") != "k" {
			http.NotFound(w, r)
			return
		}
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		conn.SetReadLimit(maxMessageSize)
		ctx := context.Background()
		switch r.URL.Query().Get("dir") {
		case "write":
			var end channelEnd
			for {
				typ, data, err := conn.Read(ctx)
				if err != nil {
					end.status = websocket.CloseStatus(err)
					break
				}
				end.msgs = append(end.msgs, ChannelMessage{Text: typ == websocket.MessageText, Data: data})
			}
			got <- end
		case "read":
			for _, m := range out {
				typ := websocket.MessageBinary
				if m.Text {
					typ = websocket.MessageText
				}
				if conn.Write(ctx, typ, m.Data) != nil {
					return
				}
			}
			_ = conn.Close(websocket.StatusNormalClosure, "")
		}
	}
	return got
}

func TestChannelWriter(t *testing.T) {
	p := newPeer(t)
	got := scriptChannels(t, p, nil)
	c, _ := connect(t, p, testOptions())

	w, err := c.OpenChannelWriter(context.Background(), protocol.StreamChannelRef{ChannelID: "ch-1", AccessKey: "k", Direction: "write"})
	assert.NilError(t, err)
	payload := bytes.Repeat([]byte("0123456789abcdef"), (150<<10)/16)
	n, err := w.Write(payload)
	assert.NilError(t, err)
	assert.Equal(t, n, len(payload))
	n, err = w.Write(nil)
	assert.NilError(t, err)
	assert.Equal(t, n, 0)
	assert.NilError(t, w.SendText(context.Background(), `{"done":true}`))
	assert.NilError(t, w.Close())
	assert.NilError(t, w.Close())

	var end channelEnd
	select {
	case end = <-got:
	case <-time.After(waitLimit):
		t.Fatal("the channel end saw no close")
	}
	assert.Equal(t, end.status, websocket.StatusNormalClosure)
	assert.Equal(t, len(end.msgs), 4)
	var sizes []int
	var joined []byte
	for _, m := range end.msgs[:3] {
		assert.Assert(t, !m.Text)
		sizes = append(sizes, len(m.Data))
		joined = append(joined, m.Data...)
	}
	assert.DeepEqual(t, sizes, []int{ChannelChunkSize, ChannelChunkSize, len(payload) - 2*ChannelChunkSize})
	assert.Assert(t, bytes.Equal(joined, payload))
	assert.DeepEqual(t, end.msgs[3], ChannelMessage{Text: true, Data: []byte(`{"done":true}`)})
}

func TestChannelReader(t *testing.T) {
	script := []ChannelMessage{
		{Data: bytes.Repeat([]byte{7}, 100<<10)},
		{Text: true, Data: []byte("hello")},
		{Data: []byte("tail")},
		{Text: true, Data: []byte("bye")},
	}
	ref := protocol.StreamChannelRef{ChannelID: "ch-1", AccessKey: "k", Direction: "read"}

	t.Run("stream", func(t *testing.T) {
		p := newPeer(t)
		scriptChannels(t, p, script)
		c, _ := connect(t, p, testOptions())
		var texts []string
		r, err := c.OpenChannelReader(context.Background(), ref, WithTextHandler(func(s string) { texts = append(texts, s) }))
		assert.NilError(t, err)
		defer r.Close()
		var data []byte
		waitfor.Func(t, waitLimit, "the channel's bytes to end", func() { data, err = io.ReadAll(r) })
		assert.NilError(t, err)
		assert.Assert(t, bytes.Equal(data, append(bytes.Repeat([]byte{7}, 100<<10), "tail"...)))
		assert.DeepEqual(t, texts, []string{"hello", "bye"})
		n, err := r.Read(make([]byte, 1))
		assert.Equal(t, n, 0)
		assert.Equal(t, err, io.EOF)
	})

	t.Run("messages", func(t *testing.T) {
		p := newPeer(t)
		scriptChannels(t, p, script)
		c, _ := connect(t, p, testOptions())
		r, err := c.OpenChannelReader(context.Background(), ref)
		assert.NilError(t, err)
		defer r.Close()
		// Read part of the first message, then switch to whole messages.
		head := make([]byte, 10)
		waitfor.Func(t, waitLimit, "the first 10 bytes", func() { _, err = io.ReadFull(r, head) })
		assert.NilError(t, err)
		var got []ChannelMessage
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		for {
			m, err := r.ReadMessage(ctx)
			if errors.Is(err, io.EOF) {
				break
			}
			assert.NilError(t, err)
			got = append(got, m)
		}
		assert.Equal(t, len(got), 4)
		assert.Equal(t, len(got[0].Data), 100<<10-10)
		assert.DeepEqual(t, got[1:], script[1:])
	})
}

func TestChannelErrors(t *testing.T) {
	p := newPeer(t)
	scriptChannels(t, p, nil)
	c, _ := connect(t, p, testOptions())
	ctx := context.Background()

	_, err := c.OpenChannelWriter(ctx, protocol.StreamChannelRef{ChannelID: "ch-1", AccessKey: "wrong", Direction: "write"})
	assert.Equal(t, CodeOf(err), CodeChannelUnavailable)
	assert.Equal(t, err.Error(), "channel ch-1 is unknown to the engine (expired, removed, or a wrong key)")
	_, err = c.OpenChannelReader(ctx, protocol.StreamChannelRef{ChannelID: "ch-1", AccessKey: "k", Direction: "write"})
	assert.Equal(t, CodeOf(err), CodeChannelDirection)
	_, err = c.OpenChannelWriter(ctx, protocol.StreamChannelRef{ChannelID: "ch-1", AccessKey: "k", Direction: "read"})
	assert.Equal(t, CodeOf(err), CodeChannelDirection)
	_, err = c.OpenChannelWriter(ctx, protocol.StreamChannelRef{AccessKey: "k", Direction: "write"})
	assert.Equal(t, CodeOf(err), CodeInvalidArgument)

	u := c.ChannelURL(protocol.StreamChannelRef{ChannelID: "a b", AccessKey: "k&=", Direction: "read"})
	assert.Equal(t, u, strings.Replace(p.url(), "ws://", "ws://", 1)+"/ws/channels/a%20b?dir=read&key=k%26%3D")
}

func TestCreateChannel(t *testing.T) {
	p := newPeer(t)
	o := testOptions()
	o.Namespace = "orders"
	c, pc := connect(t, p, o)

	type out struct {
		w, r protocol.StreamChannelRef
		err  error
	}
	done := make(chan out, 1)
	go func() {
		w, r, err := c.CreateChannel(context.Background(), 8)
		done <- out{w, r, err}
	}()
	inv := expect[*protocol.InvokeFunction](t, pc)
	assert.Equal(t, inv.FunctionID, "engine::channels::create")
	assert.Assert(t, inv.Namespace == nil)
	assert.Equal(t, string(inv.Data), `{"buffer_size":8}`)
	w := protocol.StreamChannelRef{ChannelID: "c", AccessKey: "k", Direction: "write"}
	r := protocol.StreamChannelRef{ChannelID: "c", AccessKey: "k", Direction: "read"}
	res, err := json.Marshal(map[string]any{"writer": w, "reader": r})
	assert.NilError(t, err)
	pc.send(t, &protocol.InvocationResult{InvocationID: inv.InvocationID, Result: res})
	got := waitfor.Recv(t, done, waitLimit, "the channel open to return")
	assert.NilError(t, got.err)
	assert.Equal(t, got.w, w)
	assert.Equal(t, got.r, r)

	go func() {
		_, _, err := c.CreateChannel(context.Background(), 0)
		done <- out{err: err}
	}()
	inv = expect[*protocol.InvokeFunction](t, pc)
	assert.Equal(t, string(inv.Data), `{}`)
	pc.send(t, &protocol.InvocationResult{InvocationID: inv.InvocationID, Result: json.RawMessage(`{"writer":1}`)})
	assert.Equal(t, CodeOf(waitfor.Recv(t, done, waitLimit, "the channel open to fail").err), CodeHandshakeFailed)
}
