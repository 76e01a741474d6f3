package engine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sync/semaphore"

	"github.com/iii-sandbox/iii/internal/batchconn"
	"github.com/iii-sandbox/iii/protocol"
)

const (
	statusGoingAway       = websocket.StatusGoingAway
	statusPolicyViolation = websocket.StatusPolicyViolation
)

// wsConn is the socket side of a worker: one goroutine reads (the HTTP
// handler's), one writes from a bounded queue.
type wsConn struct {
	e     *Engine
	w     *worker
	c     *websocket.Conn
	token string // reattach token, proven by a reconnecting worker

	out  chan []byte
	quit chan struct{} // closed by shutdown: flush, close, stop writing

	quitOnce    sync.Once
	closeStatus websocket.StatusCode
	closeReason string
	writerDone  chan struct{}

	// Frames are written directly by the sending goroutine when nothing is
	// queued and no write is in progress (the common case: one hop fewer
	// per frame); otherwise they queue for the writer goroutine. wmu is held
	// for every socket write so the two paths never reorder.
	wmu        sync.Mutex
	queued     atomic.Int64 // frames in out, not yet written
	writeStart atomic.Int64 // UnixNano when the current write began; 0 = idle

	// inPlace counts the in-process handlers running on this connection's
	// read loop goroutines (see runInPlace); handOffs counts the times one
	// ran long enough for a new read loop to take over.
	inPlace  atomic.Int32
	handOffs atomic.Int64

	// limits are the listener's; regs counts the connection's
	// registrations against them; outBytes holds the room left in the
	// outbound queue.
	limits       Limits
	regs         atomic.Int64
	regsExceeded atomic.Bool
	outBytes     *semaphore.Weighted
	listener     *listenerState
	// calls and regBytes are what the connection's unanswered calls and
	// its registrations hold (budget.go).
	calls    callBudget
	regBytes regBudget
	// qBytes is this connection's share of the engine-wide
	// QueuedBytesTotal (outbound.go).
	qBytes atomic.Int64

	// heartbeating is set once the connection serves fleet functions
	// (heartbeat.go).
	heartbeating atomic.Bool
	// received counts the bytes read from the socket: proof of life for
	// the heartbeat while a large frame keeps a pong from arriving.
	received *atomic.Int64
	laneWait atomic.Bool // the read loop waits for a large-frame lane
}

// batchingHijacker puts a worker socket's writes through a batchconn.Conn:
// the WebSocket library writes every frame with a system call of its own,
// under its lock; with many goroutines sending to one worker (results,
// invocations, acks), the frames written while one write is in the kernel
// then go out together in the next. What waits is bounded per connection
// (batchconn.DefaultLimit, 32 KiB); a writer past it waits for the socket,
// and the writeStart watchdog sees that wait as a stuck write.
type batchingHijacker struct{ countingHijacker }

func (h batchingHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := h.countingHijacker.Hijack()
	if err != nil {
		return nil, nil, err
	}
	// The library writes through brw.Writer, which the server made over
	// the raw socket: give it one over the batching Conn instead.
	if err := brw.Writer.Flush(); err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	bc := batchconn.New(c, 0)
	return bc, bufio.NewReadWriter(brw.Reader, bufio.NewWriter(bc)), nil
}

