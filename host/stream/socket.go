package stream

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/iii-sandbox/iii/internal/loopback"
)

// hub is the set of open stream connections.
type hub struct {
	mu     sync.RWMutex
	conns  map[*conn]struct{}
	active int // admitted handlers, upgraded or not
	closed bool
	wg     sync.WaitGroup // one per connection handler

	queued queuedTotal   // bytes waiting for all clients (outqueue.go)
	syncs  chan struct{} // join syncs being built, syncLanes
}

func (h *hub) init() { h.conns = map[*conn]struct{}{}; h.syncs = make(chan struct{}, syncLanes) }

// admit reserves a connection slot; false when the hub is closed or full.
func (h *hub) admit(limit int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || h.active >= limit {
		return false
	}
	h.active++
	h.wg.Add(1)
	return true
}

// release gives back admit's slot.
func (h *hub) release() {
	h.mu.Lock()
	h.active--
	h.mu.Unlock()
	h.wg.Done()
}

func (h *hub) add(c *conn) {
	h.mu.Lock()
	h.conns[c] = struct{}{}
	h.mu.Unlock()
}

func (h *hub) remove(c *conn) {
	h.mu.Lock()
	delete(h.conns, c)
	h.mu.Unlock()
}

// count is the number of admitted connections.
func (h *hub) count() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.active
}

