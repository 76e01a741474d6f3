package httpworker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/protocol"
)

// Streaming, as upstream's trigger-type generation: every request carries
// two channel refs, request_body (read end: the raw body, as sent) and
// response (write end). A function that returns null answers through the
// response channel: text messages {"type":"set_status","status_code":n}
// and {"type":"set_headers","headers":{…}} before the body, binary
// messages the body, the writer's close its end (the `http()` helper of
// @iii-dev/helpers writes exactly that).
//
// Most functions touch neither channel, so a request's channels are made
// to cost as little as possible when unused:
//   - the worker mints both refs itself under its connection's channel
//     lease (engine::channels::lease, client.ChannelLease): no call, no
//     frame, and no engine table entry for a channel nobody opens; the
//     engine makes a channel when one of its ends is first opened;
//   - the body is not sent anywhere in advance: request_body is minted
//     "served", and when a function opens it, the engine says so through
//     engine::channels::watch, which the worker keeps waiting while it has
//     requests in flight, and the worker writes the body through the
//     writer end then;
//   - the worker opens its read end of response only when it needs it: when
//     the function returned null, or once the function has run for
//     openResponseAfter (so a long function writing much before it returns
//     is drained as it writes, not held up by the channel's buffer);
//   - when requests end, the same watch call retires their counters (every
//     one under the newest minted but those of requests still in flight):
//     their refs open nothing from then on, and what is left of their
//     channels is removed.
//
// An engine without leases (or one that refuses the worker the lease
// builtins) gets the channels created instead: both in one
// engine::channels::create call, the request_body one holding the body
// (up to 64 KiB; a larger body is written through the writer socket),
// several requests' in one call under load (createbatch.go), dropped in
// the background when the request ends, many requests' in one
// engine::channels::drop.

// maxStreamHeaders bounds one set_headers message.
const maxStreamHeaders = 64 << 10

// openResponseAfter is how long a function runs before the worker opens
// its end of the response channel anyway. Until then the channel buffers
// what the function writes (64 messages, then the sockets' buffers): a Go
// function that writes more and closes its writer before it returns waits
// this long at most, where a reader opened at the start would not hold it
// up; every request that needs no reader is spared a socket.
const openResponseAfter = 250 * time.Millisecond

// watchWait is how long one engine::channels::watch call waits for a
// function to open a request's body: with requests in flight the worker
// makes one call per watchWait at most (and one more per body served),
// which is also how often ended requests' refs are retired.
const watchWait = 100 * time.Millisecond

// leaseRetry is how long the worker creates channels instead after a lease
// call failed for a reason that may pass.
const leaseRetry = 5 * time.Second

// Streams opens the two channels of one request.
type Streams interface {
	Open(ctx context.Context, body []byte) (RequestStreams, error)
}

// RequestStreams is one request's channels, as the worker holds them.
type RequestStreams interface {
	// Refs are what the function receives: the request body's read end
	// and the response's write end.
	Refs() (requestBody, response protocol.StreamChannelRef)
	// Response opens (once) and waits for the worker's read end of the
	// response channel.
	Response(ctx context.Context) (MessageReader, error)
	// Close releases the worker's ends and drops both channels.
	Close()
}

// MessageReader is the read end of a channel, a message at a time; io.EOF
// once the writer closed it.
type MessageReader interface {
	ReadMessage(ctx context.Context) (client.ChannelMessage, error)
}

// maxRequestsWithChannels is how many requests hold created channels at
// once (without a lease): the engine lets one connection hold 256 channels
// (engine.MaxChannelsPerConnection). A request past it waits for an
// earlier one's channels to be dropped (within default_timeout), rather
// than failing with the engine's LIMIT_EXCEEDED.
const maxRequestsWithChannels = 128

// ClientStreams makes request channels through a connected client.
type ClientStreams struct {
	c   *client.Client
	log hclog.Logger

	mu       sync.Mutex
	lease    *client.ChannelLease // nil until leased, and after it was lost
	leasing  chan struct{}        // closed when the lease call under way ends
	noLease  time.Time            // create channels instead until then
	next     uint64               // the next counter to mint; two a request
	live     map[uint64]*clientStreams
	watching bool   // the watch loop runs
	retired  uint64 // every counter under it is retired (by the last watch call)

	// Without a lease.
	drops   dropQueue
	creates createBatcher
	// slots holds one token per request whose created channels may still
	// exist: taken before they are created, given back once the engine has
	// answered their drop.
	slots chan struct{}
}

