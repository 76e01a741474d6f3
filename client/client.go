package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/protocol"
)

// Function ids of the engine builtins the client itself calls.
const (
	fnRegisterWorker = "engine::workers::register"
	fnCreateChannel  = "engine::channels::create"
	fnDropChannels   = "engine::channels::drop"
	enginePrefix     = "engine::"
)

// Client is one worker connected to an engine. All methods are safe for
// concurrent use.
type Client struct {
	url        string
	base       url.URL // scheme and host of the engine, for channel sockets
	opts       Options
	log        hclog.Logger
	httpClient *http.Client

	// life ends when the client stops for good; sessions, handler contexts
	// and reconnect waits hang off it.
	life   context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	sess     *session                   // the current connection; nil while disconnected
	reg      registrations              // what every new connection re-sends
	queue    []*outFrame                // frames waiting for a ready connection
	pending  map[string]*pendingCall    // calls waiting for their result, by invocation id
	workerID string                     // from the latest workerregistered
	token    string                     // its reattach token
	bearer   string                     // the Authorization token (Options.Token, then TokenSource's)
	rejected map[string]*RejectionError // functions refused on the current connection
	stopErr  error                      // why the client stopped; nil while it runs

	stopped   chan struct{} // closed when stopErr is set
	superDone chan struct{} // closed when the supervisor goroutine exits
	handlers  sync.WaitGroup
}

// outFrame is a frame waiting for a connection. Call frames survive a
// reconnect; control frames (registration changes made during a handshake)
// are dropped with their connection, because the next handshake re-sends the
// whole registration state anyway.
type outFrame struct {
	data []byte
	call *pendingCall // nil for control frames
}

type callState uint8

const (
	callQueued  callState = iota // waiting for a connection
	callWriting                  // being written on pendingCall.sess
	callWritten                  // on the wire; waiting for the result
	callDone                     // finished; result and err are set
)

// pendingCall is one Call from submission to result. Its mutable fields are
// guarded by Client.mu.
type pendingCall struct {
	id       string // invocation id; "" for void calls
	function string
	frame    []byte
	timeout  time.Duration

	state  callState
	sess   *session
	result json.RawMessage
	err    error
	done   chan struct{}
}

// Dial connects to the engine at rawURL (ws://host:port, wss://…, or the
// http(s) equivalents) and registers the worker. With reconnects enabled it
// keeps trying, with the policy's backoff, until ctx ends; with reconnects
// disabled it tries once. ctx bounds only the dialling: the connection lives
// until Close.
func Dial(ctx context.Context, rawURL string, opts Options) (*Client, error) {
	o, err := opts.withDefaults(os.Getenv)
	if err != nil {
		return nil, err
	}
	u, err := engineURL(rawURL)
	if err != nil {
		return nil, err
	}
	c := &Client{
		url:    u.String(),
		base:   url.URL{Scheme: u.Scheme, Host: u.Host},
		opts:   o,
		log:    o.Logger,
		bearer: o.Token,
		// A transport of its own, without keep-alives, so a refused upgrade
		// leaves no idle connection (and no goroutine) behind.
		httpClient: &http.Client{Transport: &http.Transport{
			Proxy:             http.ProxyFromEnvironment,
			DisableKeepAlives: true,
		}},
		reg:       newRegistrations(),
		pending:   make(map[string]*pendingCall),
		rejected:  make(map[string]*RejectionError),
		stopped:   make(chan struct{}),
		superDone: make(chan struct{}),
	}
	c.life, c.cancel = context.WithCancel(context.Background())

	s, err := c.connectFirst(ctx)
	if err != nil {
		c.mu.Lock()
		c.stopLocked(err)
		c.mu.Unlock()
		c.cancel()
		close(c.superDone)
		c.handlers.Wait()
		c.httpClient.CloseIdleConnections()
		return nil, err
	}
	go c.supervise(s)
	return c, nil
}

