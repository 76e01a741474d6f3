package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/iii-sandbox/iii/internal/batchconn"
	"github.com/iii-sandbox/iii/protocol"
)

// session is one WebSocket connection to the engine.
type session struct {
	c    *Client
	conn *websocket.Conn

	// ctx ends with the session: writes, and the handlers of invocations
	// that arrived on it, stop with it.
	ctx    context.Context
	cancel context.CancelFunc

	done       chan struct{} // closed when the read loop exits
	pingerDone chan struct{}
	lastRead   atomic.Int64 // unix nanoseconds of the last frame or ping from the engine

	errOnce sync.Once
	err     error // why the session ended; set once

	// Guarded by Client.mu.
	ready bool // handshake and queue flush done: frames go straight out
	ended bool // retired by sessionEnded
}

func newSession(c *Client) *session {
	s := &session{c: c, done: make(chan struct{}), pingerDone: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(c.life)
	s.touch()
	return s
}

func (s *session) start() {
	// Reads and writes pass no context of their own: with one, the
	// WebSocket library arms and disarms a cancellation callback for every
	// message (a quarter of an engine call's allocations). The session's
	// end closes the socket instead, which ends a read or write in flight
	// just as well; its cause is set first, so a client that closes still
	// reads as "connection closed by the client".
	context.AfterFunc(s.ctx, func() {
		s.setCause(context.Cause(s.ctx))
		_ = s.conn.CloseNow()
	})
	go s.readLoop()
	go s.pinger()
}

func (s *session) touch() { s.lastRead.Store(time.Now().UnixNano()) }

// sessionHTTPClient is c's transport for the connection of session s,
// which counts any bytes read from the engine as a sign of life: a large
// frame that takes longer than IdleTimeout to arrive (a remote adapter
// receiving a big fs::write over a slow link) is not silence, though no
// whole frame and no ping gets through meanwhile.
func (c *Client) sessionHTTPClient(s *session) *http.Client {
	base, ok := c.httpClient.Transport.(*http.Transport)
	if !ok {
		return c.httpClient
	}
	t := base.Clone()
	dial := t.DialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		// The library writes every frame with a system call of its own;
		// batchconn gathers the frames many goroutines send meanwhile.
		return batchconn.New(touchingConn{conn, s}, 0), nil
	}
	return &http.Client{Transport: t}
}

// touchingConn marks its session alive on every read that yields bytes.
type touchingConn struct {
	net.Conn
	s *session
}

func (c touchingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.s.touch()
	}
	return n, err
}

func (s *session) setCause(err error) {
	s.errOnce.Do(func() { s.err = err })
}

// cause is why the session ended (nil while it runs).
func (s *session) cause() error {
	select {
	case <-s.done:
	default:
		return nil
	}
	return s.err
}

// write sends one text frame. Frames from many goroutines may interleave;
// the library serialises whole messages.
func (s *session) write(frame []byte) error {
	if err := s.ctx.Err(); err != nil {
		return err
	}
	return s.conn.Write(context.Background(), websocket.MessageText, frame)
}

func (s *session) readLoop() {
	defer close(s.done)
	for {
		_, data, err := s.conn.Read(context.Background())
		if err != nil {
			s.setCause(err)
			return
		}
		s.touch()
		s.c.dispatch(s, data)
	}
}

// pinger pings the engine every PingInterval and drops the connection when
// nothing at all came from the engine for IdleTimeout: a half-open TCP
// connection otherwise looks alive forever.
func (s *session) pinger() {
	defer close(s.pingerDone)
	o := s.c.opts
	ping := time.NewTicker(o.PingInterval)
	defer ping.Stop()
	idle := time.NewTimer(o.IdleTimeout)
	defer idle.Stop()
	frame, _ := protocol.Encode(&protocol.Ping{})
	for {
		select {
		case <-s.done:
			return
		case <-s.ctx.Done():
			return
		case <-ping.C:
			_ = s.write(frame)
		case now := <-idle.C:
			// The timer runs from the last check, not the last frame:
			// re-arm it for the rest of the idle window when a frame came.
			silent := now.Sub(time.Unix(0, s.lastRead.Load()))
			if silent < o.IdleTimeout {
				idle.Reset(o.IdleTimeout - silent)
				continue
			}
			s.setCause(fmt.Errorf("no frame from the engine for %s", silent.Round(time.Millisecond)))
			s.c.log.Warn("engine connection idle; dropping it", "silent", silent)
			_ = s.conn.CloseNow()
			return
		}
	}
}

