// Package enginebench sets up the paths the engine's latency and throughput
// are measured on, together with their floors built from the same WebSocket
// library over the same loopback, so every figure can be printed beside what
// the transport alone costs:
//
//   - Engine: caller → engine → echo worker → engine → caller (P1, P3).
//   - Relay: caller → a relay that forwards frames without parsing them →
//     echo peer → relay → caller (the two-hop floor).
//   - Echo: caller → echo peer → caller (the one-hop floor).
//
// The caller is the same in all three: it writes an invokefunction frame and
// matches the answer by invocation_id, so only the middle differs.
package enginebench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/rbac"
	"github.com/iii-sandbox/iii/protocol"
)

// Kind names a measured path.
type Kind string

// The measured paths.
const (
	// Engine: callers connect without a token, so every call passes the
	// permission check (an open session: denials, then privilege).
	Engine Kind = "engine"
	// EngineAdmin: callers present the engine token, which skips the
	// permission check: the figure without it.
	EngineAdmin Kind = "engine-admin"
	// EngineRBAC: callers connect through a listener with an rbac block
	// (expose_functions rules, no auth function): the full RBAC decision
	// on every call.
	EngineRBAC Kind = "engine-rbac"
	Relay      Kind = "relay"
	Echo       Kind = "echo"
)

// benchToken is the engine token of the engines the benchmarks start.
const benchToken = "bench-token"

const echoFunction = "bench::echo"

// Setup is one running path with its callers' connections.
type Setup struct {
	kind    Kind
	closers []func()
	callers []*Caller
	next    atomic.Uint64
	payload json.RawMessage
}

// Options shape a Setup.
type Options struct {
	Kind    Kind
	Conns   int    // caller connections; 0 = 1
	Payload []byte // invocation data; nil = a small object
}

// Start brings a path up on loopback. Close it when done.
func Start(ctx context.Context, opts Options) (*Setup, error) {
	if opts.Conns <= 0 {
		opts.Conns = 1
	}
	if opts.Payload == nil {
		opts.Payload = []byte(`{"message":"hello","n":42}`)
	}
	s := &Setup{kind: opts.Kind, payload: opts.Payload}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()

	echoURL, err := s.serve(http.HandlerFunc(echoPeer))
	if err != nil {
		return nil, err
	}
	var target string
	switch opts.Kind {
	case Echo:
		target = echoURL
	case Relay:
		if target, err = s.serve(relayHandler(echoURL)); err != nil {
			return nil, err
		}
	case Engine, EngineAdmin, EngineRBAC:
		e := engine.New(engine.Options{AdminToken: func() string { return benchToken }})
		s.closers = append(s.closers, func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = e.Close(cctx)
		})
		if target, err = s.serve(e.Handler()); err != nil {
			return nil, err
		}
		w, err := startEchoWorker(ctx, target)
		if err == nil && opts.Kind == EngineRBAC {
			target, err = s.serve(e.HandlerFor(engine.ListenerPolicy{Name: "bench-rbac", LoopbackHostOnly: true,
				RBAC: &rbac.Config{ExposeFunctions: []rbac.Filter{{Match: "other::*"}, {Match: "bench::*"}}}}))
		}
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, w.close)
		if err := waitRegistered(ctx, e); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown kind %q", opts.Kind)
	}
	for range opts.Conns {
		c, err := dialCaller(ctx, target, opts.Kind)
		if err != nil {
			return nil, err
		}
		s.callers = append(s.callers, c)
	}
	ok = true
	return s, nil
}

// serve starts a loopback HTTP server for h and returns its ws:// URL.
func (s *Setup) serve(h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	s.closers = append(s.closers, func() {
		_ = srv.Close()
		<-done
	})
	return "ws://" + ln.Addr().String(), nil
}

// Close stops everything Start started, callers first.
func (s *Setup) Close() {
	for _, c := range s.callers {
		c.close()
	}
	s.callers = nil
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// RoundTrip makes one call on the next caller connection (round robin) and
// waits for its answer.
func (s *Setup) RoundTrip(ctx context.Context) error {
	n := s.next.Add(1)
	c := s.callers[n%uint64(len(s.callers))]
	return c.call(ctx, n, s.payload)
}

// Caller is a client connection that may carry many calls at once.
type Caller struct {
	c       *websocket.Conn
	mu      sync.Mutex
	waiters map[string]chan error
	done    chan struct{}
	engine  bool
}

func dialCaller(ctx context.Context, url string, kind Kind) (*Caller, error) {
	toEngine := kind == Engine || kind == EngineAdmin || kind == EngineRBAC
	var h http.Header
	if kind == EngineAdmin {
		h = http.Header{"Authorization": {"Bearer " + benchToken}}
	}
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", url, err)
	}
	c.SetReadLimit(64 << 20)
	cl := &Caller{c: c, waiters: make(map[string]chan error), done: make(chan struct{}), engine: toEngine}
	go cl.readLoop()
	return cl, nil
}

func (cl *Caller) close() {
	_ = cl.c.CloseNow()
	<-cl.done
}

var idKey = []byte(`"invocation_id":"`)

// frameID finds the invocation id without decoding the frame: the caller's
// cost must be the same on every path.
func frameID(b []byte) string {
	i := bytes.Index(b, idKey)
	if i < 0 {
		return ""
	}
	rest := b[i+len(idKey):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return ""
	}
	return string(rest[:j])
}

