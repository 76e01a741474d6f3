package httpworker

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/protocol"
)

// Under load, many requests want their channels at once: one
// engine::channels::create call then creates several requests' channels
// (maxCreateBatch requests, two channels each: the engine takes 16 per
// call), so a request's share of the call's round trip (frames encoded,
// routed, written, read and decoded on both sides) shrinks with the load.
// A request that finds fewer than maxCreatesInFlight calls under way makes
// one itself, on its own goroutine, with whatever requests are queued (its
// own first), so a lone request waits for no one; the others queue and go
// in the next call.
const (
	maxCreateBatch     = 8
	maxCreatesInFlight = 2
	// createCallTimeout bounds one batched create call; each request's
	// own wait is bounded by its context (default_timeout).
	createCallTimeout = 30 * time.Second
)

// createBatcher gathers requests' channel creations into shared calls.
type createBatcher struct {
	create    func(ctx context.Context, specs ...client.ChannelSpec) ([]client.ChannelPair, error)
	dropLater func(refs ...protocol.StreamChannelRef) // drops and gives the request's slot back
	release   func(requests int)                      // gives requests' slots back

	mu       sync.Mutex
	queue    []*createReq
	inFlight int
}

type createReq struct {
	spec  client.ChannelSpec
	done  chan struct{} // closed under createBatcher.mu once pairs or err is set
	pairs []client.ChannelPair
	err   error
	// Guarded by createBatcher.mu.
	taken     bool // in a call
	abandoned bool // its request stopped waiting
}

// channels returns the request_body channel (made from spec) and the
// response channel of one request. When ctx ends while the request's call
// is under way, it returns ctx's error with owned false: the batcher then
// owns the request's slot (it drops the channels once created, or gives the
// slot back); otherwise the caller still owns its slot.
func (b *createBatcher) channels(ctx context.Context, spec client.ChannelSpec) (pairs []client.ChannelPair, owned bool, err error) {
	r := &createReq{spec: spec, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, r)
	lead := b.inFlight < maxCreatesInFlight
	if lead {
		b.inFlight++
	}
	b.mu.Unlock()
	if lead {
		b.run()
	}
	select {
	case <-r.done:
		return r.pairs, true, r.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-r.done:
		return r.pairs, true, r.err
	default:
	}
	if !r.taken {
		b.queue = slices.DeleteFunc(b.queue, func(q *createReq) bool { return q == r })
		return nil, true, ctx.Err()
	}
	r.abandoned = true
	return nil, false, ctx.Err()
}

// run makes one call with the queued requests (at most maxCreateBatch), then
// hands the queue on to a goroutine of its own while requests remain. The
// caller holds one of the inFlight places, which run gives back or hands on.
func (b *createBatcher) run() {
	b.mu.Lock()
	n := min(len(b.queue), maxCreateBatch)
	if n == 0 {
		b.inFlight--
		b.mu.Unlock()
		return
	}
	batch := slices.Clone(b.queue[:n])
	b.queue = slices.Clone(b.queue[n:])
	for _, r := range batch {
		r.taken = true
	}
	b.mu.Unlock()

	specs := make([]client.ChannelSpec, 0, 2*n)
	for _, r := range batch {
		specs = append(specs, r.spec, client.ChannelSpec{})
	}
	ctx, cancel := context.WithTimeout(context.Background(), createCallTimeout)
	pairs, err := b.create(ctx, specs...)
	cancel()

	b.mu.Lock()
	for i, r := range batch {
		if err != nil {
			r.err = err
		} else {
			r.pairs = pairs[2*i : 2*i+2 : 2*i+2]
		}
		if r.abandoned {
			if err == nil {
				b.dropLater(r.pairs[0].Reader, r.pairs[1].Reader)
			} else {
				b.release(1)
			}
		}
		close(r.done)
	}
	more := len(b.queue) > 0
	if !more {
		b.inFlight--
	}
	b.mu.Unlock()
	if more {
		// The requests that queued meanwhile go next, without holding up
		// this request's own answer.
		go b.run()
	}
}
