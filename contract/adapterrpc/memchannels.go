package adapterrpc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterjson"
	"github.com/iii-sandbox/iii/protocol"
)

// MemChannels are channels in memory, for a host without an engine: the Go
// Client serves them to its adapter, and sdktest's AdapterCaller hands them
// to adapterjson directly. A channel lives until its reader closes.
type MemChannels struct {
	mu    sync.Mutex
	chans map[string]*memChan
}

var _ adapterjson.Channels = (*MemChannels)(nil)

// ErrChannelGone is a write to, or a close of, a channel whose reader has
// closed.
var ErrChannelGone = errors.New("the channel's reader has gone")

// memBuffer is how many chunks or text messages a channel holds before its
// writer waits for the reader.
const memBuffer = 16

type memItem struct {
	data   []byte
	text   string
	isText bool
}

type memChan struct {
	id, key string
	items   chan memItem
	done    chan struct{} // closed when the reader closes
	endOnce sync.Once
	goneOne sync.Once
	mu      sync.Mutex
	abort   error
}

// NewMemChannels is an empty set of channels.
func NewMemChannels() *MemChannels { return &MemChannels{chans: map[string]*memChan{}} }

func randomHex() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

func (m *MemChannels) newChan(buffer int) (*memChan, protocol.StreamChannelRef, protocol.StreamChannelRef) {
	c := &memChan{id: randomHex(), key: randomHex(), items: make(chan memItem, buffer), done: make(chan struct{})}
	m.mu.Lock()
	m.chans[c.id] = c
	m.mu.Unlock()
	return c, protocol.StreamChannelRef{ChannelID: c.id, AccessKey: c.key, Direction: protocol.DirectionWrite},
		protocol.StreamChannelRef{ChannelID: c.id, AccessKey: c.key, Direction: protocol.DirectionRead}
}

// Create implements adapterjson.Channels.
func (m *MemChannels) Create(context.Context) (writer, reader protocol.StreamChannelRef, err error) {
	_, w, r := m.newChan(memBuffer)
	return w, r, nil
}

// Fill makes a closed channel holding data and returns its read end.
func (m *MemChannels) Fill(data []byte) protocol.StreamChannelRef {
	c, _, r := m.newChan((len(data)+contract.ChunkSize-1)/contract.ChunkSize + 1)
	for len(data) > 0 {
		n := min(len(data), contract.ChunkSize)
		c.items <- memItem{data: data[:n:n]}
		data = data[n:]
	}
	close(c.items)
	return r
}

func (m *MemChannels) lookup(ref protocol.StreamChannelRef, dir string) (*memChan, error) {
	m.mu.Lock()
	c := m.chans[ref.ChannelID]
	m.mu.Unlock()
	if c == nil || c.key != ref.AccessKey || ref.Direction != dir {
		return nil, fmt.Errorf("no %s end of a channel %q here", dir, ref.ChannelID)
	}
	return c, nil
}

// OpenReader implements adapterjson.Channels; the reader is also a
// ProgressReader.
func (m *MemChannels) OpenReader(ctx context.Context, ref protocol.StreamChannelRef) (io.ReadCloser, error) {
	c, err := m.lookup(ref, protocol.DirectionRead)
	if err != nil {
		return nil, err
	}
	return &memReader{ctx: ctx, c: c, m: m}, nil
}

// OpenWriter implements adapterjson.Channels.
func (m *MemChannels) OpenWriter(_ context.Context, ref protocol.StreamChannelRef) (adapterjson.ChannelWriter, error) {
	c, err := m.lookup(ref, protocol.DirectionWrite)
	if err != nil {
		return nil, err
	}
	return &memWriter{c: c}, nil
}

// Gone implements adapterjson.Channels.
func (*MemChannels) Gone(err error) bool { return errors.Is(err, ErrChannelGone) }

type memWriter struct{ c *memChan }

func (w *memWriter) put(ctx context.Context, it memItem) error {
	select {
	case <-w.c.done:
		return ErrChannelGone
	default:
	}
	select {
	case w.c.items <- it:
		return nil
	case <-w.c.done:
		return ErrChannelGone
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *memWriter) WriteContext(ctx context.Context, p []byte) (int, error) {
	// The caller reuses p once this returns; the reader gets it later.
	if err := w.put(ctx, memItem{data: append([]byte(nil), p...)}); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *memWriter) WriteText(ctx context.Context, s string) error {
	return w.put(ctx, memItem{text: s, isText: true})
}

func (w *memWriter) end(abort error) {
	w.c.endOnce.Do(func() {
		w.c.mu.Lock()
		w.c.abort = abort
		w.c.mu.Unlock()
		close(w.c.items)
	})
}

func (w *memWriter) Close() error {
	w.end(nil)
	select {
	case <-w.c.done:
		return ErrChannelGone
	default:
		return nil
	}
}

// Abort ends the stream as broken; the reader fails with S216, as a file
// that could not be read to its end.
func (w *memWriter) Abort() {
	w.end(contract.NewError(contract.S216, "the stream broke off before its end: the writer aborted it (the adapter's log says why)"))
}

// ProgressReader reads a channel's messages one at a time, text messages
// (progress events) as well as bytes.
type ProgressReader interface {
	// Next returns the next text message; bytes in between are skipped.
	// At the channel's end it returns io.EOF.
	Next(ctx context.Context) (string, error)
}

type memReader struct {
	ctx context.Context
	c   *memChan
	m   *MemChannels
	cur []byte
}

var (
	_ contract.ChunkReader = (*memReader)(nil)
	_ ProgressReader       = (*memReader)(nil)
)

// item returns the channel's next item, or io.EOF, the abort, or the
// context's error.
func (r *memReader) item(ctx context.Context) (memItem, error) {
	select {
	case it, ok := <-r.c.items:
		if ok {
			return it, nil
		}
		r.c.mu.Lock()
		err := r.c.abort
		r.c.mu.Unlock()
		if err != nil {
			return memItem{}, err
		}
		return memItem{}, io.EOF
	case <-ctx.Done():
		return memItem{}, ctx.Err()
	}
}

func (r *memReader) ReadChunk(max int) ([]byte, error) {
	for len(r.cur) == 0 {
		it, err := r.item(r.ctx)
		if err != nil {
			return nil, err
		}
		if !it.isText {
			r.cur = it.data
		}
	}
	n := min(max, len(r.cur))
	out := r.cur[:n:n]
	r.cur = r.cur[n:]
	return out, nil
}

func (r *memReader) Read(p []byte) (int, error) {
	b, err := r.ReadChunk(len(p))
	return copy(p, b), err
}

func (r *memReader) Next(ctx context.Context) (string, error) {
	for {
		it, err := r.item(ctx)
		if err != nil {
			return "", err
		}
		if it.isText {
			return it.text, nil
		}
	}
}

func (r *memReader) Close() error {
	r.c.goneOne.Do(func() {
		close(r.c.done)
		r.m.mu.Lock()
		delete(r.m.chans, r.c.id)
		r.m.mu.Unlock()
	})
	return nil
}

// drop forgets a channel whose reader may never have opened it.
func (m *MemChannels) drop(id string) {
	m.mu.Lock()
	delete(m.chans, id)
	m.mu.Unlock()
}
