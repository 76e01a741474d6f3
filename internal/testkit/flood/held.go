package flood

// The floods of this file make the engine hold what a caller sends rather
// than read it through: calls nobody answers, registrations with huge
// descriptions, partial frames on the telemetry and channel sockets, and
// re-joins on the stream socket by a client that never reads. Each runs
// as an anonymous worker and as a VM worker would (with a scoped
// credential Compose issues it, presented on the handshake as the VM's
// gateway forward presents it).

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/protocol"
)

// Caller is who a flood speaks as: Token "" is an anonymous loopback
// worker, else the bearer credential; Namespace is where it registers and
// calls ("" for default).
type Caller struct {
	Name      string
	Token     string
	Namespace string
}

// Anonymous is a worker without a token.
var Anonymous = Caller{Name: "anonymous"}

// IssueVMCredential issues the credential Compose gives a VM worker of
// project ns (docs/security.md, "Revocation"), as the engine token's
// holder.
func IssueVMCredential(ctx context.Context, e *Engine, ns string) (Caller, error) {
	tok, err := os.ReadFile(filepath.Join(e.Dir, ".iii", "engine-token"))
	if err != nil {
		return Caller{}, err
	}
	admin, err := client.Dial(ctx, e.URL, client.Options{Name: "flood-admin", Token: strings.TrimSpace(string(tok)), IgnoreEnv: true,
		Reconnect: client.ReconnectPolicy{Disable: true}})
	if err != nil {
		return Caller{}, err
	}
	defer admin.Close(context.Background())
	out, err := admin.Call(ctx, "engine::credentials::issue", map[string]any{"label": "compose/" + ns + "/vm-worker", "namespace": ns,
		"allow": map[string][]string{"default": {"*"}}})
	if err != nil {
		return Caller{}, err
	}
	var res struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(out, &res); err != nil || res.Token == "" {
		return Caller{}, fmt.Errorf("engine::credentials::issue answered %s", out)
	}
	return Caller{Name: "VM worker credential", Token: res.Token, Namespace: ns}, nil
}

func (c Caller) header() http.Header {
	if c.Token == "" {
		return nil
	}
	return http.Header{"Authorization": {"Bearer " + c.Token}}
}

func (c Caller) nsField() string {
	if c.Namespace == "" {
		return ""
	}
	return fmt.Sprintf(`,"namespace":%q`, c.Namespace)
}

// dialAs opens a raw worker socket as c, declaring its namespace.
func dialAs(ctx context.Context, url string, c Caller) (*websocket.Conn, error) {
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: c.header()})
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(64 << 20)
	// Declaring the namespace at once applies registrations at once (no
	// grace time); a name of its own, as two live workers may not share one.
	ns := c.Namespace
	if ns == "" {
		ns = "default"
	}
	reg := fmt.Sprintf(`{"type":"invokefunction","invocation_id":"ns","function_id":"engine::workers::register","data":{"name":"flood-%s","namespace":%q}}`,
		rand.Text(), ns)
	if err := ws.Write(ctx, websocket.MessageText, []byte(reg)); err != nil {
		ws.CloseNow()
		return nil, err
	}
	return ws, nil
}

// reader counts the frames a raw socket receives that contain a code, and
// notes how it ended.
type reader struct {
	hits atomic.Int64
	n    atomic.Int64
	done chan struct{}
	err  error
}

func readAll(ws *websocket.Conn, code string) *reader {
	r := &reader{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			_, data, err := ws.Read(context.Background())
			if err != nil {
				r.err = err
				return
			}
			r.n.Add(1)
			if bytes.Contains(data, []byte(code)) {
				r.hits.Add(1)
			}
		}
	}()
	return r
}

// waitHits waits until r has seen n frames with its code, or d passes.
func (r *reader) waitHits(n int64, d time.Duration) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if r.hits.Load() >= n {
			return true
		}
		select {
		case <-r.done:
			return r.hits.Load() >= n
		case <-time.After(20 * time.Millisecond):
		}
	}
	return false
}

