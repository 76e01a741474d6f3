package cron

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Clock is the scheduler's time: the real one in the worker, a fake one
// in unit tests (no real waiting there).
type Clock interface {
	Now() time.Time
	// NewTimer fires once on its channel after d; stop releases it.
	NewTimer(d time.Duration) (c <-chan time.Time, stop func() bool)
}

// RealClock is time's clock.
type RealClock struct{}

// Now is time.Now.
func (RealClock) Now() time.Time { return time.Now() }

// NewTimer is time.NewTimer.
func (RealClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

var _ Clock = RealClock{}

// Invoker calls a function through the engine: a trigger's condition and
// function, in the trigger's namespace, with its metadata.
type Invoker interface {
	Invoke(ctx context.Context, namespace, functionID string, payload, metadata json.RawMessage) (json.RawMessage, error)
}

// Lock decides which cron worker fires a tick: Claim answers true to
// exactly one claimant of (job, tick) among the workers sharing it.
type Lock interface {
	Claim(ctx context.Context, jobID string, tick time.Time) (bool, error)
	Close() error
}

// Job is a registered cron trigger.
type Job struct {
	ID         string // the trigger's id: the payload's job_id
	FunctionID string
	Namespace  string // the target function's ("" = default)
	Metadata   json.RawMessage
	Condition  string // condition_function_id ("" = none)
	Schedule   *Schedule
	// Session is the provider connection (its worker id) the engine
	// sent the binding on; not part of the definition.
	Session string
}

func (j Job) same(o Job) bool {
	return j.ID == o.ID && j.FunctionID == o.FunctionID && j.Namespace == o.Namespace &&
		bytes.Equal(j.Metadata, o.Metadata) && j.Condition == o.Condition && j.Schedule.String() == o.Schedule.String()
}

// Payload is what a cron trigger's function receives (upstream's).
type Payload struct {
	Trigger       string `json:"trigger"`
	JobID         string `json:"job_id"`
	ScheduledTime string `json:"scheduled_time"`
	ActualTime    string `json:"actual_time"`
}

// actualFormat is RFC 3339 with milliseconds (the jitter is visible).
const actualFormat = "2006-01-02T15:04:05.000Z07:00"

// callTimeout bounds a condition or a trigger call; a tick that comes
// while a call runs is skipped.
const callTimeout = 5 * time.Minute

// Scheduler runs the jobs: one goroutine each, firing serially.
type Scheduler struct {
	clock   Clock
	invoker Invoker
	lock    Lock
	log     hclog.Logger
	// OnFire, when set, is told of each fire (tests, benchmarks).
	onFire func(Job, time.Time, time.Time)

	mu     sync.Mutex
	jobs   map[string]*running
	closed bool
	wg     sync.WaitGroup
}

type running struct {
	job    Job
	cancel context.CancelFunc
	done   chan struct{}
}

// SchedulerOptions configure NewScheduler.
type SchedulerOptions struct {
	Clock   Clock   // default RealClock
	Invoker Invoker // required
	Lock    Lock    // default: none (every tick fires)
	Logger  hclog.Logger
	// OnFire is told of each fire after its call returns (tests,
	// benchmarks): the tick and the time the fire began.
	OnFire func(job Job, scheduled, actual time.Time)
}

// NewScheduler makes a scheduler with no jobs.
func NewScheduler(o SchedulerOptions) *Scheduler {
	if o.Clock == nil {
		o.Clock = RealClock{}
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Lock == nil {
		o.Lock = noLock{}
	}
	return &Scheduler{clock: o.Clock, invoker: o.Invoker, lock: o.Lock, log: o.Logger, onFire: o.OnFire, jobs: map[string]*running{}}
}

// ErrDuplicate is Add's answer for an id already scheduled with a
// different definition.
type ErrDuplicate struct{ ID string }

func (e ErrDuplicate) Error() string { return "cron trigger '" + e.ID + "' is already registered" }

// Add schedules j. The same definition again only records its session
// (the engine sends a provider its bindings again after a reconnect); a
// different one under the same id is ErrDuplicate, as upstream's.
func (s *Scheduler) Add(j Job) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return context.Canceled
	}
	if r, ok := s.jobs[j.ID]; ok {
		if r.job.same(j) {
			r.job.Session = j.Session
			return nil
		}
		return ErrDuplicate{ID: j.ID}
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{job: j, cancel: cancel, done: make(chan struct{})}
	s.jobs[j.ID] = r
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(r.done)
		s.run(ctx, j)
	}()
	return nil
}

