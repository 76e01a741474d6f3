package engine

import (
	"context"
)

// What waits to be written to the engine's connections is capped per
// connection (limits.queued_bytes_per_connection) and engine-wide
// (QueuedBytesTotal): a caller that stops reading what it asked for (large
// answers, say) on many connections must not add up past the memory
// bound. When the engine-wide room runs out, the connection holding the
// most of it (at least queuedHogFloor) is dropped: it is not reading, and
// a connection that reads does not wait for it.

const (
	// QueuedBytesTotal caps what waits to be written to all connections.
	QueuedBytesTotal = 192 << 20
	// queuedHogFloor: a connection holding less than this of
	// QueuedBytesTotal is never dropped to make room.
	queuedHogFloor = 1 << 20
)

// reserveEngine takes n (already reserved on the connection) of the
// engine-wide room; false means the frame is not queued (its per-
// connection reservation is given back here) and, past the slow-consumer
// time, the connection is dropped.
func (c *wsConn) reserveEngine(own int64) bool {
	all := c.e.inbound.outAll
	n := min(own, QueuedBytesTotal)
	if all.TryAcquire(n) {
		c.qBytes.Add(n)
		return true
	}
	if hog := c.e.outboundHog(); hog != nil {
		c.e.log.Warn("the engine's outbound queues are full; dropping the connection holding most of them (it is not reading)",
			"worker_id", hog.w.id, "queued_bytes", hog.qBytes.Load())
		_ = hog.c.CloseNow()
		if hog == c {
			c.outBytes.Release(own)
			return false
		}
	}
	ctx, cancel := context.WithTimeout(c.w.ctx, c.e.slowConsumer)
	defer cancel()
	go func() {
		select {
		case <-c.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := all.Acquire(ctx, n); err != nil {
		c.outBytes.Release(own)
		if c.w.ctx.Err() == nil && !c.closingQuit() {
			c.e.log.Warn("worker is not reading (the engine's outbound queues are full); dropping its connection", "worker_id", c.w.id)
			_ = c.c.CloseNow()
		}
		return false
	}
	c.qBytes.Add(n)
	return true
}

func (c *wsConn) releaseEngine(n int64) {
	n = min(n, QueuedBytesTotal)
	c.qBytes.Add(-n)
	c.e.inbound.outAll.Release(n)
}

// outboundHog is the connection holding the most of QueuedBytesTotal, if
// it holds at least queuedHogFloor.
func (e *Engine) outboundHog() *wsConn {
	var hog *wsConn
	most := int64(queuedHogFloor - 1)
	for _, w := range e.snapshotWorkers() {
		if w.conn == nil {
			continue
		}
		if q := w.conn.qBytes.Load(); q > most {
			most, hog = q, w.conn
		}
	}
	return hog
}

// afterQueued: a frame queued once the writer has ended would never be
// written nor released; the writer drains what it finds when it ends, and
// this drains what came after.
func (c *wsConn) afterQueued() {
	select {
	case <-c.writerDone:
		c.dropQueued()
	default:
	}
}

// dropQueued releases the frames left in the queue of a connection whose
// writer has ended.
func (c *wsConn) dropQueued() {
	for {
		select {
		case f := <-c.out:
			c.queued.Add(-1)
			c.unreserve(f)
		default:
			return
		}
	}
}
