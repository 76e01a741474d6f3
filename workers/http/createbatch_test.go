package httpworker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// fakeCreates answers create calls with channels named after the specs'
// content, once gate lets each call through.
type fakeCreates struct {
	gate     chan struct{}
	calls    atomic.Int32
	inFlight atomic.Int32
	maxSeen  atomic.Int32
	maxBatch atomic.Int32
	fail     error

	mu       sync.Mutex
	dropped  []protocol.StreamChannelRef
	released int
}

func (f *fakeCreates) create(ctx context.Context, specs ...client.ChannelSpec) ([]client.ChannelPair, error) {
	f.calls.Add(1)
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for m := f.maxSeen.Load(); n > m && !f.maxSeen.CompareAndSwap(m, n); m = f.maxSeen.Load() {
	}
	for m := f.maxBatch.Load(); int32(len(specs)) > m && !f.maxBatch.CompareAndSwap(m, int32(len(specs))); m = f.maxBatch.Load() {
	}
	select {
	case <-f.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if f.fail != nil {
		return nil, f.fail
	}
	out := make([]client.ChannelPair, len(specs))
	for i := range specs {
		id := fmt.Sprintf("%s#%d", specs[i-i%2].Content, i%2) // named after the request's body
		out[i] = client.ChannelPair{Writer: protocol.StreamChannelRef{ChannelID: id, Direction: "write"},
			Reader: protocol.StreamChannelRef{ChannelID: id, Direction: "read"}}
	}
	return out, nil
}

func (f *fakeCreates) batcher() *createBatcher {
	return &createBatcher{create: f.create,
		dropLater: func(refs ...protocol.StreamChannelRef) {
			f.mu.Lock()
			f.dropped = append(f.dropped, refs...)
			f.released++
			f.mu.Unlock()
		},
		release: func(n int) {
			f.mu.Lock()
			f.released += n
			f.mu.Unlock()
		}}
}

// Many requests at once share calls: each gets its own two channels, at
// most maxCreatesInFlight calls run at once, none with more than
// maxCreateBatch requests.
func TestCreateBatcherSharesCalls(t *testing.T) {
	f := &fakeCreates{gate: make(chan struct{})}
	close(f.gate)
	b := f.batcher()
	const requests = 64
	var wg sync.WaitGroup
	for i := range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf("r%d", i)
			pairs, owned, err := b.channels(context.Background(), client.ChannelSpec{Filled: true, Content: []byte(body)})
			assert.Check(t, err == nil && owned, "%v", err)
			assert.Check(t, len(pairs) == 2 && pairs[0].Reader.ChannelID == body+"#0" && pairs[1].Writer.ChannelID == body+"#1", "%v", pairs)
		}()
	}
	waitfor.Group(t, &wg, waitfor.Default, "every request's channels")
	assert.Check(t, f.maxSeen.Load() <= maxCreatesInFlight, "%d calls at once", f.maxSeen.Load())
	assert.Check(t, f.maxBatch.Load() <= 2*maxCreateBatch, "%d channels in one call", f.maxBatch.Load())
	assert.Check(t, f.calls.Load() >= requests/maxCreateBatch, "%d calls", f.calls.Load())
	b.mu.Lock()
	assert.Check(t, b.inFlight == 0 && len(b.queue) == 0, "in flight %d, queued %d", b.inFlight, len(b.queue))
	b.mu.Unlock()
}

// A request that gives up while its call is under way leaves its slot to
// the batcher, which drops its channels once created; one that gives up
// while queued keeps its slot; a failed call fails every request in it.
func TestCreateBatcherAbandonAndFail(t *testing.T) {
	f := &fakeCreates{gate: make(chan struct{})}
	b := f.batcher()
	// Fill every in-flight place with a held call.
	held := make(chan error, maxCreatesInFlight)
	for i := range maxCreatesInFlight {
		go func() {
			_, _, err := b.channels(context.Background(), client.ChannelSpec{Filled: true, Content: []byte(fmt.Sprintf("h%d", i))})
			held <- err
		}()
	}
	until(t, func() bool { return f.inFlight.Load() == maxCreatesInFlight }, "calls in flight")

	// Queued, then abandoned: the caller keeps its slot.
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan bool, 1)
	go func() {
		_, owned, err := b.channels(ctx, client.ChannelSpec{Filled: true, Content: []byte("q")})
		got <- owned && errors.Is(err, context.Canceled)
	}()
	until(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.queue) == 1 }, "queued")
	cancel()
	assert.Check(t, waitfor.Recv(t, got, waitfor.Default, "the queued request's answer"))
	b.mu.Lock()
	assert.Check(t, len(b.queue) == 0)
	b.mu.Unlock()

	// Taken into a call another goroutine makes, then abandoned: the
	// batcher owns the slot and drops the channels once they exist. (A
	// request that makes the call itself waits for it.)
	f2 := &fakeCreates{gate: make(chan struct{})}
	b2 := f2.batcher()
	held2 := make(chan error, maxCreatesInFlight)
	for i := range maxCreatesInFlight {
		go func() {
			_, _, err := b2.channels(context.Background(), client.ChannelSpec{Filled: true, Content: []byte(fmt.Sprintf("h%d", i))})
			held2 <- err
		}()
	}
	until(t, func() bool { return f2.inFlight.Load() == maxCreatesInFlight }, "calls in flight")
	ctx2, cancel2 := context.WithCancel(context.Background())
	got2 := make(chan bool, 1)
	go func() {
		_, owned, err := b2.channels(ctx2, client.ChannelSpec{Filled: true, Content: []byte("a")})
		got2 <- !owned && errors.Is(err, context.Canceled)
	}()
	until(t, func() bool { b2.mu.Lock(); defer b2.mu.Unlock(); return len(b2.queue) == 1 }, "queued")
	f2.gate <- struct{}{} // one held call returns; the queue goes on in a call of its own
	until(t, func() bool {
		return f2.calls.Load() == maxCreatesInFlight+1 && f2.inFlight.Load() == maxCreatesInFlight
	}, "the queued request's call")
	cancel2()
	assert.Check(t, waitfor.Recv(t, got2, waitfor.Default, "the abandoned request's answer"))
	f2.gate <- struct{}{}
	f2.gate <- struct{}{}
	for range maxCreatesInFlight {
		assert.Check(t, waitfor.Recv(t, held2, waitfor.Default, "a held request's answer") == nil)
	}
	until(t, func() bool { f2.mu.Lock(); defer f2.mu.Unlock(); return f2.released == 1 }, "the abandoned request's drop")
	f2.mu.Lock()
	assert.Check(t, len(f2.dropped) == 2 && f2.dropped[0].ChannelID == "a#0" && f2.dropped[1].ChannelID == "a#1", "%v", f2.dropped)
	f2.mu.Unlock()

	// A failed call fails every request in it.
	f.fail = errors.New("engine says no")
	close(f.gate)
	for range maxCreatesInFlight {
		assert.Check(t, errors.Is(waitfor.Recv(t, held, waitfor.Default, "a held request's answer"), f.fail))
	}
	f.mu.Lock()
	assert.Check(t, f.released == 0 && len(f.dropped) == 0)
	f.mu.Unlock()
}

// until waits (bounded) for cond.
func until(t *testing.T, cond func() bool, what string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if cond() {
			return poll.Success()
		}
		return poll.Continue("waiting for %s", what)
	}, poll.WithTimeout(waitfor.Default))
}