func (e *Engine) serveWorker(rw http.ResponseWriter, r *http.Request, ls *listenerState) {
	policy := &ls.policy
	if !ls.admitConnection(rw) {
		return
	}
	if !e.tasks.Add() {
		ls.release()
		http.Error(rw, "engine stopping", http.StatusServiceUnavailable)
		return
	}

	received := new(atomic.Int64)
	c, err := websocket.Accept(batchingHijacker{countingHijacker{rw, received}}, r, nil)
	if err != nil {
		e.log.Debug("worker upgrade failed", "remote", r.RemoteAddr, "error", err)
		ls.release()
		e.tasks.Done()
		return
	}
	c.SetReadLimit(ls.limits.FrameBytes)

	w := newWorker(e, newID())
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		w.ip = host
	}
	p, errb := e.authenticate(r.Context(), r, policy, w.ip)
	if errb != nil {
		// As iii does: one error frame naming the code, then close.
		e.log.Warn("worker connection refused", "remote", r.RemoteAddr, "listener", policy.Name, "code", errb.Code, "error", errb.Message)
		if b, err := protocol.Encode(&protocol.ErrorFrame{Error: *errb}); err == nil {
			_ = c.Write(r.Context(), websocket.MessageText, b)
		}
		_ = c.Close(statusPolicyViolation, errb.Code)
		w.cancel()
		ls.release()
		e.tasks.Done()
		return
	}
	w.principal = p
	conn := &wsConn{
		e:          e,
		w:          w,
		c:          c,
		token:      newID(),
		out:        make(chan []byte, outQueueSize),
		quit:       make(chan struct{}),
		writerDone: make(chan struct{}),
		limits:     ls.limits,
		outBytes:   semaphore.NewWeighted(ls.limits.QueuedBytesPerConnection),
		listener:   ls,
		received:   received,
	}
	w.conn = conn
	e.addWorker(w)
	go conn.writeLoop()

	if b, err := protocol.Encode(&protocol.WorkerRegistered{WorkerID: w.id, ReattachToken: conn.token}); err == nil {
		conn.send(b)
	}
	w.startGrace(e.opts.NamespaceGrace)
	e.log.Debug("worker connected", "worker_id", w.id, "remote", r.RemoteAddr)

	if e.closed.Load() {
		// Close may have snapshotted the worker table before we joined it.
		conn.shutdown(statusGoingAway, "engine stopping")
	}
	conn.serve()
}

// serve reads the connection until it ends, then tears the worker down and
// ends the engine task serveWorker took for it. When the read loop hands
// its reading over to a new goroutine (to run an in-process handler where
// it stands), that goroutine serves on, and inherits the task.
func (c *wsConn) serve() {
	if c.readLoop() {
		return
	}
	c.w.teardown()
	c.releaseRegistrations()
	c.shutdown(websocket.StatusNormalClosure, "")
	<-c.writerDone
	c.listener.release()
	c.e.tasks.Done()
}

// readBufKeep is the largest read buffer kept between frames; one large
// frame should not pin its memory for the life of the connection (nor
// every connection's one frame the engine's: they are many).
const readBufKeep = freeFrameBytes

// readLoop reads and handles frames until the connection ends (false), or
// until a frame's in-process handler ran long on this goroutine and another
// readLoop reads on (true; see runInPlace).
func (c *wsConn) readLoop() (handedOff bool) {
	var buf []byte
	for {
		typ, r, err := c.c.Reader(context.Background())
		var held heldLanes
		if err == nil {
			if cap(buf) > readBufKeep {
				buf = nil
			}
			buf, held, err = c.readFrame(buf[:0], r)
		}
		if err != nil {
			c.e.inbound.releaseHeld(held)
			if s := websocket.CloseStatus(err); s == -1 && !errors.Is(err, net.ErrClosed) {
				c.e.log.Debug("worker read ended", "worker_id", c.w.id, "error", err)
			}
			return false
		}
		// data is reused for the next frame: handlers copy what they keep.
		data := buf
		if typ == websocket.MessageBinary && isTelemetry(data) {
			// OTLP/metrics/log frames that SDKs push; this engine has no
			// telemetry ingest.
			continue
		}
		if len(bytes.TrimSpace(data)) == 0 {
			continue
		}
		handedOff := c.handleFrame(data, c.runInPlace)
		c.e.inbound.releaseHeld(held)
		if handedOff {
			return true
		}
	}
}

