package dropqueue

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
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
	deadline := time.Now().Add(5 * time.Second)
	for {
		q.mu.Lock()
		n := len(q.queue)
		q.mu.Unlock()
		if n == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	for v := 1; v <= 10; v++ {
		assert.Assert(t, q.Push(v))
	}
	assert.Assert(t, time.Since(start) < time.Second, "Push waited for the consumer")
	close(release)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == 4 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	q.Stop()
	q.Wait()
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
	<-done
	wg.Wait()
	assert.Equal(t, calls, 1)
}
