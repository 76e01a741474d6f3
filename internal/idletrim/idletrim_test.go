package idletrim

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ms = time.Millisecond

// TestTrimmerDecides walks CPU-time samples (cumulative, one per tick)
// and checks on which ticks a trim is due.
func TestTrimmerDecides(t *testing.T) {
	p := Policy{Tick: time.Second, IdleCPU: 2 * ms, IdleTicks: 3, WorkCPU: 20 * ms}
	tests := []struct {
		name    string
		samples []time.Duration // CPU time at each tick; the trimmer starts at 0
		want    []int           // ticks (0-based) that trim
	}{
		{name: "idle from the start: never", samples: []time.Duration{0, 1 * ms, 1 * ms, 2 * ms, 2 * ms, 3 * ms}},
		{name: "work then quiet: once, after IdleTicks quiet ticks", samples: []time.Duration{50 * ms, 50 * ms, 51 * ms, 51 * ms, 51 * ms, 51 * ms}, want: []int{3}},
		{name: "busy all along: never", samples: []time.Duration{10 * ms, 20 * ms, 30 * ms, 40 * ms, 50 * ms}},
		{name: "a busy tick resets the quiet run", samples: []time.Duration{50 * ms, 50 * ms, 50 * ms, 60 * ms, 60 * ms, 60 * ms, 60 * ms}, want: []int{6}},
		{name: "too little work: never", samples: []time.Duration{5 * ms, 5 * ms, 5 * ms, 5 * ms, 5 * ms}},
		{name: "idle ticks never add up to work", samples: []time.Duration{2 * ms, 4 * ms, 6 * ms, 8 * ms, 10 * ms, 12 * ms, 14 * ms, 16 * ms, 18 * ms, 20 * ms, 22 * ms, 24 * ms}},
		{name: "busy ticks add up", samples: []time.Duration{12 * ms, 12 * ms, 24 * ms, 24 * ms, 24 * ms, 24 * ms}, want: []int{5}},
		{name: "two busy periods: two trims", samples: []time.Duration{30 * ms, 30 * ms, 30 * ms, 30 * ms, 80 * ms, 80 * ms, 80 * ms, 80 * ms, 80 * ms}, want: []int{3, 7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTrimmer(p, 0)
			var got []int
			for i, cpu := range tc.samples {
				if tr.Observe(cpu) {
					got = append(got, i)
					tr.Trimmed(cpu)
				}
			}
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

// TestRunTrimsAfterWork drives Run with a CPU clock the test moves: no
// trim while idle from the start, one after work and quiet, and Run ends
// with its context.
func TestRunTrimsAfterWork(t *testing.T) {
	var cpu atomic.Int64
	var trims atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		Run(ctx, Policy{Tick: ms, IdleCPU: ms, IdleTicks: 3, WorkCPU: 10 * ms},
			func() time.Duration { return time.Duration(cpu.Load()) },
			func() { trims.Add(1) })
	}()
	time.Sleep(30 * ms) // many quiet ticks with no work: nothing is due
	assert.Equal(t, trims.Load(), int32(0))
	cpu.Add(int64(50 * ms))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if trims.Load() == 1 {
			return poll.Success()
		}
		return poll.Continue("%d trims", trims.Load())
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(ms))
	time.Sleep(30 * ms) // still quiet: no second trim
	assert.Equal(t, trims.Load(), int32(1))
	cancel()
	wg.Wait()
}

// TestProcessCPUGrows checks the real clock: burning CPU moves it.
func TestProcessCPUGrows(t *testing.T) {
	before := ProcessCPU()
	deadline := time.Now().Add(50 * ms)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	assert.Assert(t, x > 0)
	assert.Assert(t, ProcessCPU() > before)
}
