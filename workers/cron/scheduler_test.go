package cron

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a Clock the test moves: no real waiting.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []fakeTimer
	armed   chan time.Time // each NewTimer's deadline
}

type fakeTimer struct {
	at time.Time
	c  chan time.Time
}

func newFakeClock(now string) *fakeClock {
	t, err := time.Parse(time.RFC3339Nano, now)
	if err != nil {
		panic(err)
	}
	return &fakeClock{now: t, armed: make(chan time.Time, 64)}
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := make(chan time.Time, 1)
	at := f.now.Add(d)
	if d <= 0 {
		c <- f.now
	} else {
		f.waiters = append(f.waiters, fakeTimer{at: at, c: c})
	}
	f.armed <- at
	return c, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for i, w := range f.waiters {
			if w.c == c {
				f.waiters = append(f.waiters[:i], f.waiters[i+1:]...)
				return true
			}
		}
		return false
	}
}

// set moves the clock to t and fires the timers due by then.
func (f *fakeClock) set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = t
	kept := f.waiters[:0]
	for _, w := range f.waiters {
		if !w.at.After(t) {
			w.c <- t
		} else {
			kept = append(kept, w)
		}
	}
	f.waiters = kept
}

// armedAt waits for the scheduler to arm its next timer and returns its
// deadline.
func (f *fakeClock) armedAt(t *testing.T) time.Time {
	t.Helper()
	return waitfor.Recv(t, f.armed, waitfor.Default, "the scheduler to arm its timer")
}

type invocation struct {
	ns, fn   string
	payload  Payload
	metadata string
}

// fakeInvoker records calls; conditions answer from conds (missing:
// fails); block, when set, holds each function call until released.
type fakeInvoker struct {
	mu    sync.Mutex
	conds map[string]string
	calls chan invocation
	block chan struct{}
}

func newInvoker() *fakeInvoker {
	return &fakeInvoker{conds: map[string]string{}, calls: make(chan invocation, 64)}
}

func (f *fakeInvoker) Invoke(ctx context.Context, ns, fn string, payload, md json.RawMessage) (json.RawMessage, error) {
	var p Payload
	if err := json.Unmarshal(payload, &p); err != nil {
		return nil, err
	}
	f.calls <- invocation{ns: ns, fn: fn, payload: p, metadata: string(md)}
	f.mu.Lock()
	ans, isCond := f.conds[fn]
	block := f.block
	f.mu.Unlock()
	if len(fn) > 5 && fn[:5] == "cond:" {
		if !isCond {
			return nil, errors.New("condition failed")
		}
		return json.RawMessage(ans), nil
	}
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return json.RawMessage(`null`), nil
}

func (f *fakeInvoker) next(t *testing.T) invocation {
	t.Helper()
	return waitfor.Recv(t, f.calls, waitfor.Default, "a call")
}

func (f *fakeInvoker) none(t *testing.T) {
	t.Helper()
	select {
	case c := <-f.calls:
		t.Fatalf("unexpected call %+v", c)
	default:
	}
}

func job(t *testing.T, id, expr string) Job {
	t.Helper()
	s, err := Parse(expr)
	assert.NilError(t, err)
	return Job{ID: id, FunctionID: "app::tick", Namespace: "proj", Metadata: json.RawMessage(`{"m":1}`), Schedule: s}
}

// TestSchedulerFires: a job fires at each tick with upstream's payload,
// in its namespace, with its metadata.
func TestSchedulerFires(t *testing.T) {
	clk, inv := newFakeClock("2026-01-01T00:00:00.5Z"), newInvoker()
	s := NewScheduler(SchedulerOptions{Clock: clk, Invoker: inv})
	defer s.Close()
	assert.NilError(t, s.Add(job(t, "j1", "* * * * * *")))
	for i, want := range []string{"2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z", "2026-01-01T00:00:03Z"} {
		at := clk.armedAt(t)
		assert.Check(t, is.Equal(at.Format(time.RFC3339), want), "tick %d", i)
		clk.set(at.Add(12 * time.Millisecond))
		c := inv.next(t)
		assert.Check(t, is.Equal(c, invocation{ns: "proj", fn: "app::tick", metadata: `{"m":1}`,
			payload: Payload{Trigger: "cron", JobID: "j1", ScheduledTime: want, ActualTime: at.Add(12 * time.Millisecond).Format("2006-01-02T15:04:05.000Z")}}))
	}
}

