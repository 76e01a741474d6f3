// Package flood attacks a real engine process (bin/iii with a config.yaml)
// the way a hostile worker would: huge frames, unread channel writes, a
// registration flood, a connection flood. Throughout, a well-behaved
// worker's calls must keep succeeding, each offender must get its error,
// and the engine's peak RSS must stay under the bound docs/security.md
// documents.
package flood

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
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
	"testing"
	"time"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/protocol"
)

// RSSBoundMiB is the engine's documented peak resident memory under these
// floods (docs/security.md, "Limits"): its own baseline plus the inbound
// large-frame lanes (two frames of up to 64 MiB, each read in pieces and
// joined: 256 MiB) plus one channel's buffer and the sockets.
const RSSBoundMiB = 512

var testBins *bins.Set

func TestMain(m *testing.M) {
	var err error
	testBins, err = bins.New("iii-flood-", map[string]string{"iii": "github.com/iii-sandbox/iii/cmd/iii"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(testBins.Main(m))
}

type engineProc struct {
	cmd  *exec.Cmd
	url  string
	home string
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startEngine runs bin/iii with a bare config.yaml in its own HOME.
func startEngine(t *testing.T) *engineProc {
	t.Helper()
	iii := testBins.Path(t, "iii")
	dir := t.TempDir()
	port := freePort(t)
	cfg := fmt.Sprintf("workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\n", port)
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(cfg), 0o644))
	cmd := exec.Command(iii, "-c", filepath.Join(dir, "config.yaml"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+dir, "GODEBUG=gctrace=1")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	assert.NilError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("engine log (tail):\n%s", tail(logs.String(), 4000))
		}
	})
	ep := &engineProc{cmd: cmd, url: fmt.Sprintf("ws://127.0.0.1:%d", port), home: dir}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return poll.Continue("engine not listening yet: %v", err)
		}
		c.Close()
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(20*time.Millisecond))
	return ep
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// peakRSSMiB is the engine process's high-water resident memory.
func (ep *engineProc) peakRSSMiB(t *testing.T) int {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", ep.cmd.Process.Pid))
	assert.NilError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			assert.NilError(t, err)
			return kb / 1024
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}

// prober is a well-behaved worker and caller: it serves good::echo and
// calls it in a loop, recording each call's latency and any failure.
type prober struct {
	mu        sync.Mutex
	latencies []time.Duration
	failures  []string
	stop      chan struct{}
	done      chan struct{}
	engine    *engineProc
}

func startProber(t *testing.T, ep *engineProc) *prober {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := client.Dial(ctx, ep.url, client.Options{Name: "good-worker", IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}})
	assert.NilError(t, err)
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	_, err = srv.RegisterFunction(client.FunctionDef{ID: "good::echo"}, func(_ context.Context, inv *client.Invocation) (any, error) {
		return map[string]json.RawMessage{"echo": inv.Data}, nil
	})
	assert.NilError(t, err)
	caller, err := client.Dial(ctx, ep.url, client.Options{Name: "good-caller", IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}, CallTimeout: 20 * time.Second})
	assert.NilError(t, err)
	t.Cleanup(func() { _ = caller.Close(context.Background()) })
	p := &prober{stop: make(chan struct{}), done: make(chan struct{}), engine: ep}
	go func() {
		defer close(p.done)
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			default:
			}
			start := time.Now()
			cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
			out, err := caller.Call(cctx, "good::echo", map[string]int{"n": i})
			ccancel()
			p.mu.Lock()
			if err != nil || !bytes.Contains(out, []byte(`"n":`+strconv.Itoa(i))) {
				p.failures = append(p.failures, fmt.Sprintf("call %d: %v %s", i, err, out))
			} else {
				p.latencies = append(p.latencies, time.Since(start))
			}
			p.mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return p
}

// phase returns the calls made and failures seen since the last phase, and
// the p50 and p99 latency of its calls.
func (p *prober) phase(t *testing.T, name string) {
	t.Helper()
	p.mu.Lock()
	lat, fails := p.latencies, p.failures
	p.latencies, p.failures = nil, nil
	p.mu.Unlock()
	assert.Assert(t, len(fails) == 0, "%s: the well-behaved worker's calls failed: %v", name, fails)
	assert.Assert(t, len(lat) > 0, "%s: no call completed during the flood", name)
	slices.Sort(lat)
	t.Logf("%s: well-behaved worker: %d calls, p50 %v, p99 %v; engine peak RSS so far %d MiB", name, len(lat), lat[len(lat)/2], lat[len(lat)*99/100], p.engine.peakRSSMiB(t))
}

func (p *prober) close() {
	close(p.stop)
	<-p.done
}

