package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/coder/websocket"

	"github.com/iii-sandbox/iii/protocol"
)

// In-process endpoints of streaming channels. The plugin host feeds an
// adapter's fs::write from the read end of a caller's channel and streams
// fs::read into the write end of a channel it created; the other end is
// usually a WebSocket peer (an SDK worker), so these endpoints follow the
// same rules as the WebSocket ones in channels.go: each end can be taken
// once, a finished writer ends the stream after the buffered items, a
// reader that leaves early releases the writer, and the channel is
// forgotten once both ends are done.

// Errors of the in-process channel endpoints.
var (
	// ErrChannelNotFound: no channel has that id, or the access key is
	// wrong (the two are not told apart, as on the WebSocket endpoint).
	ErrChannelNotFound = errors.New("channel not found")
	// ErrChannelEndTaken: the end the ref names was already taken, by a
	// socket or in-process.
	ErrChannelEndTaken = errors.New("channel end already taken")
	// ErrChannelDirection: the ref is the other end of the channel.
	ErrChannelDirection = errors.New("channel ref has the wrong direction for this end")
	// ErrChannelClosed: the channel went away before the stream completed
	// (the other end aborted or left, the TTL sweep removed it, or the
	// engine stopped).
	ErrChannelClosed = errors.New("channel closed before the stream completed")
	// ErrChannelEndClosed: the endpoint itself was closed.
	ErrChannelEndClosed = errors.New("channel endpoint is closed")
)

// openChannel finds the channel ref names and takes its end dir.
func (e *Engine) openChannel(ref protocol.StreamChannelRef, dir string) (*channel, error) {
	if e.closed.Load() {
		return nil, ErrClosed
	}
	if ref.Direction != dir {
		return nil, ErrChannelDirection
	}
	c, err := e.channels.find(e, ref.ChannelID, ref.AccessKey, dir)
	if err != nil {
		return nil, fmt.Errorf("channel %s: %w", ref.ChannelID, err)
	}
	if c == nil {
		return nil, ErrChannelNotFound
	}
	taken := &c.readerTaken
	if dir == protocol.DirectionWrite {
		taken = &c.writerTaken
	}
	if !taken.CompareAndSwap(false, true) {
		return nil, ErrChannelEndTaken
	}
	c.open(e.ctx)
	return c, nil
}

// ChannelWriter is an in-process writer end. Each Write is one binary item
// and each WriteText one text item, delivered to the reader in order.
// Close ends the stream normally; Abort ends it as broken. Writes may come
// from several goroutines; they are serialised.
type ChannelWriter struct {
	e *Engine
	c *channel

	mu        sync.Mutex // held while an item is handed over
	closing   chan struct{}
	closeOnce sync.Once
	ended     bool // under mu: items closed or channel aborted
}

var _ io.WriteCloser = (*ChannelWriter)(nil)

// OpenChannelWriter takes the write end of a channel created with
// CreateChannel or engine::channels::create. ref must be the writer ref.
func (e *Engine) OpenChannelWriter(ref protocol.StreamChannelRef) (*ChannelWriter, error) {
	c, err := e.openChannel(ref, protocol.DirectionWrite)
	if err != nil {
		return nil, err
	}
	return &ChannelWriter{e: e, c: c, closing: make(chan struct{})}, nil
}

// Write sends p as one binary item. It blocks while the channel's buffer is
// full; use WriteContext to bound that.
func (w *ChannelWriter) Write(p []byte) (int, error) {
	return w.WriteContext(context.Background(), p)
}