// readFrame reads one frame into buf. Its first freeFrameBytes are read
// at once. Past them the frame waits for one of the engine's medium slots,
// and past smallFrameBytes for one of its large-frame lanes, before the
// rest is read; once it has either, that part must arrive within the
// slow-consumer time (a sender trickling a frame would otherwise hold the
// slot). held reports the slot and lane, to release once the frame is
// handled. So what partial frames hold is bounded engine-wide, however
// many connections send them.
func (c *wsConn) readFrame(buf []byte, r io.Reader) (_ []byte, held heldLanes, err error) {
	buf, err = readSome(buf, io.LimitReader(r, freeFrameBytes))
	if err != nil || len(buf) < freeFrameBytes {
		return buf, held, err
	}
	if !c.e.inbound.medium.TryAcquire(1) {
		c.laneWait.Store(true)
		err = c.e.inbound.medium.Acquire(c.w.ctx, 1)
		c.laneWait.Store(false)
		if err != nil {
			return buf, held, err
		}
	}
	held.medium = true
	cut := time.AfterFunc(c.e.slowConsumer, func() {
		c.e.log.Warn("worker is sending a frame too slowly; dropping its connection", "worker_id", c.w.id)
		_ = c.c.CloseNow()
	})
	buf, err = readDoubling(buf, io.LimitReader(r, smallFrameBytes-freeFrameBytes), smallFrameBytes)
	cut.Stop()
	if err != nil || len(buf) < smallFrameBytes {
		return buf, held, err
	}
	// Waiting for a lane, this read loop reads nothing, pongs included:
	// the heartbeat must not take that for a dead host.
	c.laneWait.Store(true)
	held.large, err = c.e.inbound.acquire(c.w.ctx)
	c.laneWait.Store(false)
	if err != nil {
		return buf, held, err
	}
	cut = time.AfterFunc(c.e.slowConsumer, func() {
		c.e.log.Warn("worker is sending a large frame too slowly; dropping its connection", "worker_id", c.w.id)
		_ = c.c.CloseNow()
	})
	defer cut.Stop()
	buf, err = readLarge(buf, r)
	return buf, held, err
}

// readSome appends what r yields to buf, growing it as append does.
func readSome(buf []byte, r io.Reader) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, 4096)
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// readDoubling is readSome growing buf by doubling it, up to limit bytes
// (what r yields at most): a frame read while it trickles in allocates at
// most twice its size in all, not the many small steps append takes for a
// large slice.
func readDoubling(buf []byte, r io.Reader, limit int) ([]byte, error) {
	for {
		if len(buf) >= limit {
			return buf, nil
		}
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), min(max(2*cap(buf), 4096), limit))
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// largeChunk is the piece size in which readLarge reads.
const largeChunk = 4 << 20

// readLarge appends the rest of a large frame to buf. Growing one buffer
// as it fills (bytes.Buffer, io.ReadAll, append) allocates several times
// the frame in all; reading fixed pieces and joining them once allocates
// twice the frame, and the pieces are garbage together.
func readLarge(buf []byte, r io.Reader) ([]byte, error) {
	var pieces [][]byte
	total := len(buf)
	var err error
	for err == nil {
		p := make([]byte, largeChunk)
		n, rerr := io.ReadFull(r, p)
		if n > 0 {
			pieces = append(pieces, p[:n])
			total += n
		}
		switch rerr {
		case nil:
		case io.EOF, io.ErrUnexpectedEOF:
			err = io.EOF
		default:
			return buf, rerr
		}
	}
	out := make([]byte, len(buf), total)
	copy(out, buf)
	for _, p := range pieces {
		out = append(out, p...)
	}
	return out, nil
}

// handOffAfter is how long an in-process handler runs on the goroutine
// that read its frame before the connection's reading moves to a new
// goroutine. A call to the router or the plugin host mostly ends well
// within it (a few hundred microseconds), and then no goroutine is started
// and no idle thread woken for it (on a machine where that wake-up is
// costly, it is a good share of such a call). A longer call delays the
// connection's next frame by at most this much, and a handler that waits
// on a frame from its own caller's connection still gets it.
const handOffAfter = time.Millisecond

// runInPlace runs an in-process handler on the read loop's goroutine. If
// it is still running after handOffAfter, a new read loop takes over the
// connection; handedOff reports that, and this goroutine must then stop
// reading. Otherwise reading goes on here. While a handler of this
// connection runs long in place, the connection's calls are concurrent:
// later ones get a goroutine of their own at once, so a burst of slow
// calls waits for the hand-off once, not once per call.
func (c *wsConn) runInPlace(run func()) (handedOff bool) {
	if c.inPlace.Load() > 0 {
		go run()
		return false
	}
	c.inPlace.Add(1)
	defer c.inPlace.Add(-1)
	var reader atomic.Bool // who reads on is decided once: the timer or us
	t := time.AfterFunc(handOffAfter, func() {
		if reader.CompareAndSwap(false, true) {
			c.handOffs.Add(1)
			c.serve()
		}
	})
	run()
	if t.Stop() || reader.CompareAndSwap(false, true) {
		return false
	}
	return true
}

