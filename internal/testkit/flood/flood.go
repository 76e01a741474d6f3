// Package flood attacks a real engine process the way a hostile worker
// would — huge frames, unread channel writes, a registration flood, a
// connection flood — while a well-behaved worker keeps calling, and
// reports what each offender got, the well-behaved worker's latencies and
// the engine's peak memory. tests/flood asserts on the report;
// scripts/bench/flood prints it beside the quiet-time floor.
package flood

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/protocol"
)

// Engine is a running engine process: bin/iii with a bare config.yaml in
// its own HOME.
type Engine struct {
	cmd *exec.Cmd
	URL string
	Dir string // its HOME and working directory
	// StreamURL is the iii-stream socket, when StartWith ran it.
	StreamURL string
	logs      bytes.Buffer
	done      chan struct{}
}

// Start runs iii (the binary's path) on a free loopback port in dir.
func Start(ctx context.Context, iii, dir string) (*Engine, error) {
	return StartWith(ctx, iii, dir, false)
}

// StartWith is Start, with the iii-stream worker (in memory, on a free
// port of its own) when stream is set.
func StartWith(ctx context.Context, iii, dir string, stream bool) (*Engine, error) {
	iii, err := filepath.Abs(iii)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cfg := fmt.Sprintf("workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\n", port)
	e := &Engine{URL: fmt.Sprintf("ws://127.0.0.1:%d", port), Dir: dir, done: make(chan struct{})}
	if stream {
		sp, err := freePort()
		if err != nil {
			return nil, err
		}
		cfg += fmt.Sprintf("  - name: iii-stream\n    config: { host: 127.0.0.1, port: %d, adapter: { name: kv, config: { store_method: in_memory } } }\n", sp)
		e.StreamURL = fmt.Sprintf("ws://127.0.0.1:%d", sp)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	e.cmd = exec.Command(iii, "-c", filepath.Join(dir, "config.yaml"))
	e.cmd.Dir = dir
	e.cmd.Env = append(os.Environ(), "HOME="+dir)
	e.cmd.Stdout, e.cmd.Stderr = &e.logs, &e.logs
	// Stop's wait after a kill is bounded even if a child of the engine
	// still holds its output.
	e.cmd.WaitDelay = 5 * time.Second
	if err := e.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = e.cmd.Wait(); close(e.done) }()
	addrs := []string{fmt.Sprintf("127.0.0.1:%d", port)}
	if e.StreamURL != "" {
		addrs = append(addrs, strings.TrimPrefix(e.StreamURL, "ws://"))
	}
	for {
		c, err := net.Dial("tcp", addrs[0])
		if err == nil {
			c.Close()
			if addrs = addrs[1:]; len(addrs) == 0 {
				return e, nil
			}
			continue
		}
		select {
		case <-e.done:
			return nil, fmt.Errorf("the engine exited: %s", e.logs.String())
		case <-ctx.Done():
			e.Stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop interrupts the engine and waits for it (killing it after 15 s).
func (e *Engine) Stop() {
	_ = e.cmd.Process.Signal(os.Interrupt)
	select {
	case <-e.done:
	case <-time.After(15 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.done
	}
}

// Logs is what the engine wrote so far (its log), the last n bytes.
func (e *Engine) Logs(n int) string {
	s := e.logs.String()
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// PeakRSSMiB is the engine process's high-water resident memory.
func (e *Engine) PeakRSSMiB() (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", e.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return kb / 1024, err
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}

// Phase is what the well-behaved worker saw during one flood, and what the
// offender got.
type Phase struct {
	Name      string
	Calls     int
	Failures  []string
	P50, P99  time.Duration
	Offender  string // what the offender got, in words
	PeakRSS   int    // MiB, the engine's high-water mark at the phase's end
	Violation string // "" when the offender got what the engine documents
}

// Prober is a well-behaved worker and caller: it serves good::echo and
// calls it in a loop, recording each call's latency and any failure.
type Prober struct {
	mu        sync.Mutex
	latencies []time.Duration
	failures  []string
	stop      chan struct{}
	done      chan struct{}
	clients   []*client.Client
}

// StartProber connects the well-behaved worker and starts calling.
func StartProber(ctx context.Context, url string) (*Prober, error) {
	p := &Prober{stop: make(chan struct{}), done: make(chan struct{})}
	srv, err := client.Dial(ctx, url, client.Options{Name: "good-worker", IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}})
	if err != nil {
		return nil, err
	}
	p.clients = append(p.clients, srv)
	if _, err := srv.RegisterFunction(client.FunctionDef{ID: "good::echo"}, func(_ context.Context, inv *client.Invocation) (any, error) {
		return map[string]json.RawMessage{"echo": inv.Data}, nil
	}); err != nil {
		p.closeClients()
		return nil, err
	}
	caller, err := client.Dial(ctx, url, client.Options{Name: "good-caller", IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}, CallTimeout: 20 * time.Second})
	if err != nil {
		p.closeClients()
		return nil, err
	}
	p.clients = append(p.clients, caller)
	go func() {
		defer close(p.done)
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			default:
			}
			start := time.Now()
			cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			out, err := caller.Call(cctx, "good::echo", map[string]int{"n": i})
			cancel()
			p.mu.Lock()
			if err != nil || !bytes.Contains(out, []byte(`"n":`+strconv.Itoa(i))) {
				// A call that has not been registered yet is not a failure.
				if !(i == 0 && err != nil) {
					p.failures = append(p.failures, fmt.Sprintf("call %d: %v %s", i, err, out))
				}
			} else {
				p.latencies = append(p.latencies, time.Since(start))
			}
			p.mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return p, nil
}

// Take returns and resets what the prober recorded: the latencies of the
// calls that completed, sorted, and the failures.
func (p *Prober) Take() ([]time.Duration, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	lat, fails := p.latencies, p.failures
	p.latencies, p.failures = nil, nil
	slices.Sort(lat)
	return lat, fails
}

// Close stops calling and disconnects.
func (p *Prober) Close() {
	close(p.stop)
	<-p.done
	p.closeClients()
}

func (p *Prober) closeClients() {
	for _, c := range p.clients {
		_ = c.Close(context.Background())
	}
}

func percentile(sorted []time.Duration, q int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*q/100)]
}

// Run measures a quiet phase, then each flood in turn.
func Run(ctx context.Context, e *Engine, p *Prober) ([]Phase, error) {
	var phases []Phase
	record := func(name string, flood func() (string, string)) {
		p.Take()
		offender, violation := flood()
		lat, fails := p.Take()
		rss, _ := e.PeakRSSMiB()
		phases = append(phases, Phase{Name: name, Calls: len(lat), Failures: fails, P50: percentile(lat, 50), P99: percentile(lat, 99),
			Offender: offender, Violation: violation, PeakRSS: rss})
	}
	record("quiet", func() (string, string) { time.Sleep(time.Second); return "", "" })
	record("large frames", func() (string, string) { return largeFrames(ctx, e.URL) })
	record("unread channel writes", func() (string, string) { return unreadChannel(ctx, e.URL) })
	record("registrations", func() (string, string) { return registrations(ctx, e.URL) })
	record("connections", func() (string, string) { return connections(ctx, e.URL) })
	return phases, ctx.Err()
}

func dial(ctx context.Context, url string) (*websocket.Conn, error) {
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(64 << 20)
	return c, nil
}

// largeFrames: four connections send two 63 MiB frames each (calls to a
// function nobody has, each answered function_not_found once read), then
// one connection sends a frame over the 64 MiB limit, which must close it
// with 1009.
func largeFrames(ctx context.Context, url string) (string, string) {
	payload := bytes.Repeat([]byte("a"), 63<<20)
	var wg sync.WaitGroup
	var answered atomic.Int32
	var errs sync.Map
	for i := range 4 {
		c, err := dial(ctx, url)
		if err != nil {
			return "", "dial: " + err.Error()
		}
		defer c.CloseNow()
		wg.Go(func() {
			for j := range 2 {
				frame := fmt.Appendf(nil, `{"type":"invokefunction","invocation_id":"big-%d-%d","function_id":"nobody::here","data":"`, i, j)
				frame = append(append(frame, payload...), `"}`...)
				if err := c.Write(ctx, websocket.MessageText, frame); err != nil {
					errs.Store(i, err)
					return
				}
			}
			for got := 0; got < 2; {
				_, data, err := c.Read(ctx)
				if err != nil {
					errs.Store(i, err)
					return
				}
				if bytes.Contains(data, []byte(protocol.CodeFunctionNotFound)) {
					got++
					answered.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := answered.Load(); n != 8 {
		var first error
		errs.Range(func(_, v any) bool { first = v.(error); return false })
		return "", fmt.Sprintf("%d of 8 large frames were answered (%v)", n, first)
	}
	over, err := dial(ctx, url)
	if err != nil {
		return "", "dial: " + err.Error()
	}
	defer over.CloseNow()
	_ = over.Write(ctx, websocket.MessageText, append(bytes.Repeat([]byte(" "), 64<<20), '{', '}'))
	for err == nil {
		_, _, err = over.Read(ctx)
	}
	if websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
		return "", fmt.Sprintf("the sender of an oversized frame was not closed with 1009: %v", err)
	}
	return "8 × 63 MiB answered function_not_found; a 64 MiB + 2 B frame closed its sender with 1009", ""
}

// unreadChannel writes 12 × 32 MiB into a channel nobody reads: the engine
// must hold the writer back, not buffer it all.
func unreadChannel(ctx context.Context, url string) (string, string) {
	c, err := client.Dial(ctx, url, client.Options{Name: "chan-flood", IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}})
	if err != nil {
		return "", err.Error()
	}
	defer c.Close(context.Background())
	out, err := c.Call(ctx, "engine::channels::create", map[string]any{"buffer_size": 1024})
	if err != nil {
		return "", err.Error()
	}
	var refs struct {
		Writer protocol.StreamChannelRef `json:"writer"`
	}
	if err := json.Unmarshal(out, &refs); err != nil {
		return "", err.Error()
	}
	w, err := dial(ctx, fmt.Sprintf("%s/ws/channels/%s?key=%s&dir=write", url, refs.Writer.ChannelID, refs.Writer.AccessKey))
	if err != nil {
		return "", err.Error()
	}
	defer w.CloseNow()
	chunk := bytes.Repeat([]byte("c"), 32<<20)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	written := 0
	for range 12 {
		if err := w.Write(wctx, websocket.MessageBinary, chunk); err != nil {
			break
		}
		written++
	}
	if written == 12 {
		return "", "the engine buffered all 12 unread 32 MiB writes"
	}
	return fmt.Sprintf("the writer got %d of 12 × 32 MiB onto the socket, then was held back", written), ""
}

// registrations sends 200,000 registerfunction frames on one connection:
// it must get LIMIT_EXCEEDED and be closed.
func registrations(ctx context.Context, url string) (string, string) {
	c, err := dial(ctx, url)
	if err != nil {
		return "", err.Error()
	}
	defer c.CloseNow()
	var buf bytes.Buffer
	sent := 0
	for ; sent < 200_000; sent++ {
		buf.Reset()
		fmt.Fprintf(&buf, `{"type":"registerfunction","id":"flood::f%d"}`, sent)
		if c.Write(ctx, websocket.MessageText, buf.Bytes()) != nil {
			break
		}
	}
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			return "", fmt.Sprintf("closed after %d frames without LIMIT_EXCEEDED: %v", sent, err)
		}
		if bytes.Contains(data, []byte(`"LIMIT_EXCEEDED"`)) {
			return fmt.Sprintf("LIMIT_EXCEEDED and closed; %d of 200,000 frames got onto the socket", sent), ""
		}
	}
}

// connections opens 2,000 connections: those past the listener's cap must
// get 503.
func connections(ctx context.Context, url string) (string, string) {
	var conns []*websocket.Conn
	defer func() {
		for _, c := range conns {
			_ = c.CloseNow()
		}
	}()
	refused := 0
	for range 2000 {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, resp, err := websocket.Dial(dctx, url, nil)
		cancel()
		if err != nil {
			if resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
				return "", fmt.Sprintf("a refused connection did not get 503: %v", err)
			}
			refused++
			continue
		}
		conns = append(conns, c)
	}
	if refused == 0 {
		return "", "all 2,000 connections were accepted"
	}
	return fmt.Sprintf("%d open, %d refused with 503 LIMIT_EXCEEDED", len(conns), refused), ""
}