// close refuses new connections, ends the open ones and waits for their
// handlers.
func (h *hub) close() {
	h.mu.Lock()
	h.closed = true
	for c := range h.conns {
		c.cancel()
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// broadcast queues ev once for every subscription that covers it (as
// upstream: a client with two matching subscriptions gets it twice).
func (h *hub) broadcast(ev *Event) {
	var frame []byte
	h.mu.RLock()
	defer h.mu.RUnlock()
	for c := range h.conns {
		n := c.matches(ev)
		if n == 0 {
			continue
		}
		if frame == nil {
			var err error
			if frame, err = json.Marshal(ev); err != nil {
				return
			}
		}
		for range n {
			c.enqueue(frame)
		}
	}
}

// conn is one stream socket connection.
type conn struct {
	ws      *websocket.Conn
	cancel  context.CancelFunc
	authCtx json.RawMessage // the auth function's context, or nil
	out     chan *outItem
	q       queue

	mu   sync.Mutex
	subs map[string]ClientMessage
}

func (c *conn) matches(ev *Event) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.subs {
		if s.StreamName == ev.StreamName && s.GroupID == ev.GroupID && (s.ItemID == nil || (ev.ID != nil && *s.ItemID == *ev.ID)) {
			n++
		}
	}
	return n
}

// enqueue queues a frame without blocking: when the queue is full the
// oldest undelivered frame is dropped (upstream's channel_size rule). Its
// bytes are capped too (outqueue.go): past them the client is closed.
func (c *conn) enqueue(frame []byte) { c.enqueueSync("", frame) }

// enqueueSync is enqueue for subscription sub's sync ("" for any other
// message): it replaces the sync that subscription still waits for.
func (c *conn) enqueueSync(sub string, frame []byte) {
	it := &outItem{data: frame, sub: sub}
	if !c.q.admit(it) {
		return
	}
	for {
		select {
		case c.out <- it:
			return
		default:
		}
		select {
		case old := <-c.out:
			c.q.take(old)
		default:
		}
	}
}

// serveHTTP admits, authenticates and upgrades one client, then serves it
// until it leaves or the worker closes.
func (w *Worker) serveHTTP(rw http.ResponseWriter, r *http.Request) {
	if w.loopback && !loopback.Host(r.Host) {
		// A page that rebinds its own name to 127.0.0.1 passes the origin
		// check (its Origin matches its Host); the Host gives it away.
		http.Error(rw, "this stream socket answers only Host 127.0.0.1, localhost or [::1]", http.StatusForbidden)
		return
	}
	if !w.hub.admit(w.limits.Connections) {
		http.Error(rw, "the stream socket is at its connection limit or closing; try again later", http.StatusServiceUnavailable)
		return
	}
	defer w.hub.release()
	var authCtx json.RawMessage
	if w.cfg.AuthFunction != "" {
		var err error
		if authCtx, err = w.authenticate(r); err != nil {
			w.log.Info("stream connection refused by the auth function", "addr", r.RemoteAddr, "auth_function", w.cfg.AuthFunction, "error", err)
			http.Error(rw, "unauthorized", http.StatusUnauthorized)
			return
		}
	} else if why := w.refuseOtherUser(r); why != "" {
		w.log.Info("stream connection refused: another user's process", "addr", r.RemoteAddr, "reason", why)
		http.Error(rw, "unauthorized: "+why, http.StatusUnauthorized)
		return
	}
	// The default origin check stays on: a web page from another origin
	// cannot open the socket through a visitor's browser.
	ws, err := websocket.Accept(rw, r, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(w.limits.FrameBytes)
	w.serveConn(ws, authCtx)
}

// authenticate calls auth_function with the upgrade request and returns
// the context it answers. Anything but an object is a refusal.
func (w *Worker) authenticate(r *http.Request) (json.RawMessage, error) {
	headers := map[string]string{}
	for k, vs := range r.Header {
		headers[strings.ToLower(k)] = strings.Join(vs, ", ")
	}
	query := map[string][]string(r.URL.Query())
	in, err := json.Marshal(map[string]any{"headers": headers, "path": r.URL.Path, "query_params": query, "addr": r.RemoteAddr})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(w.ctx, callTimeout)
	defer cancel()
	res, err := w.eng.Invoke(ctx, "", w.cfg.AuthFunction, in)
	if err != nil {
		return nil, err
	}
	var out struct {
		Context json.RawMessage `json:"context"`
	}
	if err := json.Unmarshal(res, &out); err != nil || !strings.HasPrefix(strings.TrimSpace(string(res)), "{") {
		return nil, errors.New("the auth function did not answer an object {context}")
	}
	return out.Context, nil
}

// errTooManySubscriptions ends a connection that joins past the limit.
var errTooManySubscriptions = errors.New("too many subscriptions on one connection")

func (w *Worker) serveConn(ws *websocket.Conn, authCtx json.RawMessage) {
	ctx, cancel := context.WithCancel(w.ctx)
	c := &conn{ws: ws, cancel: cancel, authCtx: authCtx, out: make(chan *outItem, w.cfg.ChannelSize), subs: map[string]ClientMessage{}}
	c.q.total = &w.hub.queued
	c.q.closeFn = func(status websocket.StatusCode, reason string) {
		w.log.Warn("stream client closed: it does not read what waits for it", "reason", reason)
		c.q.release(c.out)
		_ = ws.Close(status, reason)
		cancel()
	}
	w.hub.add(c)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		defer cancel()
		for {
			select {
			case <-ctx.Done():
				return
			case it := <-c.out:
				frame := c.q.take(it)
				if frame == nil {
					continue // replaced by a re-join, or dropped
				}
				wctx, wcancel := context.WithTimeout(ctx, writeTimeout)
				err := ws.Write(wctx, websocket.MessageText, frame)
				wcancel()
				if err != nil {
					return
				}
			}
		}
	}()
	status, reason := websocket.StatusNormalClosure, ""
	for {
		_, data, err := ws.Read(ctx)
		if err != nil {
			break // closed, gone, or over the frame limit (the library closes with 1009)
		}
		msg, err := ParseClientMessage(data, w.limits.IDBytes)
		if err != nil {
			if !errors.Is(err, errEmptyMessage) {
				w.log.Debug("stream message ignored", "error", err)
			}
			continue
		}
		if err := w.handle(ctx, c, msg); err != nil {
			status, reason = websocket.StatusPolicyViolation, err.Error()
			break
		}
	}
	w.hub.remove(c)
	if status == websocket.StatusPolicyViolation {
		// Before cancel: cancelling the context of the last Read can make
		// the library drop the connection before the close frame is out,
		// and the client would see EOF instead of the reason.
		_ = ws.Close(status, reason)
	}
	cancel()
	<-writerDone
	_ = ws.CloseNow()
	c.q.release(c.out)
	w.leaveAll(c)
}

// handle applies one join or leave.
func (w *Worker) handle(ctx context.Context, c *conn, m ClientMessage) error {
	ev := JoinLeave{SubscriptionID: m.SubscriptionID, StreamName: m.StreamName, GroupID: m.GroupID, ID: m.ItemID, Context: c.authCtx}
	if m.Type == "leave" {
		// Only a held subscription leaves (upstream calls the leave
		// triggers for any id a client names).
		c.mu.Lock()
		_, held := c.subs[m.SubscriptionID]
		delete(c.subs, m.SubscriptionID)
		c.mu.Unlock()
		if held {
			w.joinLeave(ctx, TriggerLeave, ev)
		}
		return nil
	}
	c.mu.Lock()
	_, replacing := c.subs[m.SubscriptionID]
	full := !replacing && len(c.subs) >= w.limits.SubscriptionsPerConnection
	c.mu.Unlock()
	if full {
		return errTooManySubscriptions
	}
	now := time.Now().UnixMilli()
	if w.joinLeave(ctx, TriggerJoin, ev) {
		frame, _ := json.Marshal(&Event{Type: "stream", Timestamp: now, StreamName: m.StreamName, GroupID: m.GroupID, ID: m.ItemID, Event: unauthorizedEvent})
		c.enqueue(frame)
		return nil
	}
	c.mu.Lock()
	c.subs[m.SubscriptionID] = m
	c.mu.Unlock()
	if c.q.closing() {
		return nil // closed for what waits for it: build nothing more
	}
	var data json.RawMessage
	var err error
	select {
	case w.hub.syncs <- struct{}{}:
	case <-ctx.Done():
		return nil
	}
	if m.ItemID != nil {
		data, err = w.getItem(ctx, w.lw.Caller(), m.StreamName, m.GroupID, *m.ItemID)
	} else {
		data, err = w.listGroup(ctx, w.lw.Caller(), m.StreamName, m.GroupID)
	}
	if err != nil {
		<-w.hub.syncs
		w.log.Warn("stream sync failed", "stream", m.StreamName, "group", m.GroupID, "error", err)
		return nil
	}
	frame, _ := json.Marshal(&Event{Type: "stream", Timestamp: now, StreamName: m.StreamName, GroupID: m.GroupID, ID: m.ItemID, Event: dataEvent("sync", data)})
	<-w.hub.syncs
	c.enqueueSync(m.SubscriptionID, frame)
	return nil
}

// leaveAll fires the leave triggers of a closed connection's subscriptions
// (not when the worker itself is closing).
func (w *Worker) leaveAll(c *conn) {
	c.mu.Lock()
	subs := make([]ClientMessage, 0, len(c.subs))
	for _, s := range c.subs {
		subs = append(subs, s)
	}
	c.subs = nil
	c.mu.Unlock()
	for _, s := range subs {
		if w.ctx.Err() != nil {
			return
		}
		w.joinLeave(w.ctx, TriggerLeave, JoinLeave{SubscriptionID: s.SubscriptionID, StreamName: s.StreamName, GroupID: s.GroupID, ID: s.ItemID, Context: c.authCtx})
	}
}