func isTelemetry(b []byte) bool {
	return bytes.HasPrefix(b, []byte("OTLP")) || bytes.HasPrefix(b, []byte("MTRC")) || bytes.HasPrefix(b, []byte("LOGS"))
}

// handleFrame routes one inbound frame. A frame that cannot be decoded is
// answered (when it named an invocation) and otherwise logged; it never
// drops the connection. handedOff reports that the frame's in-process
// handler ran long on this goroutine and another one reads on.
func (c *wsConn) handleFrame(data []byte, inPlace inPlaceRunner) (handedOff bool) {
	e, w := c.e, c.w
	defer func() {
		if r := recover(); r != nil {
			e.log.Error("frame handling panicked", "worker_id", w.id, "panic", r, "stack", string(debug.Stack()))
		}
	}()

	if handled, handedOff := e.fastPath(w, data, inPlace); handled {
		return handedOff
	}
	msg, err := protocol.Decode(data)
	if err != nil {
		e.badFrame(w, err)
		return false
	}
	switch m := msg.(type) {
	case *protocol.InvokeFunction:
		return e.handleInvoke(w, m, inPlace)
	case *protocol.InvocationResult:
		e.handleResult(w, m.InvocationID, m.Result, m.Error, m.Traceparent, m.Baggage)
	case *protocol.Ping:
		c.send([]byte(`{"type":"pong"}`))
	case *protocol.Pong:
	case *protocol.Reattach:
		e.handleReattach(w, m)
	case *protocol.TriggerRegistrationResult:
		e.triggerResult(w, m)
	case *protocol.RegisterFunction, *protocol.RegisterService, *protocol.RegisterTrigger, *protocol.RegisterTriggerType:
		if c.chargeRegistration(m, len(data)) && c.countRegistration(1) {
			w.submit(m)
		}
	case *protocol.UnregisterFunction, *protocol.UnregisterTrigger, *protocol.UnregisterTriggerType:
		c.unchargeRegistration(m)
		c.countRegistration(-1)
		w.submit(m)
	default:
		// workerregistered, registrationrejected and error travel engine →
		// worker only.
		e.log.Debug("ignoring a frame type only the engine sends", "worker_id", w.id, "type", msg.MessageType())
	}
	return false
}

// badFrame answers a frame that failed to decode. An invocationresult that
// cannot be read fails the call it was answering, so that caller learns at
// once; any other frame with an invocation id is answered to its sender.
func (e *Engine) badFrame(w *worker, err error) {
	var de *protocol.DecodeError
	if errors.As(err, &de) && errors.Is(err, protocol.ErrUnknownType) && de.InvocationID == "" {
		e.unknownFrame(w, de.Type)
		return
	}
	if !errors.As(err, &de) || de.InvocationID == "" {
		e.log.Warn("dropping undecodable frame", "worker_id", w.id, "error", err)
		return
	}
	body := &protocol.ErrorBody{Code: protocol.CodeInvalidFrame, Message: "invalid frame: " + err.Error()}
	if de.Type == string(protocol.TypeInvocationResult) {
		if p := e.pending.take(de.InvocationID, w); p != nil {
			w.active.Add(-1)
			e.deliver(p, nil, body, "", "")
			return
		}
		e.log.Warn("dropping undecodable invocationresult", "worker_id", w.id, "error", err)
		return
	}
	w.conn.send(appendResultFrame(nil, de.InvocationID, de.FunctionID, nil, body, "", ""))
}

