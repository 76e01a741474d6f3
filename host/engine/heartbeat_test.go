package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/protocol"
)

// fleetOrAdapter heartbeats what the router's trust rules do: fleet
// host functions and a remote adapter's adapter::info.
func fleetOrAdapter(id string) bool {
	return strings.HasSuffix(id, "::adapter::info") || strings.Contains(id, "::host::")
}

// linkProxy forwards TCP to the engine and can be cut the way a pulled
// cable or `ip link set down` cuts a link: bytes stop flowing both ways,
// nobody sees a FIN or a RST.
type linkProxy struct {
	ln   net.Listener
	mu   sync.Mutex
	down chan struct{} // closed while the link is up; replaced by cut
	up   bool
}

func startLinkProxy(t *testing.T, target string) *linkProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	p := &linkProxy{ln: ln, down: make(chan struct{}), up: true}
	close(p.down)
	var conns []net.Conn
	var connsMu sync.Mutex
	t.Cleanup(func() {
		_ = ln.Close()
		p.heal()
		connsMu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		connsMu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			connsMu.Lock()
			conns = append(conns, c, s)
			connsMu.Unlock()
			go p.pipe(s, c)
			go p.pipe(c, s)
		}
	}()
	return p
}

// pipe copies src to dst, holding every chunk while the link is down.
func (p *linkProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.down
			p.mu.Unlock()
			<-gate
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = dst.Close()
			}
			return
		}
	}
}

func (p *linkProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.up {
		p.down, p.up = make(chan struct{}), false
	}
}

func (p *linkProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.up {
		close(p.down)
		p.up = true
	}
}

// A sandbox host (or a single remote adapter) behind a link that goes
// silent loses its functions within a few heartbeats (so the router can
// answer S301 at once), while a host that answers pings keeps them, and a
// worker that serves no sandboxes is never pinged.
func TestHostHeartbeatCutsSilentHost(t *testing.T) {
	te := startEngine(t, Options{})
	installGuard(t, te, &testGuard{heartbeat: fleetOrAdapter})
	te.SetHostHeartbeat(50 * time.Millisecond)
	proxy := startLinkProxy(t, strings.TrimPrefix(te.srv.URL, "http://"))
	proxied := &testEngine{Engine: te.Engine, srv: te.srv, url: "ws://" + proxy.ln.Addr().String()}

	const fleetFn = "sandbox-x::host::h1::sandbox::exec"
	host := proxied.dialWith(t, http.Header{"Authorization": {"Bearer " + testAdminToken}})
	host.registerIn("", "sandbox-x-h1", fleetFn)
	const adapterFn = "sandbox-y::adapter::info"
	single := proxied.dialAdmin(t)
	single.registerIn("", "sandbox-y", adapterFn)
	plain := proxied.dialAdmin(t)
	plain.registerIn("", "plain-worker", "plain::echo")
	registered := func(id string) bool { return len(te.FunctionIDs(DefaultNamespace, id)) == 1 }
	assert.Assert(t, registered(fleetFn) && registered(adapterFn))

	// Ten heartbeats with the link up: the host answers and stays.
	time.Sleep(500 * time.Millisecond)
	assert.Assert(t, registered(fleetFn), "a host that answers pings was dropped")

	proxy.cut()
	cutAt := time.Now()
	pollUntil(t, "the silent host's fleet function to go", func() bool { return !registered(fleetFn) })
	pollUntil(t, "the silent remote adapter's function to go", func() bool { return !registered(adapterFn) })
	t.Logf("silent host dropped %v after the cut (heartbeat 50 ms)", time.Since(cutAt).Round(time.Millisecond))
	// The plain worker, silent too, is not pinged and keeps its function.
	assert.Assert(t, registered("plain::echo"), "a worker without fleet functions was dropped by the host heartbeat")
}

// A host whose pong cannot come back because it is busy sending a large
// frame is alive: while its bytes keep arriving the heartbeat keeps it;
// once it falls silent it is cut as any silent host.
func TestHostHeartbeatKeepsSendingHost(t *testing.T) {
	te := startEngine(t, Options{})
	installGuard(t, te, &testGuard{heartbeat: fleetOrAdapter})
	te.SetHostHeartbeat(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	// A bare client that never reads, so it answers no ping.
	c, _, err := websocket.Dial(ctx, te.url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + testAdminToken}}})
	assert.NilError(t, err)
	defer c.CloseNow()
	const fleetFn = "sandbox-x::host::h1::sandbox::exec"
	for _, m := range []protocol.Message{
		&protocol.RegisterFunction{ID: fleetFn},
		&protocol.InvokeFunction{FunctionID: FnWorkersRegister, Data: json.RawMessage(`{"name":"sandbox-x-h1"}`), Action: &protocol.TriggerAction{Type: protocol.ActionVoid}},
	} {
		b, err := protocol.Encode(m)
		assert.NilError(t, err)
		assert.NilError(t, c.Write(ctx, websocket.MessageText, b))
	}
	registered := func() bool { return len(te.FunctionIDs(DefaultNamespace, fleetFn)) == 1 }
	pollUntil(t, "the host's fleet function", registered)

	// Twenty heartbeats' worth of one large frame, a chunk at a time.
	w, err := c.Writer(ctx, websocket.MessageText)
	assert.NilError(t, err)
	_, err = w.Write([]byte(`{"type":"ping","pad":"`))
	assert.NilError(t, err)
	for range 50 {
		_, err = w.Write(bytes.Repeat([]byte("x"), 2048))
		assert.NilError(t, err)
		time.Sleep(20 * time.Millisecond)
		assert.Assert(t, registered(), "a host still sending was cut")
	}
	// Silent now, mid-frame: cut within a few heartbeats.
	stoppedAt := time.Now()
	pollUntil(t, "the silent host's fleet function to go", func() bool { return !registered() })
	t.Logf("silent host dropped %v after it stopped sending (heartbeat 50 ms)", time.Since(stoppedAt).Round(time.Millisecond))
}
