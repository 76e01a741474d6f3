// Command queue measures the registry's queue worker (workers/queue):
// publish → delivery latency and messages/s through a real engine, beside
// two floors of the same run:
//
//	publish      publisher → engine → iii::durable::publish on the queue
//	             worker (the message written to its log) → answered; the
//	             worker → engine → the subscriber's function
//	invoke floor the publisher calls the same subscriber function through
//	             the same engine directly (no queue)
//	chan floor   a plain Go channel hand-off between two goroutines
//
// Latency: one message at a time (the next after the last arrived), p50 /
// p99 of publish start → the subscriber's handler running. Messages/s:
// -publishers concurrent publishers send -m messages; the clock stops when
// the last one has been delivered. The store is file_based (the default:
// every publish is written to the log before it is answered).
//
//	go run ./scripts/bench/queue [-n 1000] [-m 5000] [-publishers 64] [-concurrency 64]
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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
	"github.com/iii-sandbox/iii/workers/queue"
)

func main() {
	n := flag.Int("n", 1000, "sequential messages for latency, per path")
	m := flag.Int("m", 5000, "messages for messages/s, per path")
	publishers := flag.Int("publishers", 64, "concurrent publishers for messages/s")
	conc := flag.Int("concurrency", 64, "the subscriber's queue_config.concurrency")
	flag.Parse()
	if err := run(*n, *m, *publishers, *conc); err != nil {
		fmt.Fprintln(os.Stderr, "bench queue:", err)
		os.Exit(1)
	}
}

// arrivals hands each delivered message's index to whoever waits.
type arrivals struct {
	mu   sync.Mutex
	at   map[int64]time.Time
	seen chan int64
	got  atomic.Int64
}

func (a *arrivals) arrive(i int64) {
	now := time.Now()
	a.mu.Lock()
	if _, dup := a.at[i]; dup {
		a.mu.Unlock()
		return
	}
	a.at[i] = now
	a.mu.Unlock()
	a.got.Add(1)
	select {
	case a.seen <- i:
	default:
	}
}

func (a *arrivals) reset() {
	a.mu.Lock()
	a.at = map[int64]time.Time{}
	a.mu.Unlock()
	a.got.Store(0)
	for {
		select {
		case <-a.seen:
		default:
			return
		}
	}
}

