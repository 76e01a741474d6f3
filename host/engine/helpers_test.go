package engine

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/protocol"
)

// waitFor bounds every wait in these tests. It is a hang guard, not a
// timing assertion.
const waitFor = 10 * time.Second

type testEngine struct {
	*Engine
	srv *httptest.Server
	url string // ws://127.0.0.1:port
}

// testAdminToken is the engine token of startEngine's engines unless the
// test sets its own.
const testAdminToken = "test-admin-token"

func startEngine(t *testing.T, opts Options) *testEngine {
	t.Helper()
	if opts.AdminToken == nil {
		opts.AdminToken = func() string { return testAdminToken }
	}
	e := New(opts)
	srv := httptest.NewServer(e.Handler())
	te := &testEngine{Engine: e, srv: srv, url: "ws" + strings.TrimPrefix(srv.URL, "http")}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		assert.NilError(t, e.Close(ctx))
		srv.Close()
	})
	return te
}

type inbound struct {
	f   frame
	raw []byte
}

// frame is a decoded inbound frame, kept generic so tests see exactly what
// went over the wire.
type frame map[string]any

func (f frame) typ() string { s, _ := f["type"].(string); return s }
func (f frame) str(k string) string {
	s, _ := f[k].(string)
	return s
}
func (f frame) obj(k string) frame {
	m, _ := f[k].(map[string]any)
	return frame(m)
}

// rawClient is a worker that speaks raw frames.
type rawClient struct {
	t        *testing.T
	c        *websocket.Conn
	in       chan inbound
	closed   chan struct{}
	closeErr error
	workerID string
	token    string
	// hello is the engine's greeting, every field as sent.
	hello frame
}

func (te *testEngine) dial(t *testing.T) *rawClient {
	t.Helper()
	return te.dialWith(t, nil)
}

// dialAdmin connects with the engine token.
func (te *testEngine) dialAdmin(t *testing.T) *rawClient {
	t.Helper()
	return te.dialWith(t, http.Header{"Authorization": {"Bearer " + testAdminToken}})
}

func (te *testEngine) dialWith(t *testing.T, h http.Header) *rawClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, _, err := websocket.Dial(ctx, te.url, &websocket.DialOptions{HTTPHeader: h})
	assert.NilError(t, err)
	c.SetReadLimit(readLimit)
	rc := &rawClient{t: t, c: c, in: make(chan inbound, 4096), closed: make(chan struct{})}
	go rc.readLoop()
	t.Cleanup(func() {
		_ = c.CloseNow()
		deadline := time.After(waitFor)
		for {
			select {
			case <-rc.in: // unblock the read loop if nobody consumed
			case <-rc.closed:
				return
			case <-deadline:
				t.Errorf("the read loop of worker %s did not end within %s of closing its socket", rc.workerID, waitFor)
				return
			}
		}
	})
	hello := rc.expect("workerregistered")
	rc.hello = hello
	rc.workerID, rc.token = hello.str("worker_id"), hello.str("reattach_token")
	assert.Assert(t, rc.workerID != "" && rc.token != "")
	return rc
}

func (rc *rawClient) readLoop() {
	defer close(rc.closed)
	for {
		_, b, err := rc.c.Read(context.Background())
		if err != nil {
			rc.closeErr = err
			return
		}
		var f frame
		if err := json.Unmarshal(b, &f); err != nil {
			rc.t.Errorf("engine sent a frame that is not JSON: %q", b)
			continue
		}
		rc.in <- inbound{f: f, raw: b}
	}
}

func (rc *rawClient) sendRaw(s string) {
	rc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	assert.NilError(rc.t, rc.c.Write(ctx, websocket.MessageText, []byte(s)))
}

func (rc *rawClient) send(m protocol.Message) {
	rc.t.Helper()
	b, err := protocol.Encode(m)
	assert.NilError(rc.t, err)
	rc.sendRaw(string(b))
}

// next returns the next frame, failing the test if none comes.
func (rc *rawClient) next() frame {
	rc.t.Helper()
	select {
	case m := <-rc.in:
		return m.f
	case <-rc.closed:
		// Frames read before the close are still queued; they come first.
		select {
		case m := <-rc.in:
			return m.f
		default:
		}
		rc.t.Fatalf("connection closed while waiting for a frame: %v", rc.closeErr)
	case <-time.After(waitFor):
		rc.t.Fatal("no frame arrived")
	}
	return nil
}

func (rc *rawClient) nextRaw() []byte {
	rc.t.Helper()
	select {
	case m := <-rc.in:
		return m.raw
	case <-rc.closed:
		select {
		case m := <-rc.in:
			return m.raw
		default:
		}
		rc.t.Fatalf("connection closed while waiting for a frame: %v", rc.closeErr)
	case <-time.After(waitFor):
		rc.t.Fatal("no frame arrived")
	}
	return nil
}