// TestSchedulerNoReplay: ticks missed while a call runs (or while the
// worker was away) are skipped, not replayed; calls of a job never
// overlap.
func TestSchedulerNoReplay(t *testing.T) {
	clk, inv := newFakeClock("2026-01-01T00:00:00Z"), newInvoker()
	inv.block = make(chan struct{})
	s := NewScheduler(SchedulerOptions{Clock: clk, Invoker: inv})
	defer s.Close()
	assert.NilError(t, s.Add(job(t, "j1", "* * * * * *")))
	clk.set(clk.armedAt(t))
	first := inv.next(t)
	assert.Check(t, is.Equal(first.payload.ScheduledTime, "2026-01-01T00:00:01Z"))
	// The call runs for ten ticks: nothing else fires meanwhile.
	clk.set(utc("2026-01-01T00:00:11.3Z"))
	inv.none(t)
	close(inv.block)
	at := clk.armedAt(t)
	assert.Check(t, is.Equal(at.Format(time.RFC3339), "2026-01-01T00:00:12Z"), "the next tick after the call, none of those it spanned")
	clk.set(at)
	assert.Check(t, is.Equal(inv.next(t).payload.ScheduledTime, "2026-01-01T00:00:12Z"))
	inv.none(t)
}

// TestSchedulerCondition: only an answer of false skips; a failing
// condition skips too; anything else fires.
func TestSchedulerCondition(t *testing.T) {
	for _, tc := range []struct {
		answer string // "" = the condition fails
		fires  bool
	}{
		{"false", false}, {"true", true}, {"null", true}, {`{"ok":false}`, true}, {"0", true}, {"", false},
	} {
		t.Run(tc.answer, func(t *testing.T) {
			clk, inv := newFakeClock("2026-01-01T00:00:00Z"), newInvoker()
			if tc.answer != "" {
				inv.conds["cond:ok"] = tc.answer
			}
			s := NewScheduler(SchedulerOptions{Clock: clk, Invoker: inv})
			defer s.Close()
			j := job(t, "j1", "*/2 * * * * *")
			j.Condition = "cond:ok"
			assert.NilError(t, s.Add(j))
			clk.set(clk.armedAt(t))
			c := inv.next(t)
			assert.Check(t, is.Equal(c.fn, "cond:ok"))
			assert.Check(t, is.Equal(c.payload.JobID, "j1"))
			// The next arm means the tick is done.
			clk.armedAt(t)
			if tc.fires {
				assert.Check(t, is.Equal(inv.next(t).fn, "app::tick"))
			}
			inv.none(t)
		})
	}
}

// TestSchedulerRemove: a removed job stops, a call under way is
// cancelled; Add of the same definition is a no-op, of another is
// refused.
func TestSchedulerRemove(t *testing.T) {
	clk, inv := newFakeClock("2026-01-01T00:00:00Z"), newInvoker()
	s := NewScheduler(SchedulerOptions{Clock: clk, Invoker: inv})
	defer s.Close()
	assert.NilError(t, s.Add(job(t, "j1", "* * * * * *")))
	assert.NilError(t, s.Add(job(t, "j1", "* * * * * *")), "the same trigger again (a reconnect)")
	var dup ErrDuplicate
	assert.Assert(t, errors.As(s.Add(job(t, "j1", "*/5 * * * * *")), &dup))
	assert.Check(t, is.Equal(dup.Error(), "cron trigger 'j1' is already registered"))
	clk.set(clk.armedAt(t))
	inv.next(t)
	clk.armedAt(t)
	s.mu.Lock()
	r := s.jobs["j1"]
	s.mu.Unlock()
	assert.Check(t, s.Remove("j1"))
	assert.Check(t, !s.Remove("j1"))
	waitfor.Closed(t, r.done, waitfor.Default, "the job's loop to end")
	clk.set(clk.Now().Add(time.Hour))
	inv.none(t)
	assert.Check(t, is.Equal(s.Len(), 0))
}