// dispatch handles one frame from the engine, on the read loop. Anything
// slow (handlers, callbacks) runs on its own goroutine.
//
// data is the read's own buffer (never reused), so the call-path frames are
// decoded in one pass with their payloads left in place (DecodeFast).
func (c *Client) dispatch(s *session, data []byte) {
	msg, err := protocol.DecodeFast(data)
	if err != nil {
		c.badFrame(s, err)
		return
	}
	switch m := msg.(type) {
	case *protocol.InvocationResult:
		c.complete(m)
	case *protocol.InvokeFunction:
		c.handleInvoke(s, m)
	case *protocol.Ping:
		if f, err := protocol.Encode(&protocol.Pong{}); err == nil {
			_ = s.write(f)
		}
	case *protocol.Pong:
	case *protocol.RegistrationRejected:
		c.handleRejection(s, m)
	case *protocol.RegisterTrigger:
		c.handleTriggerRegistration(s, m)
	case *protocol.UnregisterTrigger:
		c.handleTriggerUnregistration(s, m)
	case *protocol.TriggerRegistrationResult:
		if m.Error != nil {
			c.report(&TriggerError{TriggerID: m.ID, TriggerType: m.TriggerType, FunctionID: m.FunctionID, Err: m.Error})
		}
	case *protocol.WorkerRegistered:
		// Only the greeting carries this; a repeat just refreshes the ids.
		c.mu.Lock()
		c.workerID, c.token = m.WorkerID, m.ReattachToken
		c.mu.Unlock()
	case *protocol.ErrorFrame:
		body := m.Error
		s.setCause(&body)
		c.log.Error("the engine reported an error", "code", body.Code, "message", body.Message)
	default:
		c.log.Debug("ignoring frame", "type", msg.MessageType())
	}
}

// badFrame answers an undecodable invocation with invalid_frame so its
// caller is not left waiting; other bad frames are only logged.
func (c *Client) badFrame(s *session, err error) {
	c.log.Warn("undecodable frame from the engine", "error", err)
	var de *protocol.DecodeError
	if !errors.As(err, &de) || de.InvocationID == "" || de.Type != string(protocol.TypeInvokeFunction) {
		return
	}
	f, encErr := protocol.Encode(&protocol.InvocationResult{InvocationID: de.InvocationID, FunctionID: de.FunctionID,
		Error: &protocol.ErrorBody{Code: protocol.CodeInvalidFrame, Message: "the worker could not decode the invocation: " + de.Err.Error()}})
	if encErr == nil {
		_ = s.write(f)
	}
}

