package agentproto

import (
	"context"
	"errors"
	"sync"
)

// ErrWindowExceeded means a peer sent more data than its credit allowed.
var ErrWindowExceeded = errors.New("agentproto: peer exceeded its flow-control window")

// SendWindow is a sender's credit for one stream's data frames in one
// direction. It starts at InitialWindow; the peer's KindWindow frames add to
// it.
type SendWindow struct {
	mu     sync.Mutex
	avail  int
	err    error
	wakeup chan struct{} // closed and replaced whenever avail grows or err is set
}

// NewSendWindow returns a window holding InitialWindow bytes of credit.
func NewSendWindow() *SendWindow {
	return &SendWindow{avail: InitialWindow, wakeup: make(chan struct{})}
}

// Acquire waits until some credit is available and takes up to want bytes
// of it. It returns the amount taken, or the error the window was closed
// with, or ctx's error.
func (w *SendWindow) Acquire(ctx context.Context, want int) (int, error) {
	for {
		w.mu.Lock()
		if w.err != nil {
			err := w.err
			w.mu.Unlock()
			return 0, err
		}
		if w.avail > 0 {
			n := min(want, w.avail)
			w.avail -= n
			w.mu.Unlock()
			return n, nil
		}
		wake := w.wakeup
		w.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Grant adds credit.
func (w *SendWindow) Grant(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.avail += n
	close(w.wakeup)
	w.wakeup = make(chan struct{})
}

// Close makes pending and later Acquire calls fail with err.
func (w *SendWindow) Close(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
		close(w.wakeup)
		w.wakeup = make(chan struct{})
	}
}

// RecvWindow tracks what a peer may still send on one stream, so a peer
// that ignores flow control is caught instead of growing our buffers.
type RecvWindow struct {
	mu          sync.Mutex
	outstanding int
}

// Received accounts for n bytes that arrived.
func (r *RecvWindow) Received(n int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.outstanding+n > InitialWindow {
		return ErrWindowExceeded
	}
	r.outstanding += n
	return nil
}

// Consumed accounts for n bytes the application took; the caller then
// grants them back to the peer.
func (r *RecvWindow) Consumed(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outstanding -= n
}
