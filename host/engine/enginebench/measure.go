package enginebench

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Latency makes warmup calls, then n sequential calls, and returns each
// call's duration sorted ascending.
func Latency(ctx context.Context, s *Setup, warmup, n int) ([]time.Duration, error) {
	for range warmup {
		if err := s.RoundTrip(ctx); err != nil {
			return nil, err
		}
	}
	out := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if err := s.RoundTrip(ctx); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t0))
	}
	slices.Sort(out)
	return out, nil
}

// Percentile of sorted durations, p in [0,100].
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

// Throughput runs callers concurrent loops of round trips for d and returns
// completed calls per second.
func Throughput(ctx context.Context, s *Setup, callers int, d time.Duration) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var done atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	start := time.Now()
	deadline := start.Add(d)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if err := s.RoundTrip(ctx); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(done.Load()) / time.Since(start).Seconds(), nil
}