func (cl *Caller) readLoop() {
	defer close(cl.done)
	for {
		_, b, err := cl.c.Read(context.Background())
		if err != nil {
			cl.mu.Lock()
			for id, w := range cl.waiters {
				w <- err
				delete(cl.waiters, id)
			}
			cl.mu.Unlock()
			return
		}
		if cl.engine && !bytes.Contains(b[:min(len(b), 40)], []byte(`"invocationresult"`)) {
			continue // workerregistered and the like
		}
		id := frameID(b)
		cl.mu.Lock()
		w := cl.waiters[id]
		delete(cl.waiters, id)
		cl.mu.Unlock()
		if w != nil {
			var err error
			if bytes.Contains(b, []byte(`"error":{`)) {
				err = fmt.Errorf("call failed: %s", b)
			}
			w <- err
		}
	}
}

func (cl *Caller) call(ctx context.Context, n uint64, payload json.RawMessage) error {
	id := "b" + strconv.FormatUint(n, 36)
	frame := make([]byte, 0, 96+len(payload))
	frame = append(frame, `{"type":"invokefunction","invocation_id":"`...)
	frame = append(frame, id...)
	frame = append(frame, `","function_id":"`+echoFunction+`","data":`...)
	frame = append(frame, payload...)
	frame = append(frame, '}')
	w := make(chan error, 1)
	cl.mu.Lock()
	cl.waiters[id] = w
	cl.mu.Unlock()
	if err := cl.c.Write(ctx, websocket.MessageText, frame); err != nil {
		return err
	}
	select {
	case err := <-w:
		return err
	case <-ctx.Done():
		cl.mu.Lock()
		delete(cl.waiters, id)
		cl.mu.Unlock()
		return ctx.Err()
	}
}

// echoPeer sends every frame back unchanged: the floors' far end.
func echoPeer(rw http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(rw, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(64 << 20)
	for {
		typ, b, err := c.Read(context.Background())
		if err != nil {
			return
		}
		if c.Write(context.Background(), typ, b) != nil {
			return
		}
	}
}

// relayHandler forwards frames between each client and its own connection
// to the echo peer, without looking inside them.
func relayHandler(upstream string) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(rw, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(64 << 20)
		u, _, err := websocket.Dial(r.Context(), upstream, nil)
		if err != nil {
			return
		}
		defer u.CloseNow()
		u.SetReadLimit(64 << 20)
		pipe := func(from, to *websocket.Conn) {
			for {
				typ, b, err := from.Read(context.Background())
				if err != nil {
					return
				}
				if to.Write(context.Background(), typ, b) != nil {
					return
				}
			}
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			pipe(u, c)
			_ = c.CloseNow()
		}()
		pipe(c, u)
		_ = u.CloseNow()
		<-done
	})
}

// echoWorker is a worker on the engine that answers bench::echo with its
// input. Like the floors' echo peer it does not run a JSON decoder over the
// frame (it finds the id and the data span by their fixed place in the
// engine's frames), so P1 compares the engine, not a worker's JSON library,
// against the floor.
type echoWorker struct {
	c    *websocket.Conn
	done chan struct{}
}

func startEchoWorker(ctx context.Context, url string) (*echoWorker, error) {
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		return nil, fmt.Errorf("dial engine: %w", err)
	}
	c.SetReadLimit(64 << 20)
	w := &echoWorker{c: c, done: make(chan struct{})}
	for _, m := range []protocol.Message{
		&protocol.RegisterFunction{ID: echoFunction},
		&protocol.InvokeFunction{FunctionID: engine.FnWorkersRegister, Data: json.RawMessage(`{"name":"bench-echo","runtime":"go"}`),
			Action: &protocol.TriggerAction{Type: protocol.ActionVoid}},
	} {
		b, err := protocol.Encode(m)
		if err != nil {
			return nil, err
		}
		if err := c.Write(ctx, websocket.MessageText, b); err != nil {
			return nil, err
		}
	}
	go w.serve()
	return w, nil
}

var dataKey = []byte(`,"data":`)

func (w *echoWorker) serve() {
	defer close(w.done)
	for {
		_, b, err := w.c.Read(context.Background())
		if err != nil {
			return
		}
		id := frameID(b)
		i := bytes.Index(b, dataKey)
		if id == "" || i < 0 || !bytes.HasPrefix(b, []byte(`{"type":"invokefunction"`)) {
			continue
		}
		// The engine writes data last unless trace or metadata fields
		// follow; bench calls carry none.
		data := b[i+len(dataKey) : len(b)-1]
		out := make([]byte, 0, 96+len(data))
		out = append(out, `{"type":"invocationresult","invocation_id":"`...)
		out = append(out, id...)
		out = append(out, `","function_id":"`+echoFunction+`","result":`...)
		out = append(out, data...)
		out = append(out, '}')
		if w.c.Write(context.Background(), websocket.MessageText, out) != nil {
			return
		}
	}
}

func (w *echoWorker) close() {
	_ = w.c.CloseNow()
	<-w.done
}

func waitRegistered(ctx context.Context, e *engine.Engine) error {
	for {
		_, err := e.Invoke(ctx, "", engine.FnFunctionsInfo, json.RawMessage(`{"function_id":"`+echoFunction+`"}`))
		if err == nil {
			return nil
		}
		var eb *protocol.ErrorBody
		if !errors.As(err, &eb) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}