// handleReattach evicts the connection a reconnecting worker replaces, but
// only on proof: worker ids are public, the token is not.
func (e *Engine) handleReattach(w *worker, m *protocol.Reattach) {
	old := e.lookupWorker(m.PreviousWorkerID)
	if old == nil || old == w || old.conn == nil {
		return
	}
	if m.ReattachToken == "" || subtle.ConstantTimeCompare([]byte(m.ReattachToken), []byte(old.conn.token)) != 1 {
		e.log.Warn("reattach with a wrong token ignored", "worker_id", w.id, "previous_worker_id", m.PreviousWorkerID)
		return
	}
	e.log.Debug("reattach: evicting previous connection", "worker_id", w.id, "previous_worker_id", old.id)
	old.conn.shutdown(statusPolicyViolation, "replaced by reattach")
	// Tear it down here rather than waiting for its read loop, so its
	// leases are free before this connection's registrations arrive.
	done := make(chan struct{})
	if !e.tasks.Go(func() {
		old.teardown()
		close(done)
	}) {
		old.teardown()
		return
	}
	t := time.NewTimer(reattachEvictTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		e.log.Warn("reattach: previous connection cleanup still running", "previous_worker_id", old.id)
	}
}

// send hands a frame to the socket, directly when the connection is idle,
// else through the writer's queue. It reports false when the connection is
// closing. A queue that stays full for slowConsumerTimeout means the peer
// stopped reading; the connection is dropped so it cannot stall its senders.
func (c *wsConn) send(frame []byte) bool {
	if c.queued.Load() == 0 && c.wmu.TryLock() {
		if c.queued.Load() == 0 {
			select {
			case <-c.quit:
				c.wmu.Unlock()
				return false
			default:
			}
			err := c.write(frame)
			c.wmu.Unlock()
			if err != nil {
				_ = c.c.CloseNow()
				return false
			}
			return true
		}
		c.wmu.Unlock()
	}
	if !c.reserve(frame) {
		return false
	}
	c.queued.Add(1)
	select {
	case c.out <- frame:
		c.afterQueued()
		return true
	case <-c.quit:
		c.queued.Add(-1)
		c.unreserve(frame)
		return false
	default:
	}
	t := time.NewTimer(c.e.slowConsumer)
	defer t.Stop()
	select {
	case c.out <- frame:
		c.afterQueued()
		return true
	case <-c.quit:
		c.queued.Add(-1)
		c.unreserve(frame)
		return false
	case <-t.C:
		c.queued.Add(-1)
		c.unreserve(frame)
		c.e.log.Warn("worker is not reading; dropping its connection", "worker_id", c.w.id)
		_ = c.c.CloseNow()
		return false
	}
}

// queuedCost is what a queued frame counts against
// QueuedBytesPerConnection: one frame larger than the cap still fits alone.
func (c *wsConn) queuedCost(frame []byte) int64 {
	return min(int64(len(frame)), c.limits.QueuedBytesPerConnection)
}