// TestSchedulerClockBack: a wall clock stepped back never fires a tick
// twice.
func TestSchedulerClockBack(t *testing.T) {
	clk, inv := newFakeClock("2026-01-01T00:00:09Z"), newInvoker()
	inv.block = make(chan struct{})
	s := NewScheduler(SchedulerOptions{Clock: clk, Invoker: inv})
	defer s.Close()
	assert.NilError(t, s.Add(job(t, "j1", "*/10 * * * * *")))
	clk.set(clk.armedAt(t))
	assert.Check(t, is.Equal(inv.next(t).payload.ScheduledTime, "2026-01-01T00:00:10Z"))
	clk.set(utc("2026-01-01T00:00:05Z"))
	close(inv.block)
	at := clk.armedAt(t)
	assert.Check(t, is.Equal(at.Format(time.RFC3339), "2026-01-01T00:00:20Z"), "not 00:00:10 again")
}

// TestTwoSchedulersOneLock: two workers sharing the local lock fire each
// tick once between them.
func TestTwoSchedulersOneLock(t *testing.T) {
	dir := t.TempDir()
	clk, inv := newFakeClock("2026-01-01T00:00:00Z"), newInvoker()
	for range 2 {
		l, err := OpenFileLock(dir)
		assert.NilError(t, err)
		s := NewScheduler(SchedulerOptions{Clock: clk, Invoker: inv, Lock: l})
		defer s.Close()
		assert.NilError(t, s.Add(job(t, "j1", "* * * * * *")))
	}
	seen := map[string]int{}
	a, b := clk.armedAt(t), clk.armedAt(t)
	for range 5 {
		assert.Check(t, a.Equal(b))
		clk.set(a)
		c := inv.next(t)
		seen[c.payload.ScheduledTime]++
		// Both armed again: the loser claimed and lost, the winner fired.
		a, b = clk.armedAt(t), clk.armedAt(t)
		inv.none(t)
	}
	assert.Check(t, is.Len(seen, 5))
	for k, n := range seen {
		assert.Check(t, is.Equal(n, 1), k)
	}
}

func TestFileLockClaims(t *testing.T) {
	dir := t.TempDir()
	l1, err := OpenFileLock(dir)
	assert.NilError(t, err)
	l2, err := OpenFileLock(dir)
	assert.NilError(t, err)
	ctx := context.Background()
	t1, t2 := utc("2026-01-01T00:00:01Z"), utc("2026-01-01T00:00:02Z")
	for _, tc := range []struct {
		l    *FileLock
		job  string
		tick time.Time
		won  bool
	}{
		{l1, "a", t1, true}, {l2, "a", t1, false}, {l1, "a", t1, false},
		{l2, "b", t1, true}, {l2, "a", t2, true}, {l1, "a", t2, false}, {l1, "a", t1, false},
	} {
		won, err := tc.l.Claim(ctx, tc.job, tc.tick)
		assert.NilError(t, err)
		assert.Check(t, is.Equal(won, tc.won), "%s %s", tc.job, tc.tick)
	}
	// Concurrent claimants of one tick: exactly one wins.
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	t3 := utc("2026-01-01T00:00:03Z")
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := l1
			if i%2 == 1 {
				l = l2
			}
			won, err := l.Claim(ctx, "a", t3)
			assert.Check(t, err)
			mu.Lock()
			if won {
				wins++
			}
			mu.Unlock()
		}()
	}
	waitfor.Group(t, &wg, waitfor.Default, "the claimants")
	assert.Check(t, is.Equal(wins, 1))
}