// WriteContext sends p as one binary item, waiting at most until ctx ends.
// An empty p sends nothing.
func (w *ChannelWriter) WriteContext(ctx context.Context, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, w.check()
	}
	// The reader keeps the item after Write returns; p is the caller's.
	if err := w.send(ctx, chanItem{typ: websocket.MessageBinary, data: append([]byte(nil), p...)}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteText sends s as one text item.
func (w *ChannelWriter) WriteText(ctx context.Context, s string) error {
	return w.send(ctx, chanItem{typ: websocket.MessageText, data: []byte(s)})
}

func (w *ChannelWriter) check() error {
	select {
	case <-w.closing:
		return ErrChannelEndClosed
	case <-w.c.ctx.Done():
		return ErrChannelClosed
	default:
		return nil
	}
}

func (w *ChannelWriter) send(ctx context.Context, it chanItem) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return ErrChannelEndClosed
	}
	if err := w.check(); err != nil {
		return err
	}
	it.cost = itemCost(it.data)
	if !w.c.room.TryAcquire(it.cost) {
		if err := w.waitRoom(ctx, it.cost); err != nil {
			return err
		}
	}
	select {
	case w.c.items <- it:
		return nil
	case <-w.c.ctx.Done():
		w.c.room.Release(it.cost)
		return ErrChannelClosed
	case <-w.closing:
		w.c.room.Release(it.cost)
		return ErrChannelEndClosed
	case <-ctx.Done():
		w.c.room.Release(it.cost)
		return ctx.Err()
	}
}

// waitRoom waits until the channel's buffer has room for n bytes, the
// channel or this end closes, or ctx ends.
func (w *ChannelWriter) waitRoom(ctx context.Context, n int64) error {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(w.c.ctx, cancel)
	defer stop()
	go func() {
		select {
		case <-w.closing:
			cancel()
		case <-actx.Done():
		}
	}()
	if err := w.c.room.Acquire(actx, n); err != nil {
		switch {
		case w.c.ctx.Err() != nil:
			return ErrChannelClosed
		case ctx.Err() != nil:
			return ctx.Err()
		default:
			return ErrChannelEndClosed
		}
	}
	return nil
}

// Close ends the stream: the reader gets every item sent so far, then the
// end of the stream. A Write blocked at that moment fails. Close is
// idempotent and returns ErrChannelClosed when the channel had already
// gone away (the items may not all have been read).
func (w *ChannelWriter) Close() error {
	return w.finish(false)
}

// Abort ends the stream as broken: the reader gets an error instead of the
// end of the stream (a WebSocket reader sees the socket close with
// "going away"), so a truncated stream is never mistaken for a complete
// one. It is a no-op after Close.
func (w *ChannelWriter) Abort() {
	_ = w.finish(true)
}

func (w *ChannelWriter) finish(abort bool) error {
	var err error
	w.closeOnce.Do(func() {
		close(w.closing) // releases a Write blocked on a full buffer
		w.mu.Lock()
		w.ended = true
		w.mu.Unlock()
		if w.c.ctx.Err() != nil {
			err = ErrChannelClosed
		}
		if abort {
			w.c.cancel()
		} else {
			w.c.endWriting()
		}
		w.c.writerDone.Store(true)
		w.e.finishChannel(w.c)
	})
	return err
}

// ChannelItem is one item read from a channel as it was sent.
type ChannelItem struct {
	Text bool // a text item; otherwise binary
	Data []byte
}

// ChannelReader is an in-process reader end. Read returns the binary
// items' bytes as one stream and skips text items; ReadItem returns every
// item as sent. Reads are serialised.
type ChannelReader struct {
	e *Engine
	c *channel

	mu   sync.Mutex // serialises reads
	rest []byte     // unread part of the current binary item
	err  error      // sticky end: io.EOF or why the stream broke

	closing   chan struct{}
	closeOnce sync.Once
	doneOnce  sync.Once
}

var _ io.ReadCloser = (*ChannelReader)(nil)

// OpenChannelReader takes the read end of a channel. ref must be the
// reader ref.
func (e *Engine) OpenChannelReader(ref protocol.StreamChannelRef) (*ChannelReader, error) {
	c, err := e.openChannel(ref, protocol.DirectionRead)
	if err != nil {
		return nil, err
	}
	return &ChannelReader{e: e, c: c, closing: make(chan struct{})}, nil
}

// Read reads the binary items' bytes, skipping text items. It returns
// io.EOF once the writer has closed and every item was read, and
// ErrChannelClosed when the stream broke off. It blocks until an item
// arrives; use ReadContext to bound that.
func (r *ChannelReader) Read(p []byte) (int, error) {
	return r.ReadContext(context.Background(), p)
}

