package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iii-sandbox/iii/host/engine/enginebench"
)

// The P1 figure and its floors: one sequential call per iteration.
func BenchmarkRoundTrip(b *testing.B)           { benchSequential(b, enginebench.Engine) }
func BenchmarkRoundTripRelayFloor(b *testing.B) { benchSequential(b, enginebench.Relay) }
func BenchmarkRoundTripEchoFloor(b *testing.B)  { benchSequential(b, enginebench.Echo) }

func benchSequential(b *testing.B, kind enginebench.Kind) {
	ctx := context.Background()
	s, err := enginebench.Start(ctx, enginebench.Options{Kind: kind})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for range 200 {
		if err := s.RoundTrip(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := s.RoundTrip(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRoundTrip1MiB is P1 with a 1 MiB payload each way.
func BenchmarkRoundTrip1MiB(b *testing.B) {
	ctx := context.Background()
	payload := make([]byte, 0, 1<<20+16)
	payload = append(payload, `{"blob":"`...)
	for len(payload) < 1<<20 {
		payload = append(payload, "abcdefghijklmnop"...)
	}
	payload = append(payload, `"}`...)
	s, err := enginebench.Start(ctx, enginebench.Options{Kind: enginebench.Engine, Payload: payload})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.SetBytes(int64(len(payload)))
	b.ResetTimer()
	for b.Loop() {
		if err := s.RoundTrip(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkThroughput64 is P3: 64 concurrent callers on one connection.
// ns/op is per completed call across all callers.
func BenchmarkThroughput64(b *testing.B) {
	ctx := context.Background()
	s, err := enginebench.Start(ctx, enginebench.Options{Kind: enginebench.Engine})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var n atomic.Int64
	b.SetParallelism(64)
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := s.RoundTrip(ctx); err != nil {
				b.Error(err)
				return
			}
			n.Add(1)
		}
	})
	b.ReportMetric(float64(n.Load())/time.Since(start).Seconds(), "calls/s")
}