// TestTriggers: the provider side's errors are upstream's, with the code.
func TestTriggers(t *testing.T) {
	clk, inv := newFakeClock("2026-01-01T00:00:00Z"), newInvoker()
	s := NewScheduler(SchedulerOptions{Clock: clk, Invoker: inv})
	defer s.Close()
	tr := Triggers{S: s}
	ctx := context.Background()
	reg := func(id, cfg string) client.TriggerRegistration {
		return client.TriggerRegistration{ID: id, TriggerType: TriggerType, FunctionID: "app::tick", Config: json.RawMessage(cfg)}
	}
	for _, tc := range []struct{ cfg, code, msg string }{
		{`{}`, CodeInvalidCronExpression, "INVALID_CRON_EXPRESSION: Cron expression is required"},
		{`null`, CodeInvalidCronExpression, "INVALID_CRON_EXPRESSION: Cron expression is required"},
		{`{"expression":""}`, CodeInvalidCronExpression, "INVALID_CRON_EXPRESSION: Cron expression is required"},
		{`{"expression":"* * * * *"}`, CodeInvalidCronExpression, "INVALID_CRON_EXPRESSION: invalid cron expression '* * * * *': 5 fields"},
		{`{"expression":"not cron at all!"}`, CodeInvalidCronExpression, "INVALID_CRON_EXPRESSION: invalid cron expression 'not cron at all!': 4 fields"},
		{`{"expression":5}`, CodeInvalidCronExpression, "Failed to parse trigger config"},
		{`[]`, CodeInvalidCronExpression, "Failed to parse trigger config"},
	} {
		err := tr.RegisterTrigger(ctx, reg("bad", tc.cfg))
		var eb *protocol.ErrorBody
		assert.Assert(t, errors.As(err, &eb), tc.cfg)
		assert.Check(t, is.Equal(eb.Code, tc.code), tc.cfg)
		assert.Check(t, is.Contains(eb.Message, tc.msg), tc.cfg)
	}
	assert.NilError(t, tr.RegisterTrigger(ctx, reg("t1", `{"expression":"0 * * * * *","condition_function_id":"cond:x"}`)))
	err := tr.RegisterTrigger(ctx, reg("t1", `{"expression":"1 * * * * *"}`))
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb))
	assert.Check(t, is.Equal(eb.Code, CodeAlreadyRegistered))
	assert.Check(t, is.Equal(eb.Message, "cron trigger 't1' is already registered"))
	assert.Check(t, is.Equal(s.Len(), 1))
	assert.NilError(t, tr.UnregisterTrigger(ctx, reg("t1", "")))
	assert.Check(t, is.Equal(s.Len(), 0))
}

// TestPruneAfterReconnect: jobs the engine sent again on the new
// connection stay; the others (their triggers went away meanwhile) go.
func TestPruneAfterReconnect(t *testing.T) {
	clk, inv := newFakeClock("2026-01-01T00:00:00Z"), newInvoker()
	s := NewScheduler(SchedulerOptions{Clock: clk, Invoker: inv})
	defer s.Close()
	for _, id := range []string{"kept", "gone"} {
		j := job(t, id, "0 0 * * * *")
		j.Session = "w1"
		assert.NilError(t, s.Add(j))
	}
	// Reconnected as w2: the engine sends "kept" again.
	j := job(t, "kept", "0 0 * * * *")
	j.Session = "w2"
	assert.NilError(t, s.Add(j))
	assert.Check(t, is.DeepEqual(s.Prune("w2"), []string{"gone"}))
	assert.Check(t, is.Equal(s.Len(), 1))
	assert.Check(t, is.Len(s.Prune("w2"), 0))
}

func TestSweeperDue(t *testing.T) {
	t0 := utc("2026-01-01T00:00:00Z")
	var w sweeper
	for i, tc := range []struct {
		cur  string
		at   time.Duration
		want string
		ok   bool
	}{
		{"", 0, "", false},
		{"w1", 5 * time.Second, "", false},
		{"w1", 30 * time.Second, "", false},
		{"w1", 35 * time.Second, "w1", true},
		{"w1", 40 * time.Second, "", false}, // once per connection
		{"w2", 45 * time.Second, "", false},
		{"w2", 70 * time.Second, "", false},
		{"w2", 75 * time.Second, "w2", true},
	} {
		cur, ok := w.due(tc.cur, t0.Add(tc.at))
		assert.Check(t, is.Equal(cur, tc.want), "step %d", i)
		assert.Check(t, is.Equal(ok, tc.ok), "step %d", i)
	}
}
