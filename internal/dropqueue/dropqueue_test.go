package dropqueue

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestOrderAndDropOldest: values arrive in order; with the consumer
// blocked, pushes never wait, the oldest beyond the limit are dropped and
// the drop is reported before the next delivery.
func TestOrderAndDropOldest(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var got []int
	var dropped int
	q := Start(nil, 3, func(v int) {
		if v == 0 {
			<-release
		}
		mu.Lock()
		got = append(got, v)
		mu.Unlock()
	}, func(n int) {
		mu.Lock()
		dropped += n
		mu.Unlock()
	})
	assert.Assert(t, q.Push(0))
	// Wait until 0 is being delivered, so the queue is empty.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		q.mu.Lock()
		defer q.mu.Unlock()
		if n := len(q.queue); n != 0 {
			return poll.Continue("%d queued, 0 not taken yet", n)
		}
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(time.Millisecond))
	// A Push that waited for the held consumer would never return; no
	// timing is asserted.
	pushed := make(chan bool, 1)
	go func() {
		ok := true
		for v := 1; v <= 10; v++ {
			ok = q.Push(v) && ok
		}
		pushed <- ok
	}()
	assert.Assert(t, waitfor.Recv(t, pushed, waitfor.Default, "ten Pushes while the consumer is held"))
	close(release)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		mu.Lock()
		defer mu.Unlock()
		if len(got) < 4 {
			return poll.Continue("delivered %v, want 4 values", got)
		}
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(time.Millisecond))
	q.Stop()
	waitfor.Func(t, waitfor.Default, "the stopped queue's consumer to end", q.Wait)
	assert.DeepEqual(t, got, []int{0, 8, 9, 10})
	assert.Equal(t, dropped, 7)
	assert.Assert(t, !q.Push(11), "a stopped queue takes nothing")
}

// TestWaitFromWithinDelivery: a delivery that stops its own queue and
// waits does not deadlock, and it is the last delivery.
func TestWaitFromWithinDelivery(t *testing.T) {
	var wg sync.WaitGroup
	var q *Queue[int]
	var calls int
	done := make(chan struct{})
	q = Start(&wg, 8, func(v int) {
		calls++
		q.Stop()
		q.Wait()
		close(done)
	}, nil)
	q.Push(1)
	q.Push(2)
	waitfor.Closed(t, done, waitfor.Default, "the delivery that stops its own queue to return from Wait")
	waitfor.Group(t, &wg, waitfor.Default, "the queue's goroutine to end")
	assert.Equal(t, calls, 1)
}