// engineURL normalises the engine address to a ws(s) URL.
func engineURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("engine address %q is not a URL: %v", raw, err), Err: err}
	}
	switch u.Scheme {
	case "ws", "wss":
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("engine address %q must start with ws:// or wss://", raw)}
	}
	if u.Host == "" {
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("engine address %q has no host", raw)}
	}
	return u, nil
}

// URL is the engine address the client connects to.
func (c *Client) URL() string { return c.url }

// Name is the worker name the client registers.
func (c *Client) Name() string { return c.opts.Name }

// Namespace is the worker's namespace ("" when it has none).
func (c *Client) Namespace() string { return c.opts.Namespace }

// WorkerID is the id the engine gave the current (or latest) connection.
func (c *Client) WorkerID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.workerID
}

// Connected reports whether a connection is up and past its handshake.
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sess != nil && c.sess.ready
}

// Done is closed when the client stops for good: Close, a refused worker
// name, or a reconnect policy that gave up. Err then says why.
func (c *Client) Done() <-chan struct{} { return c.stopped }

// Err is nil while the client runs, then the reason it stopped.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopErr
}

// Close stops the client: it fails the calls still waiting, closes the
// connection, stops reconnecting and waits for running handlers (their
// context is cancelled) until ctx ends.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	c.stopLocked(&Error{Code: CodeClientClosed, Message: "the client is closed"})
	s := c.sess
	c.mu.Unlock()

	if s != nil {
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			_ = s.conn.Close(websocket.StatusNormalClosure, "")
		}()
		select {
		case <-closed:
		case <-ctx.Done():
			_ = s.conn.CloseNow()
			<-closed
		}
	}
	c.cancel()

	var err error
	select {
	case <-c.superDone:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err == nil {
		handlersDone := make(chan struct{})
		go func() {
			c.handlers.Wait()
			close(handlersDone)
		}()
		select {
		case <-handlersDone:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	c.httpClient.CloseIdleConnections()
	return err
}

// stopLocked makes the client stop for good with err, failing every call
// that waits. c.mu must be held.
func (c *Client) stopLocked(err error) {
	if c.stopErr != nil {
		return
	}
	c.stopErr = err
	close(c.stopped)
	for _, pc := range c.pending {
		// A call whose frame is being written is settled by its writer,
		// which knows whether the frame went out: wroteLocked then fails it
		// as lost with its connection, retryLocked with err.
		if pc.state == callWriting {
			continue
		}
		c.finishLocked(pc, nil, err)
	}
	for _, f := range c.queue {
		if f.call != nil {
			c.finishLocked(f.call, nil, err)
		}
	}
	c.queue = nil
}

func (c *Client) stop(err error) {
	c.mu.Lock()
	c.stopLocked(err)
	c.mu.Unlock()
}

// finishLocked completes pc once. c.mu must be held.
func (c *Client) finishLocked(pc *pendingCall, result json.RawMessage, err error) {
	if pc.state == callDone {
		return
	}
	pc.state = callDone
	if pc.id != "" && c.pending[pc.id] == pc {
		delete(c.pending, pc.id)
	}
	pc.result, pc.err = result, err
	close(pc.done)
}

// codeAuthError is the engine's refusal of a connection's credential.
const codeAuthError = "AUTH_ERROR"

// connectFirst makes Dial's connection, retrying per the policy while ctx
// lives.
func (c *Client) connectFirst(ctx context.Context) (*session, error) {
	for failures := 0; ; {
		s, err := c.connect(ctx)
		if err == nil {
			return s, nil
		}
		if stopErr := c.Err(); stopErr != nil {
			return nil, stopErr
		}
		failures++
		if c.opts.Reconnect.exhausted(failures) || ctx.Err() != nil || (CodeOf(err) == codeAuthError && !c.refreshToken()) {
			return nil, err
		}
		d := c.opts.Reconnect.nextDelay(failures - 1)
		c.log.Debug("engine not reachable yet; retrying", "url", c.url, "in", d, "error", err)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// supervise follows the live connection and replaces it when it drops,
// until the client stops.
func (c *Client) supervise(s *session) {
	defer close(c.superDone)
	for s != nil {
		<-s.done
		<-s.pingerDone
		c.sessionEnded(s)
		if c.Err() != nil {
			return
		}
		cause := s.cause()
		if c.opts.Reconnect.Disable {
			c.stop(&Error{Code: CodeConnectionLost,
				Message: fmt.Sprintf("connection to the engine at %s lost: %s", c.url, describeDisconnect(cause)), Err: cause})
			return
		}
		c.log.Warn("connection to the engine lost; reconnecting", "url", c.url, "error", describeDisconnect(cause))
		s = c.reconnect()
	}
}

// reconnect dials with backoff until it succeeds, the client stops, or the
// policy gives up (then the client stops with CONNECTION_LOST).
func (c *Client) reconnect() *session {
	for failures := 0; ; {
		t := time.NewTimer(c.opts.Reconnect.nextDelay(failures))
		select {
		case <-c.life.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		s, err := c.connect(c.life)
		if err == nil {
			c.log.Info("reconnected to the engine", "url", c.url, "worker_id", c.WorkerID())
			return s
		}
		if c.Err() != nil {
			return nil
		}
		failures++
		c.log.Debug("reconnect attempt failed", "attempt", failures, "error", err)
		if CodeOf(err) == codeAuthError && !c.refreshToken() {
			// The engine refuses this token: trying it again cannot
			// help, and a worker that looks connected would hide it.
			c.stop(&Error{Code: codeAuthError,
				Message: fmt.Sprintf("the engine at %s refuses this client's token (it was restarted with another engine token, or the credential was revoked): %v", c.url, err), Err: err})
			return nil
		}
		if c.opts.Reconnect.exhausted(failures) {
			c.stop(&Error{Code: CodeConnectionLost,
				Message: fmt.Sprintf("gave up reconnecting to the engine at %s after %d attempts: %v", c.url, failures, err), Err: err})
			return nil
		}
	}
}

// connect opens one connection and runs the handshake: greeting, reattach,
// registrations, worker metadata, then the frames that waited.
func (c *Client) connect(ctx context.Context) (*session, error) {
	dctx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	defer cancel()

	s := newSession(c)
	conn, resp, err := websocket.Dial(dctx, c.url, &websocket.DialOptions{
		HTTPClient: c.sessionHTTPClient(s),
		HTTPHeader: c.workerHeader(),
		OnPingReceived: func(context.Context, []byte) bool {
			s.touch()
			return true
		},
	})
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	if err != nil {
		s.cancel()
		return nil, unreachable(c.url, err, resp)
	}
	conn.SetReadLimit(maxMessageSize)
	greeting, err := readGreeting(dctx, conn)
	if err != nil {
		_ = conn.CloseNow()
		s.cancel()
		return nil, err
	}
	s.conn = conn

	c.mu.Lock()
	if c.stopErr != nil {
		err := c.stopErr
		c.mu.Unlock()
		_ = conn.CloseNow()
		s.cancel()
		return nil, err
	}
	prevID, prevToken := c.workerID, c.token
	c.workerID, c.token = greeting.WorkerID, greeting.ReattachToken
	frames := c.reg.handshakeFrames()
	c.rejected = make(map[string]*RejectionError)
	c.sess = s
	c.mu.Unlock()
	s.start()

	fail := func(err error) (*session, error) {
		_ = conn.CloseNow()
		<-s.done
		<-s.pingerDone
		c.sessionEnded(s)
		if stopErr := c.Err(); stopErr != nil {
			return nil, stopErr
		}
		return nil, err
	}
	handshakeErr := func(step string, err error) error {
		return &Error{Code: CodeConnectionLost, Message: fmt.Sprintf("connection to the engine at %s lost during the handshake (%s): %s",
			c.url, step, describeDisconnect(err)), Err: err}
	}

	if prevID != "" {
		f, err := protocol.Encode(&protocol.Reattach{PreviousWorkerID: prevID, ReattachToken: prevToken})
		if err == nil {
			err = s.write(f)
		}
		if err != nil {
			return fail(handshakeErr("reattach", err))
		}
	}
	for _, f := range frames {
		if err := s.write(f); err != nil {
			return fail(handshakeErr("registrations", err))
		}
	}
	if err := c.registerWorker(ctx, s); err != nil {
		return fail(err)
	}
	if err := c.flush(s); err != nil {
		return fail(handshakeErr("queued frames", err))
	}
	c.log.Debug("connected to the engine", "url", c.url, "worker_id", greeting.WorkerID)
	return s, nil
}

// readGreeting reads the engine's first frame, which must be
// workerregistered; an error frame (e.g. AUTH_ERROR) is returned as the
// engine's *protocol.ErrorBody.
func readGreeting(ctx context.Context, conn *websocket.Conn) (*protocol.WorkerRegistered, error) {
	_, data, err := conn.Read(ctx)
	if err != nil {
		return nil, &Error{Code: CodeHandshakeFailed, Message: "the engine did not greet the worker: " + describeDisconnect(err), Err: err}
	}
	msg, err := protocol.Decode(data)
	if err != nil {
		return nil, &Error{Code: CodeHandshakeFailed, Message: "the engine's greeting is not an iii frame: " + err.Error(), Err: err}
	}
	switch m := msg.(type) {
	case *protocol.WorkerRegistered:
		if m.WorkerID == "" {
			return nil, &Error{Code: CodeHandshakeFailed, Message: "the engine's greeting carries no worker_id"}
		}
		return m, nil
	case *protocol.ErrorFrame:
		body := m.Error
		return nil, &body
	default:
		return nil, &Error{Code: CodeHandshakeFailed, Message: fmt.Sprintf("the engine greeted with %q instead of %q", msg.MessageType(), protocol.TypeWorkerRegistered)}
	}
}

// workerMetadata is the payload of engine::workers::register.
type workerMetadata struct {
	Runtime     string `json:"runtime"`
	Version     string `json:"version"`
	Name        string `json:"name"`
	Description string `json:"description"`
	OS          string `json:"os"`
	PID         int    `json:"pid"`
	Isolation   string `json:"isolation,omitempty"`
	Namespace   string `json:"namespace,omitempty"`
}

// registerWorker sends engine::workers::register on s: fire-and-forget, or
// as a call whose answer confirms the worker name when
// ConfirmRegistration is set.
func (c *Client) registerWorker(ctx context.Context, s *session) error {
	meta, err := json.Marshal(workerMetadata{
		Runtime:     c.opts.Runtime,
		Version:     c.opts.Version,
		Name:        c.opts.Name,
		Description: c.opts.Description,
		OS:          runtime.GOOS + " (" + runtime.GOARCH + ")",
		PID:         os.Getpid(),
		Isolation:   c.opts.Isolation,
		Namespace:   c.opts.Namespace,
	})
	if err != nil {
		return &Error{Code: CodeSerialization, Message: "encode worker metadata: " + err.Error(), Err: err}
	}
	msg := &protocol.InvokeFunction{FunctionID: fnRegisterWorker, Data: meta}
	if !c.opts.ConfirmRegistration {
		msg.Action = &protocol.TriggerAction{Type: protocol.ActionVoid}
		frame, err := protocol.Encode(msg)
		if err == nil {
			err = s.write(frame)
		}
		if err != nil {
			return &Error{Code: CodeConnectionLost, Message: "connection to the engine lost while registering the worker: " + describeDisconnect(err), Err: err}
		}
		return nil
	}

	msg.InvocationID = uuid.NewString()
	frame, err := protocol.Encode(msg)
	if err != nil {
		return &Error{Code: CodeSerialization, Message: "encode worker registration: " + err.Error(), Err: err}
	}
	pc := newPendingCall(msg.InvocationID, fnRegisterWorker, frame, c.opts.DialTimeout)
	c.mu.Lock()
	if c.stopErr != nil {
		err := c.stopErr
		c.mu.Unlock()
		return err
	}
	c.pending[pc.id] = pc
	pc.state, pc.sess = callWriting, s
	c.mu.Unlock()
	if err := s.write(frame); err != nil {
		c.mu.Lock()
		c.finishLocked(pc, nil, err)
		c.mu.Unlock()
		return &Error{Code: CodeConnectionLost, Message: "connection to the engine lost while registering the worker: " + describeDisconnect(err), Err: err}
	}
	c.mu.Lock()
	c.wroteLocked(s, pc)
	c.mu.Unlock()

	// Nobody else watches s yet, so its end is watched here too.
	t := time.NewTimer(c.opts.DialTimeout)
	defer t.Stop()
	var waitErr error
	select {
	case <-pc.done:
	case <-s.done:
		waitErr = &Error{Code: CodeConnectionLost, Message: "the engine closed the connection while registering the worker: " + describeDisconnect(s.cause()), Err: s.cause()}
	case <-t.C:
		waitErr = &Error{Code: CodeTimeout, Message: fmt.Sprintf("the engine did not confirm the worker registration within %s", c.opts.DialTimeout)}
	case <-ctx.Done():
		waitErr = ctx.Err()
	}
	c.mu.Lock()
	c.finishLocked(pc, nil, waitErr)
	c.mu.Unlock()
	if pc.err != nil {
		if stopErr := c.Err(); stopErr != nil {
			return stopErr
		}
		return pc.err
	}
	return nil
}

// flush writes the frames that waited for a connection, then marks s ready.
// Frames queued meanwhile are written in later rounds, so order holds.
func (c *Client) flush(s *session) error {
	for {
		c.mu.Lock()
		if s.ended {
			c.mu.Unlock()
			return errors.New("connection ended")
		}
		if len(c.queue) == 0 {
			s.ready = true
			c.mu.Unlock()
			return nil
		}
		batch := c.queue
		c.queue = nil
		c.mu.Unlock()

		for i, f := range batch {
			if f.call == nil {
				if err := s.write(f.data); err != nil {
					c.requeue(batch[i+1:])
					return err
				}
				continue
			}
			c.mu.Lock()
			pc := f.call
			if pc.state != callQueued {
				c.mu.Unlock()
				continue
			}
			pc.state, pc.sess = callWriting, s
			c.mu.Unlock()
			err := s.write(pc.frame)
			c.mu.Lock()
			if err != nil {
				if pc.state == callWriting {
					pc.state, pc.sess = callQueued, nil
				}
				c.mu.Unlock()
				c.requeue(batch[i:])
				return err
			}
			c.wroteLocked(s, pc)
			c.mu.Unlock()
		}
	}
}

// requeue puts the call frames of a failed flush back at the head of the
// queue, in order, so the next connection sends them first.
func (c *Client) requeue(rest []*outFrame) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var keep []*outFrame
	for _, f := range rest {
		if f.call == nil || f.call.state == callDone {
			continue
		}
		if c.stopErr != nil {
			c.finishLocked(f.call, nil, c.stopErr)
			continue
		}
		f.call.state, f.call.sess = callQueued, nil
		keep = append(keep, f)
	}
	c.queue = append(keep, c.queue...)
}

// sessionEnded retires s: calls written on it fail (the engine will never
// answer them there), its handshake-time control frames are dropped and its
// handlers' context is cancelled.
func (c *Client) sessionEnded(s *session) {
	c.mu.Lock()
	s.ended = true
	if c.sess == s {
		c.sess = nil
	}
	for _, pc := range c.pending {
		if pc.sess == s && pc.state == callWritten {
			c.finishLocked(pc, nil, c.lostLocked(pc, s))
		}
	}
	keep := c.queue[:0]
	for _, f := range c.queue {
		if f.call != nil {
			keep = append(keep, f)
		}
	}
	c.queue = keep
	c.mu.Unlock()
	s.cancel()
}