func run(n, m, publishers, conc int) error {
	ctx := context.Background()
	eng := engine.New(engine.Options{Logger: hclog.NewNullLogger()})
	srv := httptest.NewServer(eng.Handler())
	defer srv.Close()
	defer eng.Close(ctx)
	url := "ws" + strings.TrimPrefix(srv.URL, "http")
	dial := func(name string) (*client.Client, error) {
		return client.Dial(ctx, url, client.Options{Name: name, IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}})
	}

	dir, err := os.MkdirTemp("", "bench-queue-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	store, err := queue.OpenStore(dir)
	if err != nil {
		return err
	}
	defer store.Close()
	qc, err := dial("queue")
	if err != nil {
		return err
	}
	defer qc.Close(ctx)
	d := queue.NewDispatcher(queue.DispatcherOptions{Store: store, Topics: queue.ClientInvoker{C: func() *client.Client { return qc }}})
	if err := queue.Register(qc, d); err != nil {
		return err
	}
	dctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); d.Run(dctx) }()
	defer func() { stop(); <-done }()

	arr := &arrivals{at: map[int64]time.Time{}, seen: make(chan int64, 1)}
	sub, err := dial("sub")
	if err != nil {
		return err
	}
	defer sub.Close(ctx)
	if _, err := sub.RegisterFunction(client.FunctionDef{ID: "bench::recv"}, func(_ context.Context, inv *client.Invocation) (any, error) {
		var in struct {
			I int64 `json:"i"`
		}
		if err := json.Unmarshal(inv.Data, &in); err != nil {
			return nil, err
		}
		arr.arrive(in.I)
		return nil, nil
	}); err != nil {
		return err
	}
	cfg, _ := json.Marshal(map[string]any{"topic": "bench", "queue_config": map[string]any{"concurrency": conc}})
	if _, err := sub.RegisterTrigger(client.TriggerDef{TriggerType: queue.TriggerType, FunctionID: "bench::recv", Config: cfg}); err != nil {
		return err
	}
	pub, err := dial("pub")
	if err != nil {
		return err
	}
	defer pub.Close(ctx)

	publish := func(i int64) error {
		_, err := pub.Call(ctx, queue.FnPublish, map[string]any{"topic": "bench", "data": map[string]int64{"i": i}}, client.WithNamespace("default"))
		return err
	}
	invoke := func(i int64) error {
		_, err := pub.Call(ctx, "bench::recv", map[string]int64{"i": i}, client.WithNamespace("default"))
		return err
	}
	// The trigger reaches the worker asynchronously: publish until one
	// arrives.
	for i := int64(0); ; i++ {
		if err := publish(-1 - i); err != nil {
			return fmt.Errorf("warm-up publish: %w", err)
		}
		select {
		case <-arr.seen:
		case <-time.After(200 * time.Millisecond):
			continue
		}
		break
	}
	fmt.Printf("GOMAXPROCS=%d  load average: %s\n", runtime.GOMAXPROCS(0), benchstat.LoadAvg())

	// Latency, one at a time.
	seq := func(name string, send func(int64) error) ([]time.Duration, error) {
		arr.reset()
		var out []time.Duration
		for i := range int64(n) {
			t0 := time.Now()
			if err := send(i); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			select {
			case <-arr.seen:
			case <-time.After(30 * time.Second):
				return nil, fmt.Errorf("%s: message %d never arrived", name, i)
			}
			arr.mu.Lock()
			out = append(out, arr.at[i].Sub(t0))
			arr.mu.Unlock()
		}
		slices.Sort(out)
		return out, nil
	}
	pubLat, err := seq("publish", publish)
	if err != nil {
		return err
	}
	invLat, err := seq("invoke", invoke)
	if err != nil {
		return err
	}
	chanLat := chanFloor(n)

	// Messages/s.
	rate := func(name string, send func(int64) error) (float64, error) {
		arr.reset()
		var next atomic.Int64
		var failed atomic.Int64
		t0 := time.Now()
		var wg sync.WaitGroup
		for range publishers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1) - 1
					if i >= int64(m) {
						return
					}
					if send(i) != nil {
						failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		deadline := time.Now().Add(2 * time.Minute)
		for arr.got.Load() < int64(m)-failed.Load() {
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("%s: %d of %d delivered", name, arr.got.Load(), m)
			}
			time.Sleep(time.Millisecond)
		}
		if failed.Load() > 0 {
			return 0, fmt.Errorf("%s: %d sends failed", name, failed.Load())
		}
		return float64(m) / time.Since(t0).Seconds(), nil
	}
	pubRate, err := rate("publish", publish)
	if err != nil {
		return err
	}
	invRate, err := rate("invoke", invoke)
	if err != nil {
		return err
	}
	chanRate := chanThroughput(m)

	fmt.Printf("latency: %d messages one at a time; messages/s: %d messages from %d publishers, subscriber concurrency %d\n", n, m, publishers, conc)
	fmt.Printf("  %-26s %10s %10s %12s\n", "path", "p50", "p99", "msgs/s")
	row := func(name string, s []time.Duration, r float64) {
		fmt.Printf("  %-26s %10s %10s %12.0f\n", name, us(benchstat.Percentile(s, 50)), us(benchstat.Percentile(s, 99)), r)
	}
	row("publish → delivery", pubLat, pubRate)
	row("invoke (floor, no queue)", invLat, invRate)
	row("Go channel (floor)", chanLat, chanRate)
	fmt.Printf("  publish / invoke: p50 %.2f×, p99 %.2f×, msgs/s %.2f×\n",
		ratio(benchstat.Percentile(pubLat, 50), benchstat.Percentile(invLat, 50)),
		ratio(benchstat.Percentile(pubLat, 99), benchstat.Percentile(invLat, 99)), pubRate/invRate)
	return nil
}

// chanFloor is the hand-off latency of an unbuffered Go channel.
func chanFloor(n int) []time.Duration {
	ch := make(chan time.Time)
	back := make(chan time.Duration)
	go func() {
		for t0 := range ch {
			back <- time.Since(t0)
		}
	}()
	out := make([]time.Duration, 0, n)
	for range n {
		ch <- time.Now()
		out = append(out, <-back)
	}
	close(ch)
	slices.Sort(out)
	return out
}

// chanThroughput is messages/s through a buffered Go channel.
func chanThroughput(m int) float64 {
	ch := make(chan int, 1024)
	done := make(chan struct{})
	t0 := time.Now()
	go func() {
		for range ch {
		}
		close(done)
	}()
	for i := range m {
		ch <- i
	}
	close(ch)
	<-done
	return float64(m) / time.Since(t0).Seconds()
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func us(d time.Duration) string { return fmt.Sprintf("%.1fµs", float64(d)/1e3) }
