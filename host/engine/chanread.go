package engine

import (
	"context"
	"errors"
	"io"

	"github.com/coder/websocket"
)

// channelPiece is the first piece in which a channel writer's message is
// read and charged to ChannelBytesTotal when the writer's previous message
// was no larger; each next one is twice as large, up to its first MiB;
// past it, pieces are largeChunk.
const channelPiece = 4 << 10

// channelHintMax caps the first piece sized after the writer's previous
// message: the SDKs' channel writers send pieces of this size
// (MaxChannelPrefill), which then arrive in one read, one allocation and
// no join.
const channelHintMax = MaxChannelPrefill

// readChannelMessage reads one message of a channel's writer. Every piece
// is charged to the engine's ChannelBytesTotal before it is read (so what
// all channels hold, partial messages included, stays under it); charge is
// what the message holds, to release once it is written out. The first
// piece is as large as the writer's previous message (prev, at most
// channelHintMax, at least channelPiece): a writer streaming 64 KiB pieces
// has each read in one piece, while a writer that starts a message and
// stops holds at most twice what it sent in this message or its previous
// one. As on the worker socket, past its first MiB a message waits for one
// of the large-frame lanes, and once it has begun the whole message must
// arrive within the slow-consumer time: a sender that starts a message and
// trickles it (or stops) is dropped rather than holding its charge.
func (e *Engine) readChannelMessage(c *channel, ws *websocket.Conn, r io.Reader, prev int) (data []byte, charge int64, err error) {
	ctx, cancel := context.WithTimeout(c.ctx, e.slowConsumer)
	defer cancel()
	cut := context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			e.log.Warn("channel writer is sending a message too slowly; dropping it", "channel_id", c.id)
			_ = ws.CloseNow()
		}
	})
	defer cut()
	var lane bool
	defer func() {
		e.inbound.release(lane)
		if err != nil {
			c.budget.Release(charge)
			charge = 0
		}
	}()
	var pieces [][]byte
	total := 0
	next := int64(max(channelPiece, min(prev, channelHintMax)))
	for {
		piece := next
		next = min(2*next, smallFrameBytes)
		if total >= smallFrameBytes {
			if !lane {
				if _, err = e.inbound.acquire(ctx); err != nil {
					return nil, charge, err
				}
				lane = true
			}
			piece = largeChunk
		}
		piece = min(piece, ChannelBytesTotal)
		if err = c.budget.Acquire(ctx, piece); err != nil {
			return nil, charge, err
		}
		charge += piece
		p := make([]byte, piece)
		n, rerr := io.ReadFull(r, p)
		charge -= piece - int64(n)
		c.budget.Release(piece - int64(n))
		if n > 0 {
			pieces = append(pieces, p[:n])
			total += n
		}
		if rerr == nil {
			// The piece is full; the message may end right here. An
			// empty read tells without taking (or charging) a byte: the
			// end of the message, or nothing yet, or a failure.
			rerr = endOfMessage(r)
			if rerr == nil {
				continue
			}
		}
		switch {
		case errors.Is(rerr, io.EOF), errors.Is(rerr, io.ErrUnexpectedEOF):
			if len(pieces) == 1 && len(pieces[0]) == cap(pieces[0]) {
				return pieces[0], charge, nil
			}
			// Joined at the exact size: the pieces' spare room is not
			// charged, so it must not be kept.
			data = make([]byte, 0, total)
			for _, p := range pieces {
				data = append(data, p...)
			}
			return data, charge, nil
		default:
			return nil, charge, rerr
		}
	}
}

// endOfMessage reads nothing from a message's reader: io.EOF at the end of
// the message, nil while more may follow (the frame's payload goes on, or
// the next frame of the message has begun), or why the read failed.
func endOfMessage(r io.Reader) error {
	_, err := r.Read(nil)
	return err
}

// drain takes what is left in a removed channel's buffer and releases its
// charges: nobody will read it.
func (c *channel) drain() {
	for {
		select {
		case it, ok := <-c.items:
			if !ok {
				return
			}
			c.budget.Release(it.charge)
		default:
			return
		}
	}
}

// MaxChannelsPerConnection caps the channels one connection holds (those
// it created or was handed with a reply, ChargeReplyChannels, and that are
// not finished), so that one caller cannot take every one of MaxChannels.
// At the cap, its unopened inline-delivered channels give way
// (evictInline) before anything is refused.
const MaxChannelsPerConnection = 256

// owned counts the channels owner created that are still alive.
func (t *channelTable) owned(owner string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byOwner[owner]
}