func dial(ctx context.Context, t *testing.T, url string) *websocket.Conn {
	t.Helper()
	c, _, err := websocket.Dial(ctx, url, nil)
	assert.NilError(t, err)
	c.SetReadLimit(64 << 20)
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

func TestFloods(t *testing.T) {
	if testing.Short() {
		t.Skip("floods a real engine with hundreds of MiB; skipped with -short")
	}
	ep := startEngine(t)
	p := startProber(t, ep)
	defer p.close()
	time.Sleep(200 * time.Millisecond)
	p.phase(t, "quiet")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t.Run("large frames", func(t *testing.T) {
		// Four connections send two 63 MiB frames each: calls to a function
		// nobody has, each answered function_not_found once read. Then one
		// frame over the 64 MiB limit, which closes its sender with 1009.
		payload := bytes.Repeat([]byte("a"), 63<<20)
		var wg sync.WaitGroup
		var answered atomic.Int32
		for i := range 4 {
			c := dial(ctx, t, ep.url)
			wg.Go(func() {
				for j := range 2 {
					frame := fmt.Appendf(nil, `{"type":"invokefunction","invocation_id":"big-%d-%d","function_id":"nobody::here","data":"`, i, j)
					frame = append(append(frame, payload...), `"}`...)
					if err := c.Write(ctx, websocket.MessageText, frame); err != nil {
						t.Errorf("write a 63 MiB frame: %v", err)
						return
					}
				}
				for got := 0; got < 2; {
					_, data, err := c.Read(ctx)
					if err != nil {
						t.Errorf("connection %d: %v", i, err)
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
		assert.Equal(t, answered.Load(), int32(8), "every 63 MiB frame was read and answered")
		over := dial(ctx, t, ep.url)
		big := append(bytes.Repeat([]byte(" "), 64<<20), '{', '}')
		_ = over.Write(ctx, websocket.MessageText, big)
		var err error
		for err == nil {
			_, _, err = over.Read(ctx)
		}
		assert.Equal(t, websocket.CloseStatus(err), websocket.StatusMessageTooBig, "the sender of an oversized frame is closed with 1009: %v", err)
		p.phase(t, "large frames")
	})

	t.Run("unread channel writes", func(t *testing.T) {
		c, err := client.Dial(ctx, ep.url, client.Options{Name: "chan-flood", IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}})
		assert.NilError(t, err)
		defer c.Close(context.Background())
		out, err := c.Call(ctx, "engine::channels::create", map[string]any{"buffer_size": 1024})
		assert.NilError(t, err)
		var refs struct {
			Writer protocol.StreamChannelRef `json:"writer"`
		}
		assert.NilError(t, json.Unmarshal(out, &refs))
		w := dial(ctx, t, fmt.Sprintf("%s/ws/channels/%s?key=%s&dir=write", ep.url, refs.Writer.ChannelID, refs.Writer.AccessKey))
		chunk := bytes.Repeat([]byte("c"), 32<<20)
		// Nobody reads: the engine holds at most ChannelBufferBytes (16 MiB)
		// plus one message, and the writer is held back, not buffered.
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		written := 0
		for range 12 {
			if err := w.Write(wctx, websocket.MessageBinary, chunk); err != nil {
				break
			}
			written++
		}
		t.Logf("unread channel: the writer got %d of 12 × 32 MiB messages onto the socket before it was held back", written)
		assert.Assert(t, written < 12, "the engine buffered every unread write")
		p.phase(t, "unread channel writes")
	})

	t.Run("registrations", func(t *testing.T) {
		c := dial(ctx, t, ep.url)
		var buf bytes.Buffer
		var err error
		for i := 0; i < 200_000 && err == nil; i++ {
			buf.Reset()
			fmt.Fprintf(&buf, `{"type":"registerfunction","id":"flood::f%d"}`, i)
			err = c.Write(ctx, websocket.MessageText, buf.Bytes())
		}
		// The engine says why, then closes.
		var gotLimit bool
		for {
			_, data, rerr := c.Read(ctx)
			if rerr != nil {
				break
			}
			if bytes.Contains(data, []byte(`"LIMIT_EXCEEDED"`)) {
				gotLimit = true
			}
		}
		assert.Assert(t, gotLimit, "the registration flooder got LIMIT_EXCEEDED")
		p.phase(t, "registrations")
	})

	t.Run("connections", func(t *testing.T) {
		var conns []*websocket.Conn
		refused := 0
		for range 2000 {
			dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
			c, resp, err := websocket.Dial(dctx, ep.url, nil)
			dcancel()
			if err != nil {
				assert.Assert(t, resp != nil && resp.StatusCode == http.StatusServiceUnavailable, "a refused connection gets 503: %v", err)
				refused++
				continue
			}
			conns = append(conns, c)
		}
		t.Logf("connections: %d open, %d refused with 503 LIMIT_EXCEEDED", len(conns), refused)
		assert.Assert(t, refused > 0, "2,000 connections were all accepted")
		p.phase(t, "connections")
		for _, c := range conns {
			_ = c.CloseNow()
		}
	})

	rss := ep.peakRSSMiB(t)
	t.Logf("engine peak RSS through the floods: %d MiB (bound %d MiB)", rss, RSSBoundMiB)
	assert.Assert(t, rss < RSSBoundMiB, "engine peak RSS %d MiB is over the documented %d MiB", rss, RSSBoundMiB)
}
