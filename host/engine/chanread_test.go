package engine

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"
)

// chanFree reports whether the whole engine-wide channel budget less
// held is free.
func chanFree(te *testEngine, held int64) bool {
	if !te.inbound.chanBytes.TryAcquire(ChannelBytesTotal - held) {
		return false
	}
	te.inbound.chanBytes.Release(ChannelBytesTotal - held)
	return true
}

// TestChannelMessageSizes sends a channel writer's messages of every size
// around the read pieces (the first piece sized after the previous
// message, the empty read that finds a message's end, the joins, the
// large-frame lane past the first MiB), whole or in several frames, and
// checks each arrives as sent, keeps no uncharged spare room, and that
// every charge is released once read.
func TestChannelMessageSizes(t *testing.T) {
	te := startEngine(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	wref, rref := te.CreateChannel(4)
	r, err := te.OpenChannelReader(rref)
	assert.NilError(t, err)
	wc := dialChannel(t, te, wref)

	type msg struct {
		size   int
		frames []int // frame sizes of a fragmented message; nil: one frame
	}
	sizes := []msg{
		{size: 0}, {size: 1}, {size: 4 << 10}, {size: 4<<10 + 1}, {size: 64 << 10},
		{size: 64 << 10}, {size: 64<<10 - 1}, {size: 64 << 10}, {size: 64<<10 + 1}, {size: 64 << 10},
		{size: 200_000}, {size: 1 << 20}, {size: 1<<20 + 3}, {size: 5 << 20}, {size: 3},
		// Fragmented: the first frame exactly fills the first piece,
		// then the message goes on in another frame (the end probe waits
		// for its header).
		{size: 64 << 10}, {size: 96 << 10, frames: []int{64 << 10, 32 << 10}},
		{size: 64 << 10, frames: []int{32 << 10, 32 << 10}},
		{size: 64 << 10, frames: []int{64 << 10, 0}},
		{size: 4 << 10, frames: []int{1, 4<<10 - 1}},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	want := make([][]byte, len(sizes))
	for i, m := range sizes {
		want[i] = make([]byte, m.size)
		for j := range want[i] {
			want[i][j] = byte(rng.Uint32())
		}
	}
	sent := make(chan error, 1)
	go func() {
		for i, m := range sizes {
			if m.frames == nil {
				if err := wc.Write(ctx, websocket.MessageBinary, want[i]); err != nil {
					sent <- err
					return
				}
				continue
			}
			w, err := wc.Writer(ctx, websocket.MessageBinary)
			if err != nil {
				sent <- err
				return
			}
			rest := want[i]
			for _, n := range m.frames {
				if _, err := w.Write(rest[:n]); err != nil {
					sent <- err
					return
				}
				rest = rest[n:]
			}
			if err := w.Close(); err != nil {
				sent <- err
				return
			}
		}
		sent <- wc.Close(websocket.StatusNormalClosure, "done")
	}()
	for i, m := range sizes {
		it, err := r.ReadItem(ctx)
		assert.NilError(t, err, "message %d", i)
		assert.Assert(t, !it.Text)
		assert.Assert(t, bytes.Equal(it.Data, want[i]), "message %d: %d bytes, want %d", i, len(it.Data), m.size)
		assert.Equal(t, cap(it.Data), len(it.Data), "message %d keeps no uncharged room", i)
	}
	_, err = r.ReadItem(ctx)
	assert.ErrorContains(t, err, "EOF")
	assert.NilError(t, <-sent)
	pollUntil(t, "every charge released", func() bool { return chanFree(te, 0) })
}

// TestChannelPartialMessageCharge: a writer that begins a message and
// stops holds, until the slow-consumer time, the pieces charged so far: the
// first one as large as its previous message (channelPiece at least,
// channelHintMax at most), each next one twice as large.
func TestChannelPartialMessageCharge(t *testing.T) {
	// The partial frame: the client's 4 KiB write buffer may keep up to
	// 4 KiB of it, so between 15.9 KB and 20 KB reach the engine, which
	// is inside the same piece for every case.
	const partial = 20_000
	for _, c := range []struct{ prev, held int }{
		{0, 4<<10 + 8<<10 + 16<<10},
		{100, 4<<10 + 8<<10 + 16<<10},
		{10 << 10, 10<<10 + 20<<10},
		{64 << 10, 64 << 10},
		{1 << 20, 64 << 10},
	} {
		t.Run(fmt.Sprint(c.prev), func(t *testing.T) {
			te := startEngine(t, Options{})
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			wref, rref := te.CreateChannel(0)
			r, err := te.OpenChannelReader(rref)
			assert.NilError(t, err)
			wc := dialChannel(t, te, wref)
			if c.prev > 0 {
				assert.NilError(t, wc.Write(ctx, websocket.MessageBinary, make([]byte, c.prev)))
				it, err := r.ReadItem(ctx)
				assert.NilError(t, err)
				assert.Equal(t, len(it.Data), c.prev)
			}
			w, err := wc.Writer(ctx, websocket.MessageBinary)
			assert.NilError(t, err)
			_, err = w.Write(make([]byte, partial)) // a frame, not the message's last
			assert.NilError(t, err)
			held := int64(c.held)
			pollUntil(t, fmt.Sprintf("%d bytes charged", held), func() bool {
				return chanFree(te, held) && !chanFree(te, held-1)
			})
		})
	}
}