// NewClientStreams makes the request channels of a worker connected
// through c; log may be nil.
func NewClientStreams(c *client.Client, log hclog.Logger) *ClientStreams {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	cs := &ClientStreams{c: c, log: log, slots: make(chan struct{}, maxRequestsWithChannels), live: map[uint64]*clientStreams{}}
	cs.drops.c, cs.drops.log, cs.drops.release = c, log, cs.release
	cs.creates.create, cs.creates.dropLater, cs.creates.release = c.CreateChannels, cs.drops.add, cs.release
	return cs
}

func (cs *ClientStreams) release(requests int) {
	for range requests {
		<-cs.slots
	}
}

// currentLease is the connection's channel lease, fetched on first use and
// after a reconnect; nil when the engine has none to give (the caller then
// creates channels).
func (cs *ClientStreams) currentLease(ctx context.Context) *client.ChannelLease {
	for {
		cs.mu.Lock()
		if l := cs.lease; l != nil && l.Current() {
			cs.mu.Unlock()
			return l
		}
		if time.Now().Before(cs.noLease) {
			cs.mu.Unlock()
			return nil
		}
		if wait := cs.leasing; wait != nil {
			cs.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		done := make(chan struct{})
		cs.leasing, cs.lease = done, nil
		cs.mu.Unlock()

		l, err := cs.c.LeaseChannels(ctx)
		cs.mu.Lock()
		cs.leasing, cs.lease = nil, l
		if err != nil && ctx.Err() == nil {
			// An engine before leases, or a session not allowed them.
			cs.noLease = time.Now().Add(leaseRetry)
			cs.log.Debug("no channel lease; creating request channels instead", "error", err)
		}
		cs.mu.Unlock()
		close(done)
		if err != nil {
			return nil
		}
	}
}

// Open gives the request its two channels: minted under the lease, or
// created (createbatch.go) when there is none.
func (cs *ClientStreams) Open(ctx context.Context, body []byte) (RequestStreams, error) {
	l := cs.currentLease(ctx)
	if l == nil {
		return cs.create(ctx, body)
	}
	s := &clientStreams{cs: cs, lease: l, body: body, rctx: ctx, openAt: time.Now().Add(openResponseAfter)}
	cs.mu.Lock()
	s.counter = cs.next
	cs.next += 2
	cs.live[s.counter] = s
	start := !cs.watching
	cs.watching = true
	cs.mu.Unlock()
	if start {
		go cs.watch()
	}
	s.reqR, s.resW = l.RefPair(client.MintEnd{Counter: s.counter, Served: true, Direction: protocol.DirectionRead},
		client.MintEnd{Counter: s.counter + 1, Direction: protocol.DirectionWrite})
	return s, nil
}

// watch runs while requests with minted channels are in flight (and once
// more after the last ends): each engine::channels::watch call retires
// every counter minted so far but those of requests in flight, and waits
// up to watchWait for functions opening request bodies, which it then
// serves. It also opens the response of each request that has run for
// openResponseAfter (a timer per request would cost every request that
// ends sooner, nearly all, a timer armed and stopped).
func (cs *ClientStreams) watch() {
	for {
		cs.mu.Lock()
		// Every counter minted so far is retired but those of requests in
		// flight (two each); with more of them than one call may name, all
		// under the oldest in flight.
		below, except := cs.next, make([]uint64, 0, 2*len(cs.live))
		now, wait := time.Now(), watchWait
		for n, s := range cs.live {
			except = append(except, n, n+1)
			if !s.opening.Load() {
				if d := s.openAt.Sub(now); d <= 0 {
					s.openResponse()
				} else {
					wait = min(wait, d)
				}
			}
		}
		if len(except) > client.MaxWatchExcept {
			for n := range cs.live {
				below = min(below, n)
			}
			except = nil
		}
		idle := len(cs.live) == 0
		if idle && below == cs.retired {
			cs.watching = false
			cs.mu.Unlock()
			return
		}
		cs.mu.Unlock()
		if idle {
			wait = 0
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait+30*time.Second)
		opened, err := cs.c.WatchChannels(ctx, below, except, wait)
		cancel()
		cs.mu.Lock()
		if err != nil {
			// The lease went with its connection (a reconnect; the engine
			// removed its channels), or the engine stops: what was in
			// flight is moot, and the next request leases anew.
			cs.log.Debug("watching the request channels", "error", err)
			cs.lease, cs.retired = nil, below
			cs.mu.Unlock()
			if !idle {
				time.Sleep(watchWait) // not a tight loop of failing calls
			}
			continue
		}
		cs.retired = below
		for _, n := range except {
			cs.retired = min(cs.retired, n)
		}
		for _, id := range opened {
			m, ok := protocol.ParseMintedID(id)
			if s := cs.live[m.Counter]; ok && s != nil && s.reqR.ChannelID == id {
				s.serveBody()
			}
		}
		cs.mu.Unlock()
	}
}

// create opens the request's channels without a lease: created in one
// call, shared with other requests' under load (createbatch.go); a body
// too large to create the request_body channel with is written through
// its writer socket, starting now.
func (cs *ClientStreams) create(ctx context.Context, body []byte) (RequestStreams, error) {
	select {
	case cs.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for earlier requests' channels to be dropped: %w", ctx.Err())
	}
	filled := len(body) <= client.MaxChannelContent
	pairs, owned, err := cs.creates.channels(ctx, client.ChannelSpec{Filled: filled, Content: body})
	if err != nil {
		if owned {
			cs.release(1)
		}
		return nil, fmt.Errorf("create the request's channels: %w", err)
	}
	s := &clientStreams{cs: cs, reqR: pairs[0].Reader, resW: pairs[1].Writer, resR: pairs[1].Reader, rctx: ctx}
	if !filled {
		s.writeBody(pairs[0].Writer, body)
	}
	s.early = time.AfterFunc(openResponseAfter, s.openResponse)
	return s, nil
}

type clientStreams struct {
	cs               *ClientStreams
	reqR, resW, resR protocol.StreamChannelRef
	rctx             context.Context // the request's
	// octx is what the worker's ends live in: as long as the request, not
	// as the call that opened them. Made only for a request that opens an
	// end (endsContext): most open none.
	ctxOnce sync.Once
	octx    context.Context
	cancel  context.CancelFunc
	early   *time.Timer // created channels: opens response after openResponseAfter
	openAt  time.Time   // minted: when the watch loop opens response

	// Minted channels (lease non-nil): the request's counter (request_body;
	// response is the next; reqR and resW carry their ids), and the body to
	// serve.
	lease   *client.ChannelLease
	counter uint64
	body    []byte
	serving bool // under cs.mu: the body is being written, or was

	openOnce sync.Once
	opening  atomic.Bool   // the read end of response is being (or was) opened
	opened   chan struct{} // made when opening begins; closed once it is open, or failed to
	reader   *client.ChannelReader
	openErr  error
	wrote    chan struct{} // closed once the body's writer is done; nil: none started
	once     sync.Once
}

// endsContext makes octx, once.
func (s *clientStreams) endsContext() {
	s.ctxOnce.Do(func() {
		s.octx, s.cancel = context.WithCancel(context.WithoutCancel(s.rctx))
	})
}

func (s *clientStreams) Refs() (protocol.StreamChannelRef, protocol.StreamChannelRef) {
	return s.reqR, s.resW
}

// serveBody writes the body through request_body's writer end, whose
// reader the function opened; cs.mu is held.
func (s *clientStreams) serveBody() {
	if s.serving {
		return
	}
	s.serving = true
	s.writeBody(s.lease.Ref(s.reqR.ChannelID, protocol.DirectionWrite), s.body)
}

// writeBody writes body through the writer end ref and closes it, in the
// background; Close waits for it.
func (s *clientStreams) writeBody(ref protocol.StreamChannelRef, body []byte) {
	s.endsContext()
	s.wrote = make(chan struct{})
	go func() {
		defer close(s.wrote)
		w, err := s.cs.c.OpenChannelWriter(s.octx, ref)
		if err != nil {
			s.cs.log.Debug("open a request body's channel", "error", err)
			return
		}
		_, _ = w.WriteContext(s.octx, body)
		_ = w.Close()
	}()
}

// openResponse dials the worker's read end of the response channel, once,
// in the background.
func (s *clientStreams) openResponse() {
	s.openOnce.Do(func() {
		s.endsContext()
		ref := s.resR
		if s.lease != nil {
			ref = s.lease.Ref(s.resW.ChannelID, protocol.DirectionRead)
		}
		s.opened = make(chan struct{})
		s.opening.Store(true)
		go func() {
			defer close(s.opened)
			s.reader, s.openErr = s.cs.c.OpenChannelReader(s.octx, ref)
		}()
	})
}

func (s *clientStreams) Response(ctx context.Context) (MessageReader, error) {
	s.openResponse()
	select {
	case <-s.opened:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if s.openErr != nil {
		return nil, s.openErr
	}
	return s.reader, nil
}

func (s *clientStreams) Close() {
	s.once.Do(func() {
		if s.early != nil {
			s.early.Stop()
		}
		var wrote chan struct{}
		if s.lease != nil {
			// Retired by the next watch call once older requests ended:
			// that ends whatever still runs on either channel (a function
			// still writing its response, a body nobody reads), as a drop.
			s.cs.mu.Lock()
			delete(s.cs.live, s.counter)
			wrote = s.wrote // no body is served after this
			s.cs.mu.Unlock()
		} else {
			// Dropping ends whatever still runs on either channel; it goes
			// out in the background, batched with other requests'.
			s.cs.drops.add(s.reqR, s.resR)
			wrote = s.wrote
		}
		s.openOnce.Do(func() {}) // too late for the timer to open it now
		if s.cancel != nil {
			s.cancel()
		}
		if s.opening.Load() {
			<-s.opened
			if s.reader != nil {
				_ = s.reader.Close()
			}
		}
		if wrote != nil {
			<-wrote
		}
	})
}

// dropQueue drops requests' channels in the background: refs queue up
// while a drop call is in flight and go out together in the next one; once
// the engine has answered, release gives the requests' slots back. No
// goroutine outlives an empty queue.
type dropQueue struct {
	c       *client.Client
	log     hclog.Logger
	release func(requests int)

	mu       sync.Mutex
	refs     []protocol.StreamChannelRef
	requests int // whose refs are queued
	running  bool
}

// add queues one request's channels.
func (q *dropQueue) add(refs ...protocol.StreamChannelRef) {
	q.mu.Lock()
	q.refs = append(q.refs, refs...)
	q.requests++
	if q.running {
		q.mu.Unlock()
		return
	}
	q.running = true
	q.mu.Unlock()
	go q.flush()
}

func (q *dropQueue) flush() {
	for {
		q.mu.Lock()
		batch, requests := q.refs, q.requests
		q.refs, q.requests = nil, 0
		if len(batch) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := q.c.DropChannels(ctx, batch...); err != nil {
			// They go with the connection, or with the engine's TTL; their
			// slots are given back all the same, or the worker would stall:
			// the engine's LIMIT_EXCEEDED is then what a request meets.
			q.log.Debug("drop requests' channels", "count", len(batch), "error", err)
		}
		cancel()
		q.release(requests)
	}
}

// streamControl is a text message on the response channel.
type streamControl struct {
	Type       string          `json:"type"`
	StatusCode int             `json:"status_code"`
	Headers    json.RawMessage `json:"headers"`
}

// streamResponse answers from the response channel: status and headers
// from its text messages until the first body bytes, then the body. Each
// wait for a message is bounded by idle (default_timeout); nothing at all
// within it answers 504.
func (w *Worker) streamResponse(ctx context.Context, rw http.ResponseWriter, st RequestStreams, idle time.Duration, route string) {
	status, started := http.StatusOK, false
	start := func() {
		if !started {
			started = true
			rw.WriteHeader(status)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, idle)
	r, err := st.Response(wctx)
	cancel()
	if err != nil {
		w.callFailed(rw, wctx, "the response channel of "+route, err, CodeTimeout)
		return
	}
	flusher, _ := rw.(http.Flusher)
	for {
		mctx, cancel := context.WithTimeout(ctx, idle)
		m, err := r.ReadMessage(mctx)
		timedOut := mctx.Err() == context.DeadlineExceeded
		cancel()
		if errors.Is(err, io.EOF) {
			start()
			return
		}
		if err != nil {
			if started {
				// The status is out: all that is left is to cut the body.
				w.log.Debug("streamed response ended early", "route", route, "error", err)
				panic(http.ErrAbortHandler)
			}
			if timedOut {
				writeError(rw, http.StatusGatewayTimeout, CodeTimeout, route+" returned a streaming response (null) and wrote nothing within default_timeout")
				return
			}
			if ctx.Err() != nil {
				return // the client went away
			}
			writeError(rw, http.StatusInternalServerError, CodeInternal, "reading the streamed response of "+route+": "+err.Error())
			return
		}
		if !m.Text {
			start()
			if _, err := rw.Write(m.Data); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
			continue
		}
		if started {
			w.log.Warn("a streamed response set its status or headers after the body began; ignored", "route", route)
			continue
		}
		if err := applyControl(rw.Header(), &status, m.Data); err != nil {
			w.log.Warn("ignoring a malformed message on a response channel", "route", route, "error", err)
		}
	}
}

// applyControl applies one set_status / set_headers message.
func applyControl(h http.Header, status *int, data []byte) error {
	if len(data) > maxStreamHeaders {
		return fmt.Errorf("a control message of %d bytes (at most %d)", len(data), maxStreamHeaders)
	}
	var c streamControl
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("not a JSON control message: %v", err)
	}
	switch c.Type {
	case "set_status":
		if c.StatusCode < 100 || c.StatusCode > 999 {
			return fmt.Errorf("set_status %d is not an HTTP status", c.StatusCode)
		}
		*status = c.StatusCode
		return nil
	case "set_headers":
		if len(bytes.TrimSpace(c.Headers)) == 0 {
			return errors.New("set_headers without headers")
		}
		return addHeaders(h, c.Headers)
	default:
		return fmt.Errorf("unknown control message type %s", strconv.Quote(c.Type))
	}
}
