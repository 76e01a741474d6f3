package configuration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// recorder collects events as one-line strings.
type recorder struct {
	mu  sync.Mutex
	got []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, s)
}

func (r *recorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

func (r *recorder) waitFor(t *testing.T, want ...string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if got := r.list(); len(got) < len(want) {
			return poll.Continue("%d events so far, want %d: %q", len(got), len(want), got)
		}
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(2*time.Millisecond))
	assert.DeepEqual(t, r.list(), want)
}

func eventLine(ev Event) string {
	s := fmt.Sprintf("%s %s old=%s new=%s", ev.EventType, ev.ID, ev.OldValue, ev.NewValue)
	if ev.Metadata != nil {
		s += " meta=" + string(ev.Metadata)
	}
	return s
}

// TestSubscribe: register, ensure, set and hand edits reach a subscriber
// in order with expanded values; reads and failed changes do not; cancel
// stops the calls.
func TestSubscribe(t *testing.T) {
	f := newWorker(t, env{"PORT": "7000"})
	ctx := context.Background()
	var rec recorder
	var first Event
	var once sync.Once
	cancel := f.w.Subscribe(func(ev Event) {
		once.Do(func() { first = ev })
		rec.add(eventLine(ev))
	})

	_, err := f.w.Register(ctx, RegisterRequest{ID: "http", Name: "HTTP", Description: "listener",
		Schema: json.RawMessage(portSchema), InitialValue: json.RawMessage(`{"port":"${PORT:3111}"}`), Metadata: json.RawMessage(`{"team":"a"}`)})
	assert.NilError(t, err)
	f.register(t, "http", portSchema, "") // unchanged re-register: updated, as upstream
	_, _, err = f.w.Set(ctx, "http", json.RawMessage(`{"port":8080}`))
	assert.NilError(t, err)
	_, _, err = f.w.Set(ctx, "http", json.RawMessage(`{"port":-1}`)) // refused: no event
	assert.Assert(t, err != nil)
	_, err = f.w.Get(ctx, "http", false) // reads never fire
	assert.NilError(t, err)
	_, err = f.w.Ensure(ctx, RegisterRequest{ID: "http", Schema: json.RawMessage(portSchema), InitialValue: json.RawMessage(`{"port":1}`)})
	assert.NilError(t, err)
	assert.NilError(t, f.w.SetInMemory("mem", json.RawMessage(`1`))) // in-memory: no event

	rec.waitFor(t,
		`configuration:registered http old=null new={"port":7000} meta={"team":"a"}`,
		`configuration:updated http old={"port":7000} new={"port":7000}`,
		`configuration:updated http old={"port":7000} new={"port":8080}`,
		`configuration:updated http old={"port":8080} new={"port":8080}`,
	)
	assert.DeepEqual(t, first, Event{EventType: EventRegistered, ID: "http", Name: "HTTP", Description: "listener",
		Schema: json.RawMessage(portSchema), OldValue: json.RawMessage(`null`), NewValue: json.RawMessage(`{"port":7000}`), Metadata: json.RawMessage(`{"team":"a"}`)})

	// Hand edits: an edit is updated, a new file registered, a removed
	// file deleted; a rejected edit fires nothing.
	rec = recorder{}
	write := func(id, body string) {
		assert.NilError(t, os.WriteFile(filepath.Join(f.dir, id+".yaml"), []byte(body), 0o600))
	}
	write("http", "id: http\nname: HTTP\ndescription: listener\nvalue:\n  port: 8081\n")
	poll.WaitOn(t, valueIs(f, "http", `{"port":8081}`))
	write("http", "id: http\nvalue:\n  port: nope\n")
	poll.WaitOn(t, logContains(f, "does not match the schema", 1))
	write("extra", "id: extra\nvalue: [1]\n")
	poll.WaitOn(t, valueIs(f, "extra", `[1]`))
	assert.NilError(t, os.Remove(filepath.Join(f.dir, "extra.yaml")))
	rec.waitFor(t,
		`configuration:updated http old={"port":8080} new={"port":8081}`,
		`configuration:registered extra old=null new=[1]`,
		`configuration:deleted extra old=[1] new=null`,
	)

	// A witness subscribed throughout shows when the next event has been
	// delivered; the cancelled subscriber must not have had it by then.
	var witness recorder
	defer f.w.Subscribe(func(ev Event) { witness.add(eventLine(ev)) })()
	waitfor.Func(t, waitfor.Default, "cancel to return", cancel)
	waitfor.Func(t, waitfor.Default, "a second cancel to return", cancel) // twice is fine
	_, _, err = f.w.Set(ctx, "http", json.RawMessage(`{"port":9}`))
	assert.NilError(t, err)
	witness.waitFor(t, `configuration:updated http old={"port":8081} new={"port":9}`)
	assert.Equal(t, len(rec.list()), 3, "no event after cancel")
}

