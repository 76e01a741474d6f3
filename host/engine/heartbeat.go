package engine

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// A sandbox host (docs/scale-out.md) that vanishes behind a partition
// sends nothing: no FIN, no RST, so the socket looks alive until TCP gives
// up minutes later, and every call for its sandboxes would wait. The engine
// therefore pings the connection of every worker that serves sandboxes
// over WebSocket (fleet functions <adapter>::host::<name>::<op>, or a
// single remote adapter's <adapter>::adapter::info) and cuts it when a pong
// does not come back in time: its registrations go at once and the router
// answers S301 naming the host or adapter. The ping is a WebSocket control frame, so
// the host's transport answers it without its handlers being involved.

// DefaultHostHeartbeat is how often a sandbox host's connection is pinged;
// a pong must come back within hostPongWindow heartbeats, so a silent host
// is cut within about three heartbeats (750 ms by default).
const DefaultHostHeartbeat = 250 * time.Millisecond

const hostPongWindow = 2

// hostHeartbeat is the engine's current setting (SetHostHeartbeat).
type hostHeartbeat struct{ every atomic.Int64 }

func (h *hostHeartbeat) get() time.Duration {
	if d := time.Duration(h.every.Load()); d > 0 {
		return d
	}
	return DefaultHostHeartbeat
}

// SetHostHeartbeat sets how often sandbox hosts' connections are pinged
// (config.yaml sandbox.host_heartbeat_ms); d <= 0 restores the default.
// It applies from each connection's next ping.
func (e *Engine) SetHostHeartbeat(d time.Duration) { e.heartbeat.every.Store(int64(d)) }

// watchLiveness starts the connection's heartbeat once.
func (c *wsConn) watchLiveness() {
	if !c.heartbeating.CompareAndSwap(false, true) {
		return
	}
	c.e.tasks.Go(c.heartbeatLoop)
}

func (c *wsConn) heartbeatLoop() {
	t := time.NewTimer(c.e.heartbeat.get())
	defer t.Stop()
	for {
		select {
		case <-c.quit:
			return
		case <-c.w.ctx.Done():
			return
		case <-t.C:
		}
		every := c.e.heartbeat.get()
		before := c.received.Load()
		ctx, cancel := context.WithTimeout(c.w.ctx, hostPongWindow*every)
		err := c.c.Ping(ctx)
		cancel()
		if err != nil {
			if c.w.ctx.Err() != nil {
				return
			}
			// A host that is sending is alive: its pong may wait behind a
			// large frame on its side. An engine write in progress holds
			// our ping back (a write that stalls is watchWriters' to cut),
			// and a read loop waiting for a large-frame lane reads no pong.
			if c.received.Load() != before || c.writeStart.Load() != 0 || c.laneWait.Load() {
				t.Reset(every)
				continue
			}
			// CloseNow ends the read loop at once, which tears the
			// worker down; a close handshake would wait on the dead link.
			c.e.guard().Unresponsive(c.w.id, hostPongWindow*every, err)
			_ = c.c.CloseNow()
			return
		}
		t.Reset(every)
	}
}

// countingHijacker hands websocket.Accept a connection that counts the
// bytes read from it into n.
type countingHijacker struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (h countingHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := h.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, http.ErrNotSupported
	}
	c, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	return countingConn{c, h.n}, brw, nil
}

// Unwrap lets http.ResponseController reach the server's writer.
func (h countingHijacker) Unwrap() http.ResponseWriter { return h.ResponseWriter }

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}
