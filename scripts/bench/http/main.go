// Command http measures the registry's http worker (workers/http) beside a
// plain Go net/http handler doing the same JSON echo, in the same run:
//
//	http worker  client → listener → engine → function worker (Go) →
//	             engine → listener → client
//	net/http     client → listener → handler (decode, encode) → client
//
// Both are served on loopback from this process, the engine in-process
// (as scripts/bench/state). 64 clients (keep-alive) send POST requests
// with a small JSON body for a fixed time per path, in interleaved
// slices; each request's latency is recorded. Printed: p50, p99 and
// requests/s per path, and the ratios http worker / net/http. A third
// path, "engine call", is the function called directly through the
// engine by a Go client (64 concurrent calls): the share of the two
// WebSocket hops alone; a fourth, "listener", an http worker whose
// function runs in-process: the share of the listener alone.
//
//	go run ./scripts/bench/http [-clients 64] [-dur 6s] [-rounds 3]
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
	httpw "github.com/iii-sandbox/iii/workers/http"
)

func main() {
	clients := flag.Int("clients", 64, "concurrent HTTP clients")
	dur := flag.Duration("dur", 6*time.Second, "measuring time per path")
	rounds := flag.Int("rounds", 3, "interleaved slices per path")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	memprofile := flag.String("memprofile", "", "write an allocation profile of the whole run here")
	only := flag.String("only", "", "measure only these paths (comma-separated: worker,nethttp,engine,listener,streaming); ratios need worker and nethttp")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	if err := run(*clients, *dur, *rounds, *only); err != nil {
		fmt.Fprintln(os.Stderr, "bench http:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
	if *memprofile != "" {
		f, err := os.Create(*memprofile)
		if err == nil {
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			_ = f.Close()
		}
	}
}

const payload = `{"name":"Alice","n":1,"tags":["a","b"]}`

func run(clients int, dur time.Duration, rounds int, only string) error {
	ctx := context.Background()
	eng := engine.New(engine.Options{Logger: hclog.NewNullLogger()})
	esrv := httptest.NewServer(eng.Handler())
	defer esrv.Close()
	defer eng.Close(ctx)
	url := "ws" + strings.TrimPrefix(esrv.URL, "http")
	dial := func(name string) (*client.Client, error) {
		return client.Dial(ctx, url, client.Options{Name: name, IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}})
	}

	// The http worker.
	hc, err := dial("http")
	if err != nil {
		return err
	}
	defer hc.Close(ctx)
	cfg, err := httpw.ParseConfig(json.RawMessage(`{"port":0}`))
	if err != nil {
		return err
	}
	w := httpw.New(cfg, httpw.Options{Invoker: httpw.ClientInvoker{C: hc}})
	if err := w.Listen(); err != nil {
		return err
	}
	defer w.Close(ctx)
	if err := w.Register(hc, "http"); err != nil {
		return err
	}
	// The function worker: echoes the JSON body.
	fc, err := dial("app")
	if err != nil {
		return err
	}
	defer fc.Close(ctx)
	if _, err := fc.RegisterFunction(client.FunctionDef{ID: "bench::echo"}, func(_ context.Context, inv *client.Invocation) (any, error) {
		var req struct {
			Body json.RawMessage `json:"body"`
		}
		if err := json.Unmarshal(inv.Data, &req); err != nil {
			return nil, err
		}
		return map[string]any{"status_code": 200, "body": req.Body}, nil
	}); err != nil {
		return err
	}
	if _, err := fc.RegisterTrigger(client.TriggerDef{TriggerType: "http", FunctionID: "bench::echo",
		Config: json.RawMessage(`{"api_path":"/echo","http_method":"POST"}`)}); err != nil {
		return err
	}
	// The floor: a plain net/http handler doing the same echo.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	plain := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var v any
		if err := json.NewDecoder(io.LimitReader(r.Body, 16<<20)).Decode(&v); err != nil {
			http.Error(rw, err.Error(), 400)
			return
		}
		b, _ := json.Marshal(v)
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write(b)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := plain.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "bench http: the net/http floor stopped:", err)
		}
	}()
	defer plain.Close()

	tr := &http.Transport{MaxIdleConns: clients * 2, MaxIdleConnsPerHost: clients * 2, IdleConnTimeout: time.Minute}
	hcl := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	// The engine's own share: the same function called directly by a Go
	// client (caller → engine → function worker → engine → caller), the
	// two WebSocket hops the http worker adds to an HTTP request.
	cc, err := dial("caller")
	if err != nil {
		return err
	}
	defer cc.Close(ctx)
	callPayload := json.RawMessage(`{"method":"POST","path":"/echo","path_params":{},"query_params":{},"headers":{},"body":` + payload + `}`)
	// The listener's own share: a second http worker whose invoker runs
	// the echo in-process, no engine.
	lw := httpw.New(cfg, httpw.Options{Invoker: directEcho{}})
	if err := lw.Listen(); err != nil {
		return err
	}
	defer lw.Close(ctx)
	if err := lw.RegisterTrigger(ctx, client.TriggerRegistration{ID: "echo", TriggerType: "http", FunctionID: "bench::echo",
		Config: json.RawMessage(`{"api_path":"/echo","http_method":"POST"}`)}); err != nil {
		return err
	}
	// The http worker with streaming on (its default in a project): each
	// request also carries its two channels' refs, minted under the
	// worker's channel lease (the echo opens neither, so the engine never
	// makes them; the worker retires them in its watch calls). The route is
	// bound on the worker directly (one engine serves one provider of the
	// trigger type); the function is called through the engine as above.
	sc, err := dial("http-streaming")
	if err != nil {
		return err
	}
	defer sc.Close(ctx)
	sw := httpw.New(cfg, httpw.Options{Invoker: httpw.ClientInvoker{C: sc}})
	sw.SetStreams(httpw.NewClientStreams(sc, nil))
	if err := sw.Listen(); err != nil {
		return err
	}
	defer sw.Close(ctx)
	if err := sw.RegisterTrigger(ctx, client.TriggerRegistration{ID: "echo", TriggerType: "http", FunctionID: "bench::echo",
		Config: json.RawMessage(`{"api_path":"/echo","http_method":"POST"}`)}); err != nil {
		return err
	}
	paths := []struct{ key, name, url string }{
		{"worker", "http worker", "http://" + w.Addr().String() + "/echo"},
		{"nethttp", "net/http", "http://" + ln.Addr().String() + "/echo"},
		{"engine", "engine call", ""},
		{"listener", "listener", "http://" + lw.Addr().String() + "/echo"},
		{"streaming", "streaming", "http://" + sw.Addr().String() + "/echo"},
	}
	if only != "" {
		keep := strings.Split(only, ",")
		paths = slices.DeleteFunc(paths, func(p struct{ key, name, url string }) bool { return !slices.Contains(keep, p.key) })
	}
	one := func(u string) error {
		if u == "" {
			_, err := cc.Call(ctx, "bench::echo", callPayload)
			return err
		}
		resp, err := hcl.Post(u, "application/json", strings.NewReader(payload))
		if err != nil {
			return err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"Alice"`)) {
			return fmt.Errorf("%s: %d %s", u, resp.StatusCode, b)
		}
		return nil
	}
	// Wait for the route (the trigger reaches the worker asynchronously),
	// then warm up.
	deadline := time.Now().Add(30 * time.Second)
	for one(paths[0].url) != nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("the route did not appear: %v", one(paths[0].url))
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, p := range paths {
		load(clients, time.Second, func() error { return one(p.url) })
	}
	fmt.Printf("GOMAXPROCS=%d  load average: %s\n", runtime.GOMAXPROCS(0), benchstat.LoadAvg())
	lat := map[string][]time.Duration{}
	done := map[string]int{}
	cpu := map[string]time.Duration{}
	mallocs, allocBytes := map[string]uint64{}, map[string]uint64{}
	fails := map[string]int64{}
	for r := range rounds {
		for j := range paths {
			p := paths[(j+r)%len(paths)]
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			c0 := cpuTime()
			s, f := load(clients, dur/time.Duration(rounds), func() error { return one(p.url) })
			cpu[p.name] += cpuTime() - c0
			runtime.ReadMemStats(&m1)
			mallocs[p.name] += m1.Mallocs - m0.Mallocs
			allocBytes[p.name] += m1.TotalAlloc - m0.TotalAlloc
			lat[p.name] = append(lat[p.name], s...)
			done[p.name] += len(s)
			fails[p.name] += f
		}
	}
	pct := func(name string, q int) time.Duration {
		s := lat[name]
		slices.Sort(s)
		return benchstat.Percentile(s, q)
	}
	rate := func(name string) float64 { return float64(done[name]) / dur.Seconds() }
	fmt.Printf("%d clients, POST %d-byte JSON echo, %s per path in %d interleaved slices\n", clients, len(payload), dur, rounds)
	// CPU per request is this process's CPU time (clients, listeners,
	// engine, workers: all of it is here) over the requests served: on a
	// machine other work keeps busy, where requests/s mostly measures the
	// share of the CPUs the run got, it is the steadier figure.
	cpuPer := func(name string) time.Duration { return cpu[name] / time.Duration(max(done[name], 1)) }
	// Allocations per request (the whole process's, as CPU time) do not
	// depend on what else the machine runs: on a busy machine they show a
	// change that CPU time and requests/s blur.
	perReq := func(m map[string]uint64, name string) uint64 { return m[name] / uint64(max(done[name], 1)) }
	fmt.Printf("  %-12s %10s %10s %12s %10s %10s %10s %8s\n", "path", "p50", "p99", "req/s", "cpu/req", "allocs/req", "B/req", "failed")
	for _, p := range paths {
		fmt.Printf("  %-12s %10s %10s %12.0f %10s %10d %10d %8d\n", p.name, us(pct(p.name, 50)), us(pct(p.name, 99)), rate(p.name), us(cpuPer(p.name)),
			perReq(mallocs, p.name), perReq(allocBytes, p.name), fails[p.name])
	}
	if only != "" {
		return nil // the ratios need every path
	}
	a, b, e := paths[0].name, paths[1].name, paths[2].name
	fmt.Printf("  http worker / net/http: p50 %.2f× (target ≤ 2×), p99 %.2f×, req/s %.0f%% (target ≥ 50%%), cpu/req %.2f×\n",
		float64(pct(a, 50))/float64(pct(b, 50)), float64(pct(a, 99))/float64(pct(b, 99)), 100*rate(a)/rate(b), float64(cpuPer(a))/float64(cpuPer(b)))
	fmt.Printf("  engine call alone / net/http: p50 %.2f×, req/s %.0f%% (the floor of the http worker's hops)\n",
		float64(pct(e, 50))/float64(pct(b, 50)), 100*rate(e)/rate(b))
	l := paths[3].name
	fmt.Printf("  listener without the engine / net/http: p50 %.2f×, req/s %.0f%%\n",
		float64(pct(l, 50))/float64(pct(b, 50)), 100*rate(l)/rate(b))
	sp := paths[4].name
	fmt.Printf("  http worker with streaming (the default) / net/http: p50 %.2f×, p99 %.2f×, req/s %.0f%%, cpu/req %.2f×\n",
		float64(pct(sp, 50))/float64(pct(b, 50)), float64(pct(sp, 99))/float64(pct(b, 99)), 100*rate(sp)/rate(b), float64(cpuPer(sp))/float64(cpuPer(b)))
	return nil
}

// load runs clients goroutines calling f for d; the latencies of the
// calls that succeeded, and the number that failed.
func load(clients int, d time.Duration, f func() error) ([]time.Duration, int64) {
	var mu sync.Mutex
	var all []time.Duration
	var failed atomic.Int64
	var firstErr sync.Once
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(stop) {
				t0 := time.Now()
				if err := f(); err != nil {
					failed.Add(1)
					firstErr.Do(func() { fmt.Fprintln(os.Stderr, "bench http: a request failed (the first of its slice):", err) })
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all, failed.Load()
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func us(d time.Duration) string { return fmt.Sprintf("%.0fµs", float64(d.Microseconds())) }

// directEcho is the echo function called in-process.
type directEcho struct{}

func (directEcho) Invoke(_ context.Context, _, _ string, payload, _ json.RawMessage) (json.RawMessage, error) {
	var req struct {
		Body json.RawMessage `json:"body"`
	}
	if err := json.Unmarshal(payload, &req); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"status_code": 200, "body": req.Body})
}