// complete hands a result to its waiting call; a result nobody waits for
// (the call timed out) is dropped.
func (c *Client) complete(m *protocol.InvocationResult) {
	result := m.Result
	if string(result) == "null" {
		result = nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	pc := c.pending[m.InvocationID]
	if pc == nil {
		c.log.Debug("result for an unknown invocation dropped", "invocation_id", m.InvocationID)
		return
	}
	if m.Error != nil {
		c.finishLocked(pc, nil, m.Error)
		return
	}
	c.finishLocked(pc, result, nil)
}

func (c *Client) handleRejection(s *session, m *protocol.RegistrationRejected) {
	re := &RejectionError{Code: m.Code, Namespace: m.Namespace, WorkerName: m.WorkerName,
		FunctionID: m.FunctionID, OwnerWorkerID: m.OwnerWorkerID}
	if m.Code == protocol.CodeWorkerNamespaceConflict {
		// Another live worker owns the name: reconnecting would only be
		// refused again, so the client stops and says why.
		c.log.Error("the engine refused the worker name; stopping", "error", re.Error())
		c.stop(re)
		s.setCause(re)
		_ = s.conn.CloseNow()
		c.report(re)
		return
	}
	c.log.Error("the engine refused a registration", "error", re.Error())
	if m.FunctionID != "" {
		c.mu.Lock()
		c.rejected[m.FunctionID] = re
		c.mu.Unlock()
	}
	c.report(re)
}

// report passes a registration failure to Options.OnRegistrationError.
// Called from read loops only, so the WaitGroup never grows after Close
// started waiting.
func (c *Client) report(err error) {
	if c.opts.OnRegistrationError == nil {
		return
	}
	c.handlers.Add(1)
	go func() {
		defer c.handlers.Done()
		c.opts.OnRegistrationError(err)
	}()
}

// wroteLocked records that pc's frame went out on s. c.mu must be held.
func (c *Client) wroteLocked(s *session, pc *pendingCall) {
	if pc.state == callDone {
		return
	}
	if pc.id == "" {
		c.finishLocked(pc, nil, nil) // a void call is done once written
		return
	}
	pc.state, pc.sess = callWritten, s
	if s.ended {
		c.finishLocked(pc, nil, c.lostLocked(pc, s))
	}
}

// lostLocked is the error of a call written on s when s ended: why the
// client stopped, if it stopped for its own reason (Close, a refused name),
// else the lost connection. c.mu must be held.
func (c *Client) lostLocked(pc *pendingCall, s *session) error {
	if c.stopErr != nil && CodeOf(c.stopErr) != CodeConnectionLost {
		return c.stopErr
	}
	cause := s.cause()
	return &Error{Code: CodeConnectionLost,
		Message: fmt.Sprintf("connection to the engine lost before %s answered: %s", pc.function, describeDisconnect(cause)), Err: cause}
}

// unreachable turns a failed WebSocket dial into the message users see.
func unreachable(u string, err error, resp *http.Response) error {
	if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
		return &Error{Code: CodeEngineUnreachable, Err: err,
			Message: fmt.Sprintf("cannot reach the engine at %s: it answered HTTP %d instead of a WebSocket upgrade", u, resp.StatusCode)}
	}
	return &Error{Code: CodeEngineUnreachable, Err: err,
		Message: fmt.Sprintf("cannot reach the engine at %s: %s", u, netReason(err))}
}

// netReason is the innermost readable cause of a network error:
// "connection refused" rather than the library's chain of wrappers.
func netReason(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return dnsErr.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return "no answer in time"
	}
	var sysErr *os.SyscallError
	if errors.As(err, &sysErr) {
		return sysErr.Err.Error()
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Err != nil {
		return opErr.Err.Error()
	}
	return err.Error()
}

// describeDisconnect says why a connection ended, in words.
func describeDisconnect(err error) string {
	if err == nil {
		return "connection closed"
	}
	var eb *protocol.ErrorBody
	if errors.As(err, &eb) {
		return eb.Error()
	}
	var re *RejectionError
	if errors.As(err, &re) {
		return re.Error()
	}
	if st := websocket.CloseStatus(err); st != -1 {
		var ce websocket.CloseError
		if errors.As(err, &ce) && ce.Reason != "" {
			return fmt.Sprintf("the engine closed the connection (%d %s)", int(st), ce.Reason)
		}
		return fmt.Sprintf("the engine closed the connection (%d)", int(st))
	}
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return "connection closed"
	}
	if errors.Is(err, context.Canceled) {
		return "connection closed by the client"
	}
	return netReason(err)
}

// marshalValue encodes a payload or result: nil is absent, json.RawMessage
// is used as is (it must be valid JSON), anything else goes through
// encoding/json.
func marshalValue(v any) (json.RawMessage, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if len(x) == 0 {
			return nil, nil
		}
		if !protocol.Valid(x) {
			return nil, errors.New("json.RawMessage value is not valid JSON")
		}
		return x, nil
	default:
		// Without HTML escaping, as the other SDKs encode: "<" stays "<".
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return nil, err
		}
		return bytes.TrimSuffix(b.Bytes(), []byte{'\n'}), nil
	}
}
