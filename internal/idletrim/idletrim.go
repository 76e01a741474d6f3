// Package idletrim gives memory back once a long-running process has gone
// idle after doing work.
//
// An engine that served calls keeps resident the pages of its binary that
// the calls touched, and heap the calls freed, long after the last call: an
// idle engine held 18.4 MiB after 20 calls against 12.4 MiB once started
// (BENCHMARKS.md, P7). The start-up release (exepages) happens once; this
// repeats it, and returns freed heap to the system, each time a busy
// period is followed by a quiet one. What the process uses again maps back
// at a minor fault; a process that stays busy is never trimmed, and an
// idle one is trimmed once, not on every tick.
//
// Activity is measured as the process's own CPU time, so no part of the
// process has to report what it is doing.
package idletrim

import (
	"context"
	"time"
)

// Policy says when a process counts as having worked and then gone idle.
type Policy struct {
	// Tick is how often the CPU time is sampled.
	Tick time.Duration
	// IdleCPU is the most CPU time a tick may use for the process to count
	// as idle over it: an idle engine's timers (the config file's watch,
	// heartbeats, the runtime) use 1.5–3 ms a second, more on a loaded
	// machine.
	IdleCPU time.Duration
	// IdleTicks is how many idle ticks in a row come before a trim.
	IdleTicks int
	// WorkCPU is the least CPU time, used in busy ticks since the last
	// trim, that makes a trim worth its cost (a collection and a walk of
	// the mappings). Idle ticks never add up to work: an idle process is
	// trimmed once, not every few seconds.
	WorkCPU time.Duration
}

// DefaultPolicy trims after five quiet seconds (at most 5 ms of CPU each:
// an idle engine uses 1–2.5 ms) that follow at least 10 ms of work. 20
// calls of `iii call` cost an engine 23–42 ms, spread over ticks of 5–12
// ms each: a higher bar for a busy tick counted some of them as quiet.
func DefaultPolicy() Policy {
	return Policy{Tick: time.Second, IdleCPU: 5 * time.Millisecond, IdleTicks: 5, WorkCPU: 10 * time.Millisecond}
}

// Trimmer decides, from successive CPU-time samples, when to trim.
type Trimmer struct {
	policy   Policy
	last     time.Duration // CPU time at the previous sample
	work     time.Duration // CPU time of the busy ticks since the last trim
	idleRuns int
}

// NewTrimmer starts counting from cpu, the process's CPU time now. The
// process is taken as freshly trimmed: its start-up release is its own
// business.
func NewTrimmer(p Policy, cpu time.Duration) *Trimmer {
	return &Trimmer{policy: p, last: cpu}
}

// Observe takes the CPU time at a tick and reports whether to trim now.
func (t *Trimmer) Observe(cpu time.Duration) bool {
	used := cpu - t.last
	t.last = cpu
	if used > t.policy.IdleCPU {
		t.work += used
		t.idleRuns = 0
		return false
	}
	t.idleRuns++
	return t.idleRuns >= t.policy.IdleTicks && t.work >= t.policy.WorkCPU
}

// Trimmed records the CPU time once a trim is done, so the trim's own
// cost does not count as work.
func (t *Trimmer) Trimmed(cpu time.Duration) {
	t.last, t.work, t.idleRuns = cpu, 0, 0
}

// Run samples cpu every policy tick until ctx ends and calls trim after
// each busy period that went quiet. cpu and trim are the process's: the
// tests pass their own.
func Run(ctx context.Context, p Policy, cpu func() time.Duration, trim func()) {
	t := NewTrimmer(p, cpu())
	tick := time.NewTicker(p.Tick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if t.Observe(cpu()) {
				trim()
				t.Trimmed(cpu())
			}
		}
	}
}
