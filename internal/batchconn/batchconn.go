// Package batchconn is a net.Conn whose writes are gathered and put on the
// socket by a flushing goroutine, several at once: what many goroutines
// write meanwhile goes out in one write system call instead of one each.
//
// It sits under a WebSocket connection (github.com/coder/websocket), which
// writes and flushes every message under its own lock, the write system
// call included: however many goroutines send at once, each message cost a
// system call of its own (a profile of the http worker's path showed 28 %
// of its time in them). Under this Conn the library's flush is a copy; the
// flusher writes everything gathered while its previous write was in the
// kernel. Order is kept: bytes go out as they were written, across
// writers.
//
// Memory stays bounded: at most Limit bytes wait per connection; a writer
// that would pass it waits for the flusher (the socket's back-pressure
// reaches writers as before), and a single write larger than Limit is
// written by its own goroutine once everything before it is out. A write
// failure is sticky: later writes return it. Close writes what is
// gathered (for at most CloseFlushTimeout), then closes the socket.
package batchconn

import (
	"errors"
	"net"
	"sync"
	"time"
)

// DefaultLimit is the default bound of the bytes waiting per connection.
const DefaultLimit = 32 << 10

// CloseFlushTimeout bounds how long Close waits for gathered bytes to go
// out: a peer that stopped reading does not hold Close up.
const CloseFlushTimeout = time.Second

// Conn gathers writes; see the package comment.
type Conn struct {
	net.Conn
	limit int

	mu      sync.Mutex
	cond    *sync.Cond // broadcast when bytes went out, or on failure
	buf     []byte     // gathered, not yet handed to the socket
	spare   []byte     // the flusher's previous buffer, reused
	writing bool       // a goroutine is writing to the socket
	err     error      // sticky: the first write failure, or net.ErrClosed
}

// New wraps c; limit <= 0 means DefaultLimit.
func New(c net.Conn, limit int) *Conn {
	if limit <= 0 {
		limit = DefaultLimit
	}
	bc := &Conn{Conn: c, limit: limit}
	bc.cond = sync.NewCond(&bc.mu)
	return bc
}

// Write gathers p to be written by the flusher, and returns once it is
// gathered (not yet written). It waits while Limit bytes are already
// waiting; p larger than Limit is written directly, after what came
// before it.
func (c *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(p) > c.limit {
		return c.writeDirect(p)
	}
	for c.err == nil && len(c.buf) > 0 && len(c.buf)+len(p) > c.limit {
		c.cond.Wait()
	}
	if c.err != nil {
		return 0, c.err
	}
	c.buf = append(c.buf, p...)
	if !c.writing {
		c.writing = true
		go c.flush()
	}
	return len(p), nil
}

// writeDirect writes a large p on the caller's goroutine once nothing is
// gathered or being written, so it is not copied and order is kept. c.mu
// is held, and released during the write.
func (c *Conn) writeDirect(p []byte) (int, error) {
	for c.err == nil && (c.writing || len(c.buf) > 0) {
		c.cond.Wait()
	}
	if c.err != nil {
		return 0, c.err
	}
	c.writing = true
	c.mu.Unlock()
	n, err := c.Conn.Write(p)
	c.mu.Lock()
	c.writing = false
	if err != nil && c.err == nil {
		c.err = err
	}
	c.cond.Broadcast()
	if len(c.buf) > 0 && c.err == nil {
		// Gathered while this write ran: hand it to a flusher.
		c.writing = true
		go c.flush()
	}
	return n, err
}

// flush writes what is gathered until nothing is; one runs at a time
// (c.writing), started by the write that found none running.
func (c *Conn) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.buf) > 0 && c.err == nil {
		out := c.buf
		c.buf = c.spare[:0]
		c.mu.Unlock()
		_, err := c.Conn.Write(out)
		c.mu.Lock()
		c.spare = out[:0]
		if err != nil && c.err == nil {
			c.err = err
		}
		c.cond.Broadcast()
	}
	c.writing = false
	c.cond.Broadcast()
}

// Flush waits until every gathered byte is written, or the connection
// failed.
func (c *Conn) Flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.err == nil && (c.writing || len(c.buf) > 0) {
		c.cond.Wait()
	}
	return c.err
}

// Close writes what is gathered, waiting at most CloseFlushTimeout, then
// closes the socket. Writers waiting for room get net.ErrClosed.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.err == nil && (c.writing || len(c.buf) > 0) {
		// A write stuck on a peer that does not read ends at the deadline.
		_ = c.Conn.SetWriteDeadline(time.Now().Add(CloseFlushTimeout))
		for c.err == nil && (c.writing || len(c.buf) > 0) {
			c.cond.Wait()
		}
	}
	if c.err == nil || !errors.Is(c.err, net.ErrClosed) {
		c.err = net.ErrClosed
	}
	c.buf, c.spare = nil, nil
	c.cond.Broadcast()
	c.mu.Unlock()
	return c.Conn.Close()
}