// TestSubscribeSlow: a subscriber that does not return never delays Set;
// its queue keeps the newest events and drops the oldest (logged); cancel
// waits for the running call; other subscribers are not held up.
func TestSubscribeSlow(t *testing.T) {
	f := newWorker(t, nil)
	ctx := context.Background()
	f.register(t, "n", `{"type":"integer"}`, "0")

	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseSlow := func() { releaseOnce.Do(func() { close(release) }) }
	// Runs before the worker's Close (cleanups run last-in first-out), so
	// a failure below cannot leave Close waiting on the held subscriber.
	t.Cleanup(releaseSlow)
	entered := make(chan struct{}, 1)
	var slow recorder
	cancelSlow := f.w.Subscribe(func(ev Event) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		slow.add(string(ev.NewValue))
	})
	var fast recorder
	cancelFast := f.w.Subscribe(func(ev Event) { fast.add(string(ev.NewValue)) })
	defer cancelFast()

	_, _, err := f.w.Set(ctx, "n", json.RawMessage(`-1`))
	assert.NilError(t, err)
	waitfor.Recv(t, entered, waitfor.Default, "the slow subscriber to hold event -1")
	// Set never waits for a subscriber: every Set returns while the slow
	// one still holds its event. (A Set that waited would block here until
	// the deadline; no timing is asserted.)
	const n = eventQueueLimit + 10
	setsDone := make(chan error, 1)
	go func() {
		for i := 1; i <= n; i++ {
			if _, _, err := f.w.Set(ctx, "n", json.RawMessage(fmt.Sprint(i))); err != nil {
				setsDone <- err
				return
			}
		}
		setsDone <- nil
	}()
	assert.NilError(t, waitfor.Recv(t, setsDone, waitfor.Default, "every Set to return while the slow subscriber holds its event"))
	// The other subscriber is not held up: it sees the last Set while the
	// slow one still blocks, and everything it saw is in order.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		got := fast.list()
		if len(got) == 0 || got[len(got)-1] != fmt.Sprint(n) {
			return poll.Continue("fast subscriber saw %d events", len(got))
		}
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(2*time.Millisecond))
	prev := -2
	for _, s := range fast.list() {
		var v int
		_, err := fmt.Sscan(s, &v)
		assert.NilError(t, err)
		assert.Assert(t, v > prev, "out of order: %d after %d", v, prev)
		prev = v
	}

	releaseSlow()
	var wantSlow []string
	wantSlow = append(wantSlow, "-1")
	for i := n - eventQueueLimit + 1; i <= n; i++ {
		wantSlow = append(wantSlow, fmt.Sprint(i))
	}
	slow.waitFor(t, wantSlow...)
	poll.WaitOn(t, logContains(f, "events dropped", 1))

	// cancel returns once the running call has returned.
	release2 := make(chan struct{})
	running := make(chan struct{})
	var returned sync.WaitGroup
	returned.Add(1)
	cancelBlock := f.w.Subscribe(func(Event) {
		close(running)
		<-release2
		returned.Done()
	})
	_, _, err = f.w.Set(ctx, "n", json.RawMessage(`0`))
	assert.NilError(t, err)
	waitfor.Closed(t, running, waitfor.Default, "the blocking callback to run")
	cancelled := make(chan struct{})
	go func() { cancelBlock(); close(cancelled) }()
	select {
	case <-cancelled:
		t.Fatal("cancel returned while the callback was running")
	case <-time.After(20 * time.Millisecond):
	}
	close(release2)
	waitfor.Closed(t, cancelled, waitfor.Default, "cancel to return once the callback returned")
	waitfor.Group(t, &returned, waitfor.Default, "the released callback to return")
	waitfor.Func(t, waitfor.Default, "the slow subscriber's cancel to return", cancelSlow)

	// A callback may cancel itself.
	var self func()
	done := make(chan struct{})
	self = f.w.Subscribe(func(Event) { self(); close(done) })
	_, _, err = f.w.Set(ctx, "n", json.RawMessage(`1`))
	assert.NilError(t, err)
	waitfor.Closed(t, done, waitfor.Default, "the callback that cancels itself to return")
}

// TestSubscribeAfterClose: Close ends every subscription; a later
// Subscribe is a no-op.
func TestSubscribeAfterClose(t *testing.T) {
	f := newWorker(t, nil)
	called := make(chan struct{}, 1)
	cancel := f.w.Subscribe(func(Event) { called <- struct{}{} })
	f.w.Close()
	cancel()
	cancel2 := f.w.Subscribe(func(Event) { called <- struct{}{} })
	cancel2()
	select {
	case <-called:
		t.Fatal("called after Close")
	default:
	}
}

// TestSubscribeSwapStore: a store switch reports the entries whose value
// it changed.
func TestSubscribeSwapStore(t *testing.T) {
	ctx := context.Background()
	f := newWorker(t, nil)
	f.register(t, "http", portSchema, `{"port": 1}`)
	f.register(t, "same", `{"type":"integer"}`, `7`)
	_, err := f.w.Ensure(ctx, RegisterRequest{ID: "gone", Schema: json.RawMessage(`true`), InitialValue: json.RawMessage(`1`)})
	assert.NilError(t, err)
	var rec recorder
	defer f.w.Subscribe(func(ev Event) { rec.add(eventLine(ev)) })()

	other := filepath.Join(t.TempDir(), "other")
	assert.NilError(t, os.MkdirAll(other, 0o755))
	writeFile(t, filepath.Join(other, "http.yaml"), "id: http\nvalue: {port: 2}\n")
	writeFile(t, filepath.Join(other, "same.yaml"), "id: same\nvalue: 7\n")
	writeFile(t, filepath.Join(other, "new.yaml"), "id: new\nvalue: x\n")
	assert.NilError(t, f.w.SwapStore(ctx, NewFSStore(FSOptions{Dir: other})))
	rec.waitFor(t,
		`configuration:deleted gone old=1 new=null`,
		`configuration:updated http old={"port":1} new={"port":2}`,
		`configuration:registered new old=null new="x"`,
	)
}
