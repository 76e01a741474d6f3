// Command wsroundtrip measures the engine's call latency (P1) and throughput
// (P3) over loopback WebSocket, each beside its floor measured in the same
// run with the same WebSocket library:
//
//	P1  caller → engine → echo worker → engine → caller, p50 and p99,
//	    against a two-hop relay that forwards frames without parsing them
//	    (caller → relay → echo peer → relay → caller) and the one-hop echo.
//	    P1 is measured three ways: callers without a token (every call
//	    passes the permission check), with the engine token (the check is
//	    skipped: the figure without it) and through an RBAC listener (the
//	    full expose_functions decision); the cost of the check is the
//	    difference, in the same run.
//	P3  calls/s with concurrent callers (default 64) through the engine to
//	    one echo worker, against the same callers through the two-hop relay.
//
// Latency rounds are interleaved (echo, relay, engine, rotating the order)
// so a change in machine load affects the figure and its floor alike.
//
//	go run ./scripts/bench/wsroundtrip [-n 2000] [-rounds 5] [-callers 64] [-p3 5s]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/host/engine/enginebench"
	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
)

func main() {
	n := flag.Int("n", 2000, "sequential calls per path per round")
	rounds := flag.Int("rounds", 5, "interleaved latency rounds")
	warmup := flag.Int("warmup", 500, "calls before measuring, per path")
	callers := flag.Int("callers", 64, "concurrent callers for P3")
	conns := flag.Int("conns", 1, "caller connections the P3 callers share")
	p3 := flag.Duration("p3", 5*time.Second, "P3 duration per path")
	payload := flag.Int("payload", 0, "payload bytes (0 = a small object)")
	flag.Parse()
	if err := run(*n, *rounds, *warmup, *callers, *conns, *p3, *payload); err != nil {
		fmt.Fprintln(os.Stderr, "wsroundtrip:", err)
		os.Exit(1)
	}
}

func run(n, rounds, warmup, callers, conns int, p3 time.Duration, payloadSize int) error {
	ctx := context.Background()
	var payload []byte
	if payloadSize > 0 {
		payload = []byte(`{"blob":"` + strings.Repeat("x", payloadSize) + `"}`)
	}
	kinds := []enginebench.Kind{enginebench.Echo, enginebench.Relay, enginebench.Engine, enginebench.EngineAdmin, enginebench.EngineRBAC}
	setups := map[enginebench.Kind]*enginebench.Setup{}
	for _, k := range kinds {
		s, err := enginebench.Start(ctx, enginebench.Options{Kind: k, Payload: payload})
		if err != nil {
			return fmt.Errorf("start %s: %w", k, err)
		}
		defer s.Close()
		setups[k] = s
		if _, err := enginebench.Latency(ctx, s, warmup, 0); err != nil {
			return fmt.Errorf("warm up %s: %w", k, err)
		}
	}

	fmt.Printf("GOMAXPROCS=%d  load average: %s\n", runtime.GOMAXPROCS(0), benchstat.LoadAvg())
	fmt.Printf("P1: %d rounds × %d sequential calls per path, interleaved\n", rounds, n)
	samples := map[enginebench.Kind][]time.Duration{}
	for r := range rounds {
		for i := range kinds {
			k := kinds[(i+r)%len(kinds)]
			d, err := enginebench.Latency(ctx, setups[k], 0, n)
			if err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
			samples[k] = append(samples[k], d...)
		}
	}
	p := func(k enginebench.Kind, q float64) time.Duration {
		s := samples[k]
		slices.Sort(s)
		return enginebench.Percentile(s, q)
	}
	label := map[enginebench.Kind]string{
		enginebench.Echo:        "one-hop echo (floor)",
		enginebench.Relay:       "two-hop relay (floor)",
		enginebench.Engine:      "engine round trip (P1)",
		enginebench.EngineAdmin: "P1, token: no check",
		enginebench.EngineRBAC:  "P1 through RBAC listener",
	}
	fmt.Printf("  %-24s %10s %10s\n", "path", "p50", "p99")
	for _, k := range kinds {
		fmt.Printf("  %-24s %10s %10s\n", label[k], us(p(k, 50)), us(p(k, 99)))
	}
	r50 := float64(p(enginebench.Engine, 50)) / float64(p(enginebench.Relay, 50))
	r99 := float64(p(enginebench.Engine, 99)) / float64(p(enginebench.Relay, 99))
	fmt.Printf("  P1 / two-hop floor: p50 %.2f×, p99 %.2f×   (goal: p50 ≤ 1.5×)\n", r50, r99)
	fmt.Printf("  P1 / one-hop floor: p50 %.2f×\n",
		float64(p(enginebench.Engine, 50))/float64(p(enginebench.Echo, 50)))
	fmt.Printf("  permission check: P1 − P1 without it: p50 %+.2fµs, p99 %+.2fµs; RBAC listener − without: p50 %+.2fµs   (goal: ≤ 2µs at p50)\n",
		float64(p(enginebench.Engine, 50)-p(enginebench.EngineAdmin, 50))/1e3,
		float64(p(enginebench.Engine, 99)-p(enginebench.EngineAdmin, 99))/1e3,
		float64(p(enginebench.EngineRBAC, 50)-p(enginebench.EngineAdmin, 50))/1e3)

	fmt.Printf("P3: %d concurrent callers on %d caller connection(s), one echo worker, %s per path, interleaved\n", callers, conns, p3)
	rates := map[enginebench.Kind]float64{}
	// Two halves per path, engine and relay alternating, so a change in
	// machine load moves the figure and its floor alike.
	for _, k := range []enginebench.Kind{enginebench.Engine, enginebench.Relay, enginebench.Relay, enginebench.Engine} {
		s, err := enginebench.Start(ctx, enginebench.Options{Kind: k, Conns: conns, Payload: payload})
		if err != nil {
			return err
		}
		rate, err := enginebench.Throughput(ctx, s, callers, p3/2)
		s.Close()
		if err != nil {
			return fmt.Errorf("throughput %s: %w", k, err)
		}
		rates[k] += rate / 2
	}
	fmt.Printf("  %-24s %10.0f calls/s\n", "two-hop relay (floor)", rates[enginebench.Relay])
	fmt.Printf("  %-24s %10.0f calls/s\n", "engine (P3)", rates[enginebench.Engine])
	fmt.Printf("  P3 / two-hop floor: %.2f×   (goal: P3 ≥ 25000 calls/s on 2 cores)\n", rates[enginebench.Engine]/rates[enginebench.Relay])
	return nil
}

func us(d time.Duration) string { return fmt.Sprintf("%.1fµs", float64(d)/1e3) }
