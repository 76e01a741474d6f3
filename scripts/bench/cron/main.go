// Command cron measures the tick jitter of the registry's cron worker
// (workers/cron): a real engine, the worker's trigger type on its own
// WebSocket connection with its default lock (the local lock directory),
// and an app connection whose `cron` triggers fire every second:
//
//	fired      actual_time − scheduled_time: the scheduler's timer wake
//	           plus the lock claim (a flock'd file) in the worker
//	delivered  the function's receipt − scheduled_time: fired plus the
//	           call through the engine to the app's connection
//	floor      a bare Go time.Timer armed for the same whole seconds, in
//	           the same process and the same run (same load)
//
// p50/p99/max of each over every tick of every job, and the ratio of
// delivered to the floor. Target (issue 21): delivered p99 ≤ 50 ms.
//
//	go run ./scripts/bench/cron [-jobs 20] [-dur 60s]
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
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
	"github.com/iii-sandbox/iii/workers/cron"
)

func main() {
	jobs := flag.Int("jobs", 20, "cron triggers firing every second (and as many floor timers)")
	dur := flag.Duration("dur", 60*time.Second, "how long to measure (W3 is measured over 60 s)")
	flag.Parse()
	if err := run(*jobs, *dur); err != nil {
		fmt.Fprintln(os.Stderr, "bench cron:", err)
		os.Exit(1)
	}
}

type samples struct {
	mu sync.Mutex
	d  map[string][]time.Duration
}

func (s *samples) add(name string, d time.Duration) {
	s.mu.Lock()
	s.d[name] = append(s.d[name], d)
	s.mu.Unlock()
}

func run(jobs int, dur time.Duration) error {
	ctx := context.Background()
	eng := engine.New(engine.Options{Logger: hclog.NewNullLogger()})
	srv := httptest.NewServer(eng.Handler())
	defer srv.Close()
	defer eng.Close(ctx)
	url := "ws" + strings.TrimPrefix(srv.URL, "http")
	dial := func(name string) (*client.Client, error) {
		return client.Dial(ctx, url, client.Options{Name: name, IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}})
	}

	dir, err := os.MkdirTemp("", "bench-cron-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg, err := cron.ParseConfig(json.RawMessage(cron.DefaultConfig))
	if err != nil {
		return err
	}
	spec, err := cfg.Lock(dir)
	if err != nil {
		return err
	}
	lock, err := cron.OpenLock(ctx, spec)
	if err != nil {
		return err
	}
	defer lock.Close()
	cc, err := dial("cron")
	if err != nil {
		return err
	}
	defer cc.Close(ctx)
	s := &samples{d: map[string][]time.Duration{}}
	started := time.Now()
	sched := cron.NewScheduler(cron.SchedulerOptions{Invoker: cron.ClientInvoker{C: cc}, Lock: lock,
		OnFire: func(_ cron.Job, at, actual time.Time) {
			if at.After(started.Add(time.Second)) { // past the warm-up tick
				s.add("fired", actual.Sub(at))
			}
		}})
	defer sched.Close()
	if err := (cron.Triggers{S: sched}).Register(cc); err != nil {
		return err
	}

	app, err := dial("app")
	if err != nil {
		return err
	}
	defer app.Close(ctx)
	if _, err := app.RegisterFunction(client.FunctionDef{ID: "bench::tick"}, func(_ context.Context, inv *client.Invocation) (any, error) {
		got := time.Now()
		var p cron.Payload
		if err := json.Unmarshal(inv.Data, &p); err != nil {
			return nil, err
		}
		at, err := time.Parse(time.RFC3339, p.ScheduledTime)
		if err == nil && at.After(started.Add(time.Second)) {
			s.add("delivered", got.Sub(at))
		}
		return nil, nil
	}); err != nil {
		return err
	}
	for i := range jobs {
		if _, err := app.RegisterTrigger(client.TriggerDef{ID: fmt.Sprintf("bench-%d", i), TriggerType: cron.TriggerType,
			FunctionID: "bench::tick", Config: json.RawMessage(`{"expression":"* * * * * *"}`)}); err != nil {
			return err
		}
	}

	// The floor: bare timers for the same whole seconds, meanwhile.
	stop := time.Now().Add(dur)
	var wg sync.WaitGroup
	for range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				now := time.Now()
				at := now.Truncate(time.Second).Add(time.Second)
				if at.After(stop) {
					return
				}
				t := time.NewTimer(at.Sub(now))
				<-t.C
				if at.After(started.Add(time.Second)) {
					s.add("floor", time.Since(at))
				}
			}
		}()
	}
	wg.Wait()
	sched.Close()

	fmt.Printf("GOMAXPROCS=%d  load average: %s\n", runtime.GOMAXPROCS(0), benchstat.LoadAvg())
	fmt.Printf("%d cron jobs every second for %s (lock: %s directory)\n", jobs, dur, spec.Adapter)
	fmt.Printf("%-10s %7s %10s %10s %10s\n", "path", "ticks", "p50", "p99", "max")
	p99 := map[string]time.Duration{}
	for _, name := range []string{"floor", "fired", "delivered"} {
		d := s.d[name]
		if len(d) == 0 {
			return fmt.Errorf("no %s samples", name)
		}
		p99[name] = benchstat.Percentile(d, 99)
		fmt.Printf("%-10s %7d %10s %10s %10s\n", name, len(d), round(benchstat.Median(d)), round(p99[name]), round(slices.Max(d)))
	}
	fmt.Printf("delivered p99 / floor p99 = %.1f×; delivered p99 %s (target ≤ 50ms)\n",
		float64(p99["delivered"])/float64(max(p99["floor"], time.Microsecond)), round(p99["delivered"]))
	return nil
}

func round(d time.Duration) time.Duration {
	return d.Round(10 * time.Microsecond)
}