func (rc *rawClient) expect(typ string) frame {
	rc.t.Helper()
	f := rc.next()
	assert.Equal(rc.t, f.typ(), typ, "frame: %v", f)
	return f
}

// sync proves every earlier frame has been handled and nothing was sent in
// between: the engine answers frames in order, so the pong must be next.
func (rc *rawClient) sync() {
	rc.t.Helper()
	rc.sendRaw(`{"type":"ping"}`)
	rc.expect("pong")
}

// waitClosed waits for the engine to close the connection.
func (rc *rawClient) waitClosed() error {
	rc.t.Helper()
	for {
		select {
		case <-rc.in:
		case <-rc.closed:
			return rc.closeErr
		case <-time.After(waitFor):
			rc.t.Fatal("connection was not closed")
			return nil
		}
	}
}

// register sends a void engine::workers::register with the given fields.
func (rc *rawClient) register(fields map[string]any) {
	rc.t.Helper()
	data, err := json.Marshal(fields)
	assert.NilError(rc.t, err)
	rc.send(&protocol.InvokeFunction{FunctionID: FnWorkersRegister, Data: data, Action: &protocol.TriggerAction{Type: protocol.ActionVoid}})
}

// registerFn registers a function and settles the namespace in ns, then
// makes sure the engine has applied both.
func (rc *rawClient) registerIn(ns, name string, fnIDs ...string) {
	rc.t.Helper()
	for _, id := range fnIDs {
		rc.send(&protocol.RegisterFunction{ID: id, Description: "test " + id})
	}
	fields := map[string]any{"name": name, "runtime": "test"}
	if ns != "" {
		fields["namespace"] = ns
	}
	rc.register(fields)
	rc.sync()
}

// call invokes a function and returns the invocationresult frame. Other
// frames arriving meanwhile fail the test.
func (rc *rawClient) call(id, fn string, ns *string, data string) frame {
	rc.t.Helper()
	m := &protocol.InvokeFunction{InvocationID: id, FunctionID: fn, Namespace: ns}
	if data != "" {
		m.Data = json.RawMessage(data)
	}
	rc.send(m)
	f := rc.expect("invocationresult")
	assert.Equal(rc.t, f.str("invocation_id"), id)
	return f
}

func ptr[T any](v T) *T { return &v }

// serveEcho answers every invocation with {"echo": data}, until the
// connection ends.
func (rc *rawClient) serveEcho() {
	go func() {
		for {
			select {
			case m := <-rc.in:
				f := m.f
				if f.typ() != "invokefunction" || f.str("invocation_id") == "" {
					continue
				}
				out, _ := json.Marshal(map[string]any{"echo": f["data"]})
				b := appendResultFrame(nil, f.str("invocation_id"), f.str("function_id"), out, nil, "", "")
				if rc.c.Write(context.Background(), websocket.MessageText, b) != nil {
					return
				}
			case <-rc.closed:
				return
			}
		}
	}()
}

func errBody(t *testing.T, f frame) (code, message string) {
	t.Helper()
	e := f.obj("error")
	assert.Assert(t, e != nil, "expected an error in %v", f)
	return e.str("code"), e.str("message")
}

func mustJSON(t testing.TB, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	assert.NilError(t, err)
	return b
}

// httpStatus dials a URL over plain HTTP with WebSocket upgrade headers and
// returns the status, to see refusals that happen before the upgrade.
func httpStatus(t *testing.T, url string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, nil)
	if err == nil {
		_ = c.CloseNow()
		return http.StatusSwitchingProtocols
	}
	assert.Assert(t, resp != nil, "dial error without response: %v", err)
	return resp.StatusCode
}

func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if cond() {
			return poll.Success()
		}
		return poll.Continue("%s", what)
	}, poll.WithTimeout(waitFor), poll.WithDelay(5*time.Millisecond))
}

// serve exposes e over a loopback HTTP server; the caller closes both.
func serve(t *testing.T, e *Engine) (wsURL string, stop func()) {
	t.Helper()
	srv := httptest.NewServer(e.Handler())
	return "ws" + strings.TrimPrefix(srv.URL, "http"), srv.Close
}

// conn returns the engine side of the socket worker workerID.
func (te *testEngine) conn(t *testing.T, workerID string) *wsConn {
	t.Helper()
	te.workersMu.RLock()
	defer te.workersMu.RUnlock()
	w := te.workers[workerID]
	assert.Assert(t, w != nil && w.conn != nil, "no socket worker %s", workerID)
	return w.conn
}