// UnansweredCalls: a worker registers a function and calls it without
// ever answering: 1,500 calls with a 1 MB invocation_id, then 6,000 with
// ordinary ids, then 200 with 1 MiB payloads. Every call with an id over
// limits.id_bytes, and every call past limits.inflight_per_connection or
// inflight_bytes_per_connection, must be answered LIMIT_EXCEEDED; once
// the worker leaves, the calls it left unanswered are released (a second
// round on a new connection gets as far as the first).
func UnansweredCalls(ctx context.Context, url string, as Caller) (string, string) {
	var got []string
	for round := range 2 {
		ws, err := dialAs(ctx, url, as)
		if err != nil {
			return "", "dial: " + err.Error()
		}
		rd := readAll(ws, `"LIMIT_EXCEEDED"`)
		send := func(frame []byte) error { return ws.Write(ctx, websocket.MessageText, frame) }
		// A function of its own each round: the last round's may still be
		// on its way out.
		sink := fmt.Sprint("flood::sink", round)
		if err := send(fmt.Appendf(nil, `{"type":"registerfunction","id":%q}`, sink)); err != nil {
			ws.CloseNow()
			return "", err.Error()
		}
		// Past the namespace grace the function is there for sure.
		time.Sleep(1500 * time.Millisecond)
		want := int64(0)
		if round == 0 {
			bigID := strings.Repeat("i", 1_000_000)
			for i := range 1500 {
				frame := fmt.Appendf(nil, `{"type":"invokefunction","invocation_id":"%s%d","function_id":%q%s,"data":{}}`, bigID, i, sink, as.nsField())
				if err := send(frame); err != nil {
					ws.CloseNow()
					return "", fmt.Sprintf("call %d with a 1 MB id: %v", i, err)
				}
			}
			want += 1500
			if !rd.waitHits(want, 60*time.Second) {
				ws.CloseNow()
				return "", fmt.Sprintf("%d of 1,500 calls with a 1 MB invocation_id were answered LIMIT_EXCEEDED", rd.hits.Load())
			}
		}
		for i := range 6000 {
			frame := fmt.Appendf(nil, `{"type":"invokefunction","invocation_id":"r%d-%d","function_id":%q%s,"data":{}}`, round, i, sink, as.nsField())
			if err := send(frame); err != nil {
				ws.CloseNow()
				return "", fmt.Sprintf("call %d: %v", i, err)
			}
		}
		// 4,096 in flight (the default); the rest refused.
		want += 6000 - 4096
		if !rd.waitHits(want, 60*time.Second) {
			ws.CloseNow()
			return "", fmt.Sprintf("round %d: %d calls refused, want %d (limits.inflight_per_connection)", round, rd.hits.Load(), want)
		}
		ws.CloseNow()
		<-rd.done
		got = append(got, fmt.Sprintf("round %d: %d refused LIMIT_EXCEEDED", round, rd.hits.Load()))
	}
	// Bytes: 1 MiB payloads, unanswered, on a fresh connection.
	ws, err := dialAs(ctx, url, as)
	if err != nil {
		return "", "dial: " + err.Error()
	}
	defer ws.CloseNow()
	rd := readAll(ws, `"LIMIT_EXCEEDED"`)
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"type":"registerfunction","id":"flood::sink-bytes"}`)); err != nil {
		return "", err.Error()
	}
	time.Sleep(1500 * time.Millisecond)
	payload := strings.Repeat("p", 1<<20)
	for i := range 200 {
		frame := fmt.Appendf(nil, `{"type":"invokefunction","invocation_id":"b%d","function_id":"flood::sink-bytes"%s,"data":"%s"}`, i, as.nsField(), payload)
		if err := ws.Write(ctx, websocket.MessageText, frame); err != nil {
			return "", fmt.Sprintf("payload call %d: %v", i, err)
		}
	}
	// 64 MiB of calls in flight (the default): about 63 pass.
	if !rd.waitHits(200-64, 60*time.Second) {
		return "", fmt.Sprintf("%d of 200 unanswered 1 MiB calls were refused (limits.inflight_bytes_per_connection)", rd.hits.Load())
	}
	got = append(got, fmt.Sprintf("1 MiB payloads: %d of 200 refused", rd.hits.Load()))
	return as.Name + ": " + strings.Join(got, "; "), ""
}

// BigRegistrations: 1,000 registerfunction, registertrigger and
// registertriggertype frames with 1 MB descriptions, schemas and configs
// on one connection must close it with LIMIT_EXCEEDED once its
// registrations hold limits.registration_bytes_per_connection; a 2 MiB one
// is refused alone (limits.registration_bytes); ten connections together
// meet the engine-wide cap and are refused, not held.
func BigRegistrations(ctx context.Context, url string, as Caller) (string, string) {
	desc := strings.Repeat("d", 1_000_000)
	frameOf := func(conn, i int) []byte {
		switch i % 3 {
		case 0:
			return fmt.Appendf(nil, `{"type":"registerfunction","id":"flood::c%d-f%d","description":"%s"}`, conn, i, desc)
		case 1:
			return fmt.Appendf(nil, `{"type":"registertriggertype","id":"flood-c%d-t%d","description":"x","trigger_request_format":{"d":"%s"}}`, conn, i, desc)
		default:
			return fmt.Appendf(nil, `{"type":"registertrigger","id":"flood-c%d-r%d","trigger_type":"flood-c%d-t%d","function_id":"flood::c%d-f%d","config":{"d":"%s"}}`,
				conn, i, conn, i-1, conn, i-3, desc)
		}
	}
	ws, err := dialAs(ctx, url, as)
	if err != nil {
		return "", "dial: " + err.Error()
	}
	defer ws.CloseNow()
	rd := readAll(ws, `"LIMIT_EXCEEDED"`)
	// One frame over limits.registration_bytes: refused, the socket stays.
	huge := fmt.Appendf(nil, `{"type":"registerfunction","id":"flood::huge","description":"%s"}`, strings.Repeat("h", 2<<20))
	if err := ws.Write(ctx, websocket.MessageText, huge); err != nil {
		return "", err.Error()
	}
	if !rd.waitHits(1, 20*time.Second) {
		return "", "a 2 MiB registerfunction was not refused LIMIT_EXCEEDED"
	}
	sent := 0
	for ; sent < 1000; sent++ {
		if ws.Write(ctx, websocket.MessageText, frameOf(0, sent)) != nil {
			break
		}
	}
	select {
	case <-rd.done:
	case <-time.After(30 * time.Second):
		return "", fmt.Sprintf("the connection stayed open after %d registrations of 1 MB", sent)
	}
	if rd.hits.Load() < 2 || websocket.CloseStatus(rd.err) != websocket.StatusPolicyViolation {
		return "", fmt.Sprintf("closed without LIMIT_EXCEEDED / 1008: %d hits, %v", rd.hits.Load(), rd.err)
	}
	first := fmt.Sprintf("%d of 1,000 1 MB registrations sent before LIMIT_EXCEEDED and 1008", sent)

	// Ten connections, each under its own cap: the engine-wide cap refuses
	// the rest without closing them.
	var wg sync.WaitGroup
	var refused atomic.Int64
	var failure atomic.Value
	for conn := 1; conn <= 10; conn++ {
		wg.Go(func() {
			ws, err := dialAs(ctx, url, as)
			if err != nil {
				failure.Store("dial: " + err.Error())
				return
			}
			defer ws.CloseNow()
			rd := readAll(ws, `"LIMIT_EXCEEDED"`)
			for i := range 15 {
				if err := ws.Write(ctx, websocket.MessageText, frameOf(conn, i)); err != nil {
					failure.Store(err.Error())
					return
				}
			}
			rd.waitHits(1, 5*time.Second)
			refused.Add(rd.hits.Load())
			// Hold the registrations while the others try.
			time.Sleep(3 * time.Second)
		})
	}
	wg.Wait()
	if f := failure.Load(); f != nil {
		return "", f.(string)
	}
	if refused.Load() == 0 {
		return "", "ten connections registered 150 MB and none was refused (the engine-wide cap)"
	}
	return fmt.Sprintf("%s: a 2 MiB registration refused; %s; ten connections × 15 MB: %d refused by the engine-wide cap", as.Name, first, refused.Load()), ""
}

// PartialFrames: connections to /otel and to channel writer sockets each
// send a 60 MiB frame header and then all of it but the last byte. The
// engine must not hold them (the telemetry socket drops what it reads, a
// channel's message counts against the engine's channel budget and the
// large-frame lanes) and must drop every such sender within the
// slow-consumer time.
func PartialFrames(ctx context.Context, url string, as Caller, conns int) (string, string) {
	c, err := client.Dial(ctx, url, client.Options{Name: "partial-frames", Token: as.Token, IgnoreEnv: true,
		Reconnect: client.ReconnectPolicy{Disable: true}})
	if err != nil {
		return "", err.Error()
	}
	defer c.Close(context.Background())
	var targets []string
	for range conns {
		targets = append(targets, url+"/otel")
		out, err := c.Call(ctx, "engine::channels::create", map[string]any{})
		if err != nil {
			return "", err.Error()
		}
		var refs struct {
			Writer protocol.StreamChannelRef `json:"writer"`
		}
		if err := json.Unmarshal(out, &refs); err != nil {
			return "", err.Error()
		}
		targets = append(targets, fmt.Sprintf("%s/ws/channels/%s?key=%s&dir=write", url, refs.Writer.ChannelID, refs.Writer.AccessKey))
	}
	const size = 60 << 20
	body := make([]byte, size-1)
	var wg sync.WaitGroup
	var dropped atomic.Int64
	var failure atomic.Value
	start := time.Now()
	for _, t := range targets {
		wg.Go(func() {
			conn, err := rawUpgrade(ctx, t, as.header())
			if err != nil {
				failure.Store(t + ": " + err.Error())
				return
			}
			defer conn.Close()
			// A 60 MiB binary frame, masked with a zero key.
			hdr := []byte{0x82, 0x80 | 127, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
			for i := range 8 {
				hdr[2+i] = byte(uint64(size) >> (56 - 8*i))
			}
			_ = conn.SetDeadline(time.Now().Add(90 * time.Second))
			if _, err := conn.Write(hdr); err != nil {
				failure.Store(t + ": " + err.Error())
				return
			}
			_, werr := conn.Write(body)
			// All but the last byte sent (or the engine stopped reading):
			// now the engine must drop the sender.
			buf := make([]byte, 4096)
			for {
				if _, err := conn.Read(buf); err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						failure.Store(fmt.Sprintf("%s: still open after %v (write: %v)", t, time.Since(start), werr))
						return
					}
					dropped.Add(1)
					return
				}
			}
		})
	}
	wg.Wait()
	if f := failure.Load(); f != nil {
		return "", f.(string)
	}
	return fmt.Sprintf("%s: %d × 60 MiB - 1 B partial frames on /otel and channel writers, all %d senders dropped within %v",
		as.Name, len(targets), dropped.Load(), time.Since(start).Round(time.Second)), ""
}

// rawUpgrade opens a WebSocket by hand, so the caller can write frames the
// library would not (a header promising more than is sent).
func rawUpgrade(ctx context.Context, wsURL string, h http.Header) (net.Conn, error) {
	u, err := url.Parse(wsURL)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, err
	}
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	req := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n",
		u.RequestURI(), u.Host, base64.StdEncoding.EncodeToString(key))
	for k, vs := range h {
		for _, v := range vs {
			req += k + ": " + v + "\r\n"
		}
	}
	if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	resp.Body.Close()
	_ = conn.SetReadDeadline(time.Time{})
	if resp.StatusCode != http.StatusSwitchingProtocols {
		conn.Close()
		return nil, fmt.Errorf("upgrade answered %s", resp.Status)
	}
	return conn, nil
}

// StreamRejoins fills a group with 10 MB, then a stream client that never
// reads joins it 120 times with one subscriptionId, and another 120 times
// with distinct ones. The engine must not queue a sync per join: a re-join
// replaces the sync still waiting, what waits for one client is capped,
// and a client past the cap is closed with 1008 LIMIT_EXCEEDED.
func StreamRejoins(ctx context.Context, e *Engine, as Caller) (string, string) {
	if e.StreamURL == "" {
		return "", "the engine runs no iii-stream"
	}
	// The group is filled by a local worker; the client that joins it is
	// the offender. (A VM worker reaches only the engine's port, not the
	// stream socket; its credential on the upgrade changes nothing there.)
	c, err := client.Dial(ctx, e.URL, client.Options{Name: "stream-filler", IgnoreEnv: true,
		Reconnect: client.ReconnectPolicy{Disable: true}})
	if err != nil {
		return "", err.Error()
	}
	defer c.Close(context.Background())
	value := strings.Repeat("v", 1_000_000)
	for i := range 10 {
		if _, err := c.Call(ctx, "stream::set", map[string]any{"stream_name": "flood", "group_id": "big", "item_id": fmt.Sprint("item-", i),
			"data": value}); err != nil {
			return "", "stream::set: " + err.Error()
		}
	}
	var got []string
	for _, distinct := range []bool{false, true} {
		ws, _, err := websocket.Dial(ctx, e.StreamURL, &websocket.DialOptions{HTTPHeader: as.header()})
		if err != nil {
			return "", "stream dial: " + err.Error()
		}
		ws.SetReadLimit(256 << 20)
		for i := range 120 {
			sub := "s"
			if distinct {
				sub = fmt.Sprint("s", i)
			}
			join := fmt.Sprintf(`{"type":"join","data":{"subscriptionId":%q,"streamName":"flood","groupId":"big"}}`, sub)
			if err := ws.Write(ctx, websocket.MessageText, []byte(join)); err != nil {
				break // closed for its queue already
			}
		}
		// Never read while the joins are served; then read what is there.
		// One subscription's client does not read for longer than the
		// engine waits on a write to it (10 s): it must be closed, having
		// been sent a sync or two, not 120.
		// Past its cap a client is closed with a close frame that can
		// only follow the sync being written; the engine waits 5 s for it
		// to go out, so the client reads again within that.
		if distinct {
			time.Sleep(4 * time.Second)
		} else {
			time.Sleep(15 * time.Second)
		}
		syncs := 0
		var rerr error
		for {
			// A client that reads gets what waits for it; 10 s of
			// silence means nothing more is coming.
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, _, rerr = ws.Read(rctx)
			cancel()
			if rerr != nil {
				break
			}
			syncs++
		}
		ws.CloseNow()
		timedOut := errors.Is(rerr, context.DeadlineExceeded)
		if distinct {
			if timedOut || websocket.CloseStatus(rerr) != websocket.StatusPolicyViolation || !strings.Contains(rerr.Error(), "LIMIT_EXCEEDED") {
				return "", fmt.Sprintf("120 joins of a 10 MB group by a client that does not read: not closed 1008 LIMIT_EXCEEDED: %v (%d syncs)", rerr, syncs)
			}
			got = append(got, fmt.Sprintf("120 distinct joins: closed 1008 LIMIT_EXCEEDED after %d syncs", syncs))
		} else {
			if syncs > 3 {
				return "", fmt.Sprintf("120 re-joins with one subscriptionId delivered %d syncs: they were queued, not replaced", syncs)
			}
			if timedOut {
				return "", fmt.Sprintf("120 re-joins with one subscriptionId, not read for 15 s: the client was not closed (%d syncs)", syncs)
			}
			got = append(got, fmt.Sprintf("120 re-joins of one subscriptionId, not read for 15 s: %d syncs delivered (the rest replaced), then %s",
				syncs, closeText(rerr)))
		}
	}
	return as.Name + ": " + strings.Join(got, "; "), ""
}

func closeText(err error) string {
	if s := websocket.CloseStatus(err); s != -1 {
		return fmt.Sprintf("close %d", s)
	}
	return "closed"
}

// ResetPeakRSS starts the engine's high-water mark afresh (Linux:
// clear_refs 5), so the next PeakRSSMiB is one phase's.
func (e *Engine) ResetPeakRSS() error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", e.cmd.Process.Pid), []byte("5"), 0)
}

// RunHeld measures a quiet phase, then each flood of this file as each
// caller in turn; every phase's PeakRSS is its own (the high-water mark is
// reset before it). done, when set, is called with each phase as it ends.
// III_FLOOD_ONLY, when set, runs only the floods whose name contains it.
func RunHeld(ctx context.Context, e *Engine, p *Prober, callers []Caller, done func(Phase)) ([]Phase, error) {
	var phases []Phase
	record := func(name string, flood func() (string, string)) {
		if only := os.Getenv("III_FLOOD_ONLY"); only != "" && name != "quiet" && !strings.Contains(name, only) {
			return
		}
		_ = e.ResetPeakRSS()
		p.Take()
		offender, violation := flood()
		lat, fails := p.Take()
		rss, _ := e.PeakRSSMiB()
		ph := Phase{Name: name, Calls: len(lat), Failures: fails, P50: percentile(lat, 50), P99: percentile(lat, 99),
			Offender: offender, Violation: violation, PeakRSS: rss}
		phases = append(phases, ph)
		if done != nil {
			done(ph)
		}
	}
	record("quiet", func() (string, string) { time.Sleep(time.Second); return "", "" })
	for _, as := range callers {
		record("unanswered calls, "+as.Name, func() (string, string) { return UnansweredCalls(ctx, e.URL, as) })
		record("enqueued calls, "+as.Name, func() (string, string) { return EnqueuedCalls(ctx, e, as) })
		record("1 MB registrations, "+as.Name, func() (string, string) { return BigRegistrations(ctx, e.URL, as) })
		record("partial frames, "+as.Name, func() (string, string) { return PartialFrames(ctx, e.URL, as, 10) })
		record("many partial frames, "+as.Name, func() (string, string) { return ManyPartialFrames(ctx, e.URL, as, 400) })
		if e.StreamURL != "" {
			record("stream re-joins, "+as.Name, func() (string, string) { return StreamRejoins(ctx, e, as) })
		}
		if ctx.Err() != nil {
			break
		}
	}
	return phases, ctx.Err()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ManyPartialFrames: many worker sockets each send a frame header for
// 1 MiB and then all of it but the last byte, each connection well under
// every cap of its own. The engine must not hold connections × 1 MiB: it
// reads 64 KiB of a frame at once and the rest only in one of its medium
// slots, whose holders must finish within the slow-consumer time or be
// dropped.
// manyPartialDrops is how many of ManyPartialFrames' senders the engine
// must drop within 40 s: the holders of its medium slots, past their time.
const manyPartialDrops = 32

func ManyPartialFrames(ctx context.Context, url string, as Caller, conns int) (string, string) {
	const size = 1 << 20
	body := make([]byte, size-1)
	hdr := []byte{0x82, 0x80 | 127, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	for i := range 8 {
		hdr[2+i] = byte(uint64(size) >> (56 - 8*i))
	}
	var wg sync.WaitGroup
	var dropped, opened atomic.Int64
	var failure atomic.Value
	stop := make(chan struct{})
	start := time.Now()
	for range conns {
		wg.Go(func() {
			conn, err := rawUpgrade(ctx, url, as.header())
			if err != nil {
				failure.Store(err.Error())
				return
			}
			defer conn.Close()
			opened.Add(1)
			go func() { <-stop; conn.Close() }()
			_ = conn.SetWriteDeadline(time.Now().Add(60 * time.Second))
			if _, err := conn.Write(hdr); err != nil {
				return
			}
			_, _ = conn.Write(body)
			buf := make([]byte, 4096)
			for {
				if _, err := conn.Read(buf); err != nil {
					select {
					case <-stop:
					default:
						dropped.Add(1)
					}
					return
				}
			}
		})
	}
	// Wait until the engine has dropped enough slot holders (each past
	// its slow-consumer time), at most 40 s: the check below, ended as
	// soon as it is settled rather than after a fixed 40 s.
	deadline := time.Now().Add(40 * time.Second)
	for dropped.Load() < manyPartialDrops && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if f := failure.Load(); f != nil {
		return "", f.(string)
	}
	if dropped.Load() < manyPartialDrops {
		return "", fmt.Sprintf("%d of %d connections with a partial 1 MiB frame were dropped within 40 s", dropped.Load(), opened.Load())
	}
	return fmt.Sprintf("%s: %d worker sockets each with a 1 MiB frame but its last byte: %d dropped within %v (the rest waited for a slot, holding 64 KiB each)",
		as.Name, opened.Load(), dropped.Load(), time.Since(start).Round(time.Second)), ""
}

// EnqueuedCalls: a queue provider (connected with the engine token) takes
// every hand-over and never answers, and a worker enqueues 200 calls with
// 1 MiB payloads on one connection. Each hand-over waiting on the provider
// is charged to the enqueuer like a call it awaits, so 64 pass
// (limits.inflight_bytes_per_connection) and the rest must be answered
// LIMIT_EXCEEDED; when the provider leaves, every hand-over ends and the
// enqueuer has an answer to all 200.
func EnqueuedCalls(ctx context.Context, e *Engine, as Caller) (string, string) {
	tok, err := os.ReadFile(filepath.Join(e.Dir, ".iii", "engine-token"))
	if err != nil {
		return "", err.Error()
	}
	provider, err := dialAs(ctx, e.URL, Caller{Name: "queue provider", Token: strings.TrimSpace(string(tok))})
	if err != nil {
		return "", "dial the provider: " + err.Error()
	}
	defer provider.CloseNow()
	took := readAll(provider, `"engine::queue::enqueue"`)
	if err := provider.Write(ctx, websocket.MessageText, []byte(`{"type":"registerfunction","id":"engine::queue::enqueue"}`)); err != nil {
		return "", err.Error()
	}
	// Past the namespace grace the provider is there for sure.
	time.Sleep(1500 * time.Millisecond)
	ws, err := dialAs(ctx, e.URL, as)
	if err != nil {
		return "", "dial: " + err.Error()
	}
	defer ws.CloseNow()
	rd := readAll(ws, `"LIMIT_EXCEEDED"`)
	payload := strings.Repeat("p", 1<<20-1024)
	const n = 200
	for i := range n {
		frame := fmt.Appendf(nil, `{"type":"invokefunction","invocation_id":"q%d","function_id":"flood::job"%s,"data":"%s","action":{"type":"enqueue","queue":"flood"}}`,
			i, as.nsField(), payload)
		if err := ws.Write(ctx, websocket.MessageText, frame); err != nil {
			return "", fmt.Sprintf("enqueue %d: %v", i, err)
		}
	}
	// About 64 MiB of hand-overs in flight (the default); the rest refused.
	if !rd.waitHits(n-65, 60*time.Second) {
		return "", fmt.Sprintf("%d of %d enqueues of 1 MiB waiting on a provider that does not answer were refused LIMIT_EXCEEDED, want at least %d (limits.inflight_bytes_per_connection); the provider took %d",
			rd.hits.Load(), n, n-65, took.hits.Load())
	}
	refused, held := rd.hits.Load(), took.hits.Load()
	provider.CloseNow()
	// One answer to its namespace declaration, and one to each enqueue.
	end := time.Now().Add(60 * time.Second)
	for rd.n.Load() < n+1 && time.Now().Before(end) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := rd.n.Load(); got < n+1 {
		return "", fmt.Sprintf("after the provider left, the enqueuer had %d answers of %d", got-1, n)
	}
	return fmt.Sprintf("%s: %d of %d enqueues of 1 MiB refused LIMIT_EXCEEDED, %d held by the provider until it left", as.Name, refused, n, held), ""
}
