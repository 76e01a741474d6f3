// Package dropqueue delivers values one at a time, in order, from a
// goroutine of its own, and never makes the producer wait: when the
// consumer falls Limit values behind, the oldest waiting value is dropped
// and counted. Event fan-out (configuration and stream triggers) uses it so
// that a slow or re-entrant subscriber can lose events but never stall a
// write, nor deadlock one that its own delivery makes.
package dropqueue

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
)

// Queue is one consumer's bounded queue and the goroutine draining it.
type Queue[T any] struct {
	limit   int
	deliver func(T)
	onDrop  func(dropped int)

	mu      sync.Mutex
	queue   []T
	dropped int
	stopped bool
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	gid     uint64 // the delivering goroutine
	gidSet  chan struct{}
	halt    sync.Once
}

// Start starts a queue delivering each pushed value to deliver. At most
// limit values wait; beyond that the oldest is dropped, and onDrop (when
// not nil) is told how many were dropped before the next delivery. When wg
// is not nil the queue's goroutine is counted in it, so an owner of many
// queues can wait for all of them, stopped ones included.
func Start[T any](wg *sync.WaitGroup, limit int, deliver func(T), onDrop func(dropped int)) *Queue[T] {
	if limit < 1 {
		limit = 1
	}
	q := &Queue[T]{
		limit: limit, deliver: deliver, onDrop: onDrop,
		wake: make(chan struct{}, 1), stop: make(chan struct{}),
		done: make(chan struct{}), gidSet: make(chan struct{}),
	}
	if wg != nil {
		wg.Add(1)
	}
	go func() {
		if wg != nil {
			defer wg.Done()
		}
		q.run()
	}()
	return q
}

// Push queues v; it never blocks. false when the queue is stopped (v is
// not delivered).
func (q *Queue[T]) Push(v T) bool {
	q.mu.Lock()
	if q.stopped {
		q.mu.Unlock()
		return false
	}
	if len(q.queue) >= q.limit {
		var zero T
		q.queue[0] = zero
		q.queue = q.queue[1:]
		q.dropped++
	}
	q.queue = append(q.queue, v)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return true
}

// Stop ends deliveries: the waiting values are discarded and none starts
// after the one running, if any. It does not wait; see Wait.
func (q *Queue[T]) Stop() {
	q.halt.Do(func() {
		q.mu.Lock()
		q.stopped = true
		q.queue = nil
		q.mu.Unlock()
		close(q.stop)
	})
}

// Wait returns once the queue's goroutine has ended (after Stop), unless
// called from within a delivery, which cannot wait for itself: then it
// returns at once and the running delivery is the last.
func (q *Queue[T]) Wait() {
	select {
	case <-q.done:
		return
	case <-q.gidSet:
	}
	if q.gid == goroutineID() {
		return
	}
	<-q.done
}

func (q *Queue[T]) run() {
	defer close(q.done)
	q.gid = goroutineID()
	close(q.gidSet)
	for {
		select {
		case <-q.stop:
			return
		case <-q.wake:
		}
		for {
			q.mu.Lock()
			if q.stopped || len(q.queue) == 0 {
				q.mu.Unlock()
				break
			}
			v := q.queue[0]
			var zero T
			q.queue[0] = zero
			q.queue = q.queue[1:]
			dropped := q.dropped
			q.dropped = 0
			q.mu.Unlock()
			if dropped > 0 && q.onDrop != nil {
				q.onDrop(dropped)
			}
			q.deliver(v)
		}
	}
}

// goroutineID reads the current goroutine's id from its stack header
// ("goroutine 42 [running]:"). Wait uses it only to tell whether it runs
// inside a delivery.
func goroutineID() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
}
