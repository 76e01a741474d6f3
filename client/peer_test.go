package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/protocol"
)

// waitLimit bounds every wait of the scripted peer so a broken client fails
// the test instead of hanging it. It is a safety net, not a timing claim.
const waitLimit = 10 * time.Second

// peer is a scripted engine: each WebSocket the client opens on "/" is
// handed to the test, which greets it and plays the engine's side frame by
// frame. Paths under /ws/channels/ go to channelHandler when set.
type peer struct {
	t              testing.TB
	srv            *httptest.Server
	conns          chan *peerConn
	channelHandler http.HandlerFunc
	refuse         atomic.Bool // answer every later upgrade with HTTP 503

	mu  sync.Mutex
	all []*peerConn
}

func newPeer(t testing.TB) *peer {
	t.Helper()
	p := &peer{t: t, conns: make(chan *peerConn, 16)}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.shutdown)
	return p
}

func (p *peer) url() string { return "ws" + strings.TrimPrefix(p.srv.URL, "http") }

func (p *peer) shutdown() {
	p.mu.Lock()
	conns := append([]*peerConn(nil), p.all...)
	p.mu.Unlock()
	for _, pc := range conns {
		_ = pc.conn.CloseNow()
	}
	p.srv.Close()
}

func (p *peer) serve(w http.ResponseWriter, r *http.Request) {
	if p.refuse.Load() {
		http.Error(w, "gone", http.StatusServiceUnavailable)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/ws/channels/") && p.channelHandler != nil {
		p.channelHandler(w, r)
		return
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	conn.SetReadLimit(maxMessageSize)
	pc := &peerConn{conn: conn, frames: make(chan []byte, 256), closed: make(chan struct{})}
	p.mu.Lock()
	p.all = append(p.all, pc)
	p.mu.Unlock()
	p.conns <- pc
	// The handler holds the request until the socket ends, so the test
	// server's Close waits for it.
	defer close(pc.closed)
	for {
		_, data, err := conn.Read(context.Background())
		if err != nil {
			pc.readErr = err
			close(pc.frames)
			return
		}
		pc.frames <- data
	}
}

// accept returns the next connection the client opened.
func (p *peer) accept(t testing.TB) *peerConn {
	t.Helper()
	select {
	case pc := <-p.conns:
		return pc
	case <-time.After(waitLimit):
		t.Fatal("the client did not connect")
		return nil
	}
}

// peerConn is the engine's end of one client connection.
type peerConn struct {
	conn    *websocket.Conn
	frames  chan []byte
	closed  chan struct{}
	readErr error
}

func (pc *peerConn) sendRaw(t testing.TB, data string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	assert.NilError(t, pc.conn.Write(ctx, websocket.MessageText, []byte(data)))
}

func (pc *peerConn) send(t testing.TB, m protocol.Message) {
	t.Helper()
	data, err := protocol.Encode(m)
	assert.NilError(t, err)
	pc.sendRaw(t, string(data))
}

func (pc *peerConn) greet(t testing.TB, workerID, token string) {
	t.Helper()
	pc.send(t, &protocol.WorkerRegistered{WorkerID: workerID, ReattachToken: token})
}

// nextRaw returns the next frame the client sent.
func (pc *peerConn) nextRaw(t testing.TB) []byte {
	t.Helper()
	select {
	case data, ok := <-pc.frames:
		if !ok {
			t.Fatalf("the client closed the connection: %v", pc.readErr)
		}
		return data
	case <-time.After(waitLimit):
		t.Fatal("no frame from the client")
		return nil
	}
}

func (pc *peerConn) next(t testing.TB) protocol.Message {
	t.Helper()
	data := pc.nextRaw(t)
	m, err := protocol.Decode(data)
	assert.NilError(t, err, "frame %s", data)
	return m
}

// expect reads the next frame and asserts its type.
func expect[T protocol.Message](t testing.TB, pc *peerConn) T {
	t.Helper()
	m := pc.next(t)
	v, ok := m.(T)
	if !ok {
		var zero T
		t.Fatalf("got %T frame, want %T", m, zero)
	}
	return v
}

// expectRegister reads the void engine::workers::register and returns its
// metadata.
func expectRegister(t testing.TB, pc *peerConn) map[string]any {
	t.Helper()
	inv := expect[*protocol.InvokeFunction](t, pc)
	assert.Equal(t, inv.FunctionID, fnRegisterWorker)
	assert.Equal(t, inv.InvocationID, "")
	assert.Assert(t, inv.Action != nil && inv.Action.Type == protocol.ActionVoid)
	assert.Assert(t, inv.Namespace == nil, "engine::workers::register must not carry a namespace")
	var meta map[string]any
	assert.NilError(t, json.Unmarshal(inv.Data, &meta))
	return meta
}

// waitClosed waits until the client's side of pc is gone.
func (pc *peerConn) waitClosed(t testing.TB) {
	t.Helper()
	select {
	case <-pc.closed:
	case <-time.After(waitLimit):
		t.Fatal("the client did not close the connection")
	}
}

// dialResult is the outcome of an asynchronous Dial.
type dialResult struct {
	c   *Client
	err error
}

// dialAsync runs Dial on its own goroutine, since Dial returns only after
// the handshake the test is about to play.
func dialAsync(t testing.TB, u string, o Options) <-chan dialResult {
	t.Helper()
	ch := make(chan dialResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		c, err := Dial(ctx, u, o)
		ch <- dialResult{c, err}
	}()
	return ch
}

func waitDial(t testing.TB, ch <-chan dialResult) (*Client, error) {
	t.Helper()
	select {
	case r := <-ch:
		if r.c != nil {
			t.Cleanup(func() { closeClient(t, r.c) })
		}
		return r.c, r.err
	case <-time.After(waitLimit):
		t.Fatal("Dial did not return")
		return nil, nil
	}
}

func closeClient(t testing.TB, c *Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	assert.NilError(t, c.Close(ctx))
}

// testOptions are quiet options for scripted tests: no env, reconnects off
// unless a test turns them on.
func testOptions() Options {
	return Options{Name: "test-worker", IgnoreEnv: true, Reconnect: ReconnectPolicy{Disable: true}}
}

// connect dials p and plays a plain handshake, returning both ends.
func connect(t testing.TB, p *peer, o Options) (*Client, *peerConn) {
	t.Helper()
	ch := dialAsync(t, p.url(), o)
	pc := p.accept(t)
	pc.greet(t, "w-1", "tok-1")
	expectRegister(t, pc)
	c, err := waitDial(t, ch)
	assert.NilError(t, err)
	return c, pc
}

// callResult is the outcome of an asynchronous Call.
type callResult struct {
	res json.RawMessage
	err error
}

func callAsync(c *Client, fn string, payload any, opts ...CallOption) <-chan callResult {
	ch := make(chan callResult, 1)
	go func() {
		res, err := c.Call(context.Background(), fn, payload, opts...)
		ch <- callResult{res, err}
	}()
	return ch
}

func waitCall(t testing.TB, ch <-chan callResult) callResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(waitLimit):
		t.Fatal("Call did not return")
		return callResult{}
	}
}