// Remove stops a job (a call under way is cancelled). It does not wait.
func (s *Scheduler) Remove(id string) bool {
	s.mu.Lock()
	r, ok := s.jobs[id]
	delete(s.jobs, id)
	s.mu.Unlock()
	if ok {
		r.cancel()
	}
	return ok
}

// Prune removes the jobs last sent on another session than current: after
// a reconnect the engine sends the provider every binding that still
// exists, so a job not sent again belongs to a trigger that went away
// while the connection was down. It returns the ids removed.
func (s *Scheduler) Prune(current string) []string {
	s.mu.Lock()
	var gone []string
	for id, r := range s.jobs {
		if r.job.Session != current {
			gone = append(gone, id)
			r.cancel()
			delete(s.jobs, id)
		}
	}
	s.mu.Unlock()
	return gone
}

// Len is how many jobs are scheduled.
func (s *Scheduler) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.jobs)
}

// Close stops every job and waits for their goroutines.
func (s *Scheduler) Close() {
	s.mu.Lock()
	s.closed = true
	for id, r := range s.jobs {
		r.cancel()
		delete(s.jobs, id)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// run is one job's loop: wait for the next tick after now, claim it,
// fire and wait for the call; then the next tick after the new now. So
// ticks missed while the worker was down, or while a call ran, are
// skipped, never replayed, and one job's fires never overlap.
func (s *Scheduler) run(ctx context.Context, j Job) {
	var last time.Time
	for {
		now := s.clock.Now()
		from := now
		if from.Before(last) {
			// The wall clock stepped back: never fire a tick twice.
			from = last
		}
		at, ok := j.Schedule.Next(from)
		if !ok {
			s.log.Warn("cron expression has no time left to fire; the job stays idle", "job_id", j.ID, "expression", j.Schedule.String())
			<-ctx.Done()
			return
		}
		c, stop := s.clock.NewTimer(at.Sub(now))
		select {
		case <-ctx.Done():
			stop()
			return
		case <-c:
		}
		last = at
		actual := s.clock.Now()
		won, err := s.lock.Claim(ctx, j.ID, at)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("cron lock unavailable; tick skipped", "job_id", j.ID, "tick", at, "error", err)
			continue
		}
		if !won {
			s.log.Debug("tick fired by another cron worker", "job_id", j.ID, "tick", at)
			continue
		}
		s.fire(ctx, j, at, actual)
	}
}

// fire runs the condition (an answer of false skips the tick; a failing
// condition skips it too, logged) and the function.
func (s *Scheduler) fire(ctx context.Context, j Job, at, actual time.Time) {
	payload, _ := json.Marshal(Payload{Trigger: TriggerType, JobID: j.ID,
		ScheduledTime: at.UTC().Format(time.RFC3339), ActualTime: actual.UTC().Format(actualFormat)})
	if j.Condition != "" {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		out, err := s.invoker.Invoke(cctx, j.Namespace, j.Condition, payload, j.Metadata)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("cron condition failed; tick skipped", "job_id", j.ID, "condition_function_id", j.Condition, "error", err)
			}
			return
		}
		if bytes.Equal(bytes.TrimSpace(out), []byte("false")) {
			s.log.Debug("cron condition false; tick skipped", "job_id", j.ID)
			return
		}
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	_, err := s.invoker.Invoke(cctx, j.Namespace, j.FunctionID, payload, j.Metadata)
	cancel()
	if err != nil && ctx.Err() == nil {
		s.log.Warn("cron function failed", "job_id", j.ID, "function_id", j.FunctionID, "error", err)
	}
	if s.onFire != nil {
		s.onFire(j, at, actual)
	}
}

type noLock struct{}

func (noLock) Claim(context.Context, string, time.Time) (bool, error) { return true, nil }
func (noLock) Close() error                                           { return nil }
