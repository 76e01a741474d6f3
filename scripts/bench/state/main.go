// Command state measures the registry's state worker (workers/state) beside
// the engine's own iii-stream kv store, in the same run and on the same
// engine, both kept in memory:
//
//	state::set / state::get   caller → engine → state worker (its own
//	                          WebSocket connection) → engine → caller
//	stream::set / stream::get caller → engine → iii-stream (in-process)
//	echo (floor of state)     caller → engine → a no-op worker → caller:
//	                          the same two hops as state, doing nothing
//
// p50/p99 of sequential calls (rounds interleaved so load affects all
// paths alike), then ops/s with concurrent callers, and the ratios
// state / stream and state / echo.
//
//	go run ./scripts/bench/state [-n 2000] [-rounds 5] [-callers 64] [-dur 3s]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/host/stream"
	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
	"github.com/iii-sandbox/iii/workers/state"
)

func main() {
	n := flag.Int("n", 2000, "sequential calls per path per round")
	rounds := flag.Int("rounds", 5, "interleaved latency rounds")
	callers := flag.Int("callers", 64, "concurrent callers for ops/s")
	dur := flag.Duration("dur", 3*time.Second, "ops/s duration per path")
	flag.Parse()
	if err := run(*n, *rounds, *callers, *dur); err != nil {
		fmt.Fprintln(os.Stderr, "bench state:", err)
		os.Exit(1)
	}
}

type path struct {
	name string
	fn   string
	req  func(i int) any
}

func run(n, rounds, callers int, dur time.Duration) error {
	ctx := context.Background()
	eng := engine.New(engine.Options{Logger: hclog.NewNullLogger()})
	srv := httptest.NewServer(eng.Handler())
	defer srv.Close()
	defer eng.Close(ctx)
	url := "ws" + strings.TrimPrefix(srv.URL, "http")

	sw, err := stream.Start(ctx, eng, stream.Options{Config: stream.Config{Host: "127.0.0.1"}})
	if err != nil {
		return fmt.Errorf("start iii-stream: %w", err)
	}
	defer sw.Close(ctx)

	dial := func(name string) (*client.Client, error) {
		return client.Dial(ctx, url, client.Options{Name: name, IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}})
	}
	cfg, err := state.ParseConfig(json.RawMessage(`{"adapter":{"name":"kv","config":{"store_method":"in_memory"}}}`))
	if err != nil {
		return err
	}
	stc, err := dial("state")
	if err != nil {
		return err
	}
	defer stc.Close(ctx)
	w, err := state.New(ctx, cfg, state.Options{Invoker: state.ClientInvoker{C: stc}})
	if err != nil {
		return err
	}
	defer w.Close(ctx)
	if err := w.Register(stc); err != nil {
		return err
	}
	echo, err := dial("echo")
	if err != nil {
		return err
	}
	defer echo.Close(ctx)
	if _, err := echo.RegisterFunction(client.FunctionDef{ID: "bench::echo"}, func(_ context.Context, inv *client.Invocation) (any, error) {
		return json.RawMessage(`null`), nil
	}); err != nil {
		return err
	}
	caller, err := dial("bench")
	if err != nil {
		return err
	}
	defer caller.Close(ctx)

	value := map[string]any{"name": "Alice", "n": 1, "tags": []string{"a", "b"}}
	key := func(i int) string { return "k" + strconv.Itoa(i%1000) }
	paths := []path{
		{"state::set", state.FnSet, func(i int) any { return map[string]any{"scope": "bench", "key": key(i), "value": value} }},
		{"state::get", state.FnGet, func(i int) any { return map[string]any{"scope": "bench", "key": key(i)} }},
		{"stream::set", "stream::set", func(i int) any {
			return map[string]any{"stream_name": "bench", "group_id": "g", "item_id": key(i), "data": value}
		}},
		{"stream::get", "stream::get", func(i int) any { return map[string]any{"stream_name": "bench", "group_id": "g", "item_id": key(i)} }},
		{"echo (floor)", "bench::echo", func(i int) any { return map[string]any{"scope": "bench", "key": key(i)} }},
	}
	one := func(p path, i int) error {
		_, err := caller.Call(ctx, p.fn, p.req(i), client.WithNamespace("default"))
		return err
	}
	for _, p := range paths { // warm up, and fill the keys the gets read
		for i := range 1000 {
			if err := one(p, i); err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
		}
	}
	fmt.Printf("GOMAXPROCS=%d  load average: %s\n", runtime.GOMAXPROCS(0), benchstat.LoadAvg())
	fmt.Printf("latency: %d rounds × %d sequential calls per path, interleaved\n", rounds, n)
	samples := map[string][]time.Duration{}
	for r := range rounds {
		for j := range paths {
			p := paths[(j+r)%len(paths)]
			for i := range n {
				t0 := time.Now()
				if err := one(p, i); err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
				samples[p.name] = append(samples[p.name], time.Since(t0))
			}
		}
	}
	pct := func(name string, q int) time.Duration {
		s := samples[name]
		slices.Sort(s)
		return benchstat.Percentile(s, q)
	}
	// ops/s, interleaved too: rounds slices of dur/rounds per path.
	rates := map[string]float64{}
	for r := range rounds {
		for j := range paths {
			p := paths[(j+r)%len(paths)]
			rates[p.name] += throughput(ctx, callers, dur/time.Duration(rounds), func(i int) error { return one(p, i) }) / float64(rounds)
		}
	}
	fmt.Printf("  %-14s %10s %10s %12s\n", "path", "p50", "p99", "ops/s")
	for _, p := range paths {
		fmt.Printf("  %-14s %10s %10s %12.0f\n", p.name, us(pct(p.name, 50)), us(pct(p.name, 99)), rates[p.name])
	}
	for _, op := range []string{"set", "get"} {
		s, f := "state::"+op, "stream::"+op
		fmt.Printf("  %s / %s: p50 %.2f×, ops/s %.2f×;  %s / echo floor: p50 %.2f×, ops/s %.2f×\n",
			s, f, ratio(pct(s, 50), pct(f, 50)), rates[s]/rates[f],
			s, ratio(pct(s, 50), pct("echo (floor)", 50)), rates[s]/rates["echo (floor)"])
	}
	fmt.Printf("ops/s: %d concurrent callers on one connection, %s per path in %d interleaved slices\n", callers, dur, rounds)
	return nil
}

// throughput runs callers goroutines calling f for d and returns calls/s.
func throughput(ctx context.Context, callers int, d time.Duration, f func(i int) error) float64 {
	var done atomic.Int64
	var failed atomic.Int64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; time.Now().Before(stop); i += callers {
				if ctx.Err() != nil {
					return
				}
				if f(i) != nil {
					failed.Add(1)
					continue
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		fmt.Fprintf(os.Stderr, "  (%d calls failed)\n", failed.Load())
	}
	return float64(done.Load()) / d.Seconds()
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func us(d time.Duration) string { return fmt.Sprintf("%.1fµs", float64(d)/1e3) }