// reserve waits for room for frame in the outbound queue's byte cap. A
// connection whose queue does not drain within the slow-consumer time has
// stopped reading: it is dropped.
func (c *wsConn) reserve(frame []byte) bool {
	n := c.queuedCost(frame)
	if c.outBytes.TryAcquire(n) {
		return c.reserveEngine(n)
	}
	ctx, cancel := context.WithTimeout(c.w.ctx, c.e.slowConsumer)
	defer cancel()
	go func() { // a closing connection stops the wait at once
		select {
		case <-c.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := c.outBytes.Acquire(ctx, n); err != nil {
		if c.w.ctx.Err() == nil && !c.closingQuit() {
			c.e.log.Warn("worker is not reading (outbound queue full); dropping its connection", "worker_id", c.w.id,
				"limit_bytes", c.limits.QueuedBytesPerConnection)
			_ = c.c.CloseNow()
		}
		return false
	}
	return c.reserveEngine(n)
}

func (c *wsConn) unreserve(frame []byte) {
	n := c.queuedCost(frame)
	c.outBytes.Release(n)
	c.releaseEngine(n)
}

func (c *wsConn) closingQuit() bool {
	select {
	case <-c.quit:
		return true
	default:
		return false
	}
}

// write puts one frame on the socket; the caller holds wmu. writeStart lets
// the engine's watchdog cut a connection whose peer stopped reading while a
// write was blocked on it.
func (c *wsConn) write(frame []byte) error {
	c.writeStart.Store(time.Now().UnixNano())
	err := c.c.Write(context.Background(), websocket.MessageText, frame)
	c.writeStart.Store(0)
	return err
}

// shutdown asks the writer to flush what is queued and close the socket
// with the given status. The first call's status wins.
func (c *wsConn) shutdown(status websocket.StatusCode, reason string) {
	c.quitOnce.Do(func() {
		c.closeStatus, c.closeReason = status, reason
		close(c.quit)
	})
}

func (c *wsConn) writeLoop() {
	defer func() {
		close(c.writerDone)
		c.dropQueued()
	}()
	for {
		select {
		case f := <-c.out:
			if !c.writeQueued(f) {
				<-c.quit
				return
			}
		case <-c.quit:
			for {
				select {
				case f := <-c.out:
					if !c.writeQueued(f) {
						return
					}
					continue
				default:
				}
				break
			}
			c.closeSocket()
			return
		}
	}
}

func (c *wsConn) writeQueued(f []byte) bool {
	c.wmu.Lock()
	err := c.write(f)
	c.queued.Add(-1)
	c.wmu.Unlock()
	c.unreserve(f)
	if err != nil {
		_ = c.c.CloseNow()
		return false
	}
	return true
}

// closeSocket runs the close handshake, bounded: a peer that never answers
// is cut off.
func (c *wsConn) closeSocket() {
	done := make(chan struct{})
	go func() {
		_ = c.c.Close(c.closeStatus, c.closeReason)
		close(done)
	}()
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		_ = c.c.CloseNow()
		<-done
	}
}

// serveTelemetry accepts the telemetry-only socket the SDKs open beside the
// worker socket (OTLP spans, metrics and logs). This engine keeps no
// telemetry, so frames are read and dropped; accepting them keeps SDKs from
// reconnecting in a loop. It is not a worker.
func (e *Engine) serveTelemetry(rw http.ResponseWriter, r *http.Request, ls *listenerState) {
	if !ls.admitConnection(rw) {
		return
	}
	defer ls.release()
	if !e.tasks.Add() {
		http.Error(rw, "engine stopping", http.StatusServiceUnavailable)
		return
	}
	defer e.tasks.Done()
	if p, errb := e.authenticate(r.Context(), r, &ls.policy, remoteIP(r)); errb != nil || p == nil {
		http.Error(rw, CodeAuthError, http.StatusUnauthorized)
		return
	}
	c, err := websocket.Accept(rw, r, nil)
	if err != nil {
		return
	}
	c.SetReadLimit(ls.limits.FrameBytes)
	stop := context.AfterFunc(e.ctx, func() { _ = c.CloseNow() })
	defer stop()
	for {
		if err := e.discardTelemetryFrame(c); err != nil {
			_ = c.CloseNow()
			return
		}
	}
}

// discardTelemetryFrame reads one telemetry frame and drops it as it
// arrives: nothing of it is held, however large. Past its first MiB, as on
// the worker socket, the rest must arrive within the slow-consumer time,
// so a sender trickling a huge frame does not keep its connection forever.
func (e *Engine) discardTelemetryFrame(c *websocket.Conn) error {
	_, r, err := c.Reader(context.Background())
	if err != nil {
		return err
	}
	n, err := io.CopyN(io.Discard, r, smallFrameBytes)
	if err != nil || n < smallFrameBytes {
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return err
	}
	cut := time.AfterFunc(e.slowConsumer, func() {
		e.log.Warn("telemetry socket is sending a large frame too slowly; dropping it")
		_ = c.CloseNow()
	})
	defer cut.Stop()
	_, err = io.Copy(io.Discard, r)
	return err
}

// watchWriters cuts connections stuck in one socket write for longer than
// slowConsumerTimeout: their peer stopped reading, and the goroutine writing
// to it (possibly another worker's read loop) must not wait forever.
func (e *Engine) watchWriters() {
	tick := time.NewTicker(min(time.Second, e.slowConsumer/2))
	defer tick.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case now := <-tick.C:
			for _, w := range e.snapshotWorkers() {
				if w.conn == nil {
					continue
				}
				if st := w.conn.writeStart.Load(); st != 0 && now.UnixNano()-st > int64(e.slowConsumer) {
					e.log.Warn("worker is not reading; dropping its connection", "worker_id", w.id)
					_ = w.conn.c.CloseNow()
				}
			}
		}
	}
}

func remoteIP(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}