// ReadContext is Read, waiting at most until ctx ends.
func (r *ChannelReader) ReadContext(ctx context.Context, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.rest) == 0 {
		it, err := r.next(ctx)
		if err != nil {
			return 0, err
		}
		if it.typ == websocket.MessageBinary {
			r.rest = it.data
		}
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}

// ReadChunk returns the next binary bytes of the stream, at least one and
// at most max, as a slice the caller keeps: an item of max/2 bytes or more
// is handed over as it is (its first max bytes if larger), smaller ones are
// gathered into one slice of up to max bytes, waiting for the next items as
// Read would. Text items are skipped. At the end of the stream it returns no
// bytes and what Read returns; bytes already gathered when the stream ends
// or ctx ends are returned first, the end with the next call.
func (r *ChannelReader) ReadChunk(ctx context.Context, max int) ([]byte, error) {
	if max <= 0 {
		return nil, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []byte
	for len(out) < max {
		if len(r.rest) == 0 {
			it, err := r.next(ctx)
			if err != nil {
				if len(out) > 0 {
					return out, nil
				}
				return nil, err
			}
			if it.typ != websocket.MessageBinary {
				continue
			}
			r.rest = it.data
			continue
		}
		if out == nil && len(r.rest) >= max/2 {
			// The item is the reader's alone once taken off the
			// channel: hand it over. The cap keeps the caller's appends
			// off what is left of it.
			n := min(len(r.rest), max)
			out, r.rest = r.rest[:n:n], r.rest[n:]
			return out, nil
		}
		if out == nil {
			out = make([]byte, 0, max)
		}
		n := min(len(r.rest), max-len(out))
		out = append(out, r.rest[:n]...)
		r.rest = r.rest[n:]
	}
	return out, nil
}

// ReadItem returns the next item as sent, text or binary. What a previous
// Read left of a binary item comes first, as a binary item.
func (r *ChannelReader) ReadItem(ctx context.Context) (ChannelItem, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.rest) > 0 {
		data := r.rest
		r.rest = nil
		return ChannelItem{Data: data}, nil
	}
	it, err := r.next(ctx)
	if err != nil {
		return ChannelItem{}, err
	}
	return ChannelItem{Text: it.typ == websocket.MessageText, Data: it.data}, nil
}

// next takes the next item off the channel; r.mu is held.
func (r *ChannelReader) next(ctx context.Context) (chanItem, error) {
	if r.err != nil {
		return chanItem{}, r.err
	}
	// A removed channel wins over buffered items: its stream is broken.
	if r.c.ctx.Err() != nil {
		return chanItem{}, r.fail(ErrChannelClosed)
	}
	select {
	case it, ok := <-r.c.items:
		if !ok {
			return chanItem{}, r.fail(io.EOF)
		}
		r.c.room.Release(it.cost)
		// A socket writer's item holds its share of the engine-wide
		// ChannelBytesTotal until it is taken, as channelReader releases
		// it for a socket reader; kept, every fs::write fed from a socket
		// would shrink the budget for good until all channels stall.
		r.c.budget.Release(it.charge)
		return it, nil
	case <-r.c.ctx.Done():
		return chanItem{}, r.fail(ErrChannelClosed)
	case <-r.closing:
		return chanItem{}, ErrChannelEndClosed
	case <-ctx.Done():
		return chanItem{}, ctx.Err()
	}
}

// fail records the end of the stream and marks the reader done, so the
// channel is forgotten once the writer is done too.
func (r *ChannelReader) fail(err error) error {
	r.err = err
	r.done()
	return err
}

func (r *ChannelReader) done() {
	r.doneOnce.Do(func() {
		r.c.readerDone.Store(true)
		r.e.finishChannel(r.c)
	})
}

// Close gives the read end up. Before the end of the stream it releases
// the writer, whose writes then fail (a WebSocket writer sees its socket
// close with "going away"). A Read blocked at that moment fails. Close is
// idempotent.
func (r *ChannelReader) Close() error {
	r.closeOnce.Do(func() {
		close(r.closing)
		r.mu.Lock()
		ended := r.err != nil
		if !ended {
			r.err = ErrChannelEndClosed
		}
		r.mu.Unlock()
		if !ended {
			// Nobody will read the rest.
			r.c.cancel()
		}
		r.done()
	})
	return nil
}
