package images

import (
	"context"
	"sync"
)

// flights runs at most one installation per key. Callers that arrive while
// one runs wait for it and share its result and its progress reports. The
// installation runs on its own context, cancelled only when every waiter has
// given up, so one impatient caller does not fail the others.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
	wg sync.WaitGroup
}

type flight struct {
	done    chan struct{}
	img     *Image
	err     error
	cancel  context.CancelFunc
	waiters int
	// progress holds the callbacks of the current waiters.
	progress map[int]func(Progress)
	nextID   int
}

func (f *flights) report(fl *flight, p Progress) {
	f.mu.Lock()
	cbs := make([]func(Progress), 0, len(fl.progress))
	for _, cb := range fl.progress {
		cbs = append(cbs, cb)
	}
	f.mu.Unlock()
	for _, cb := range cbs {
		cb(p)
	}
}

// do runs fn once per key at a time. fn gets a report function that fans
// progress out to the waiters.
func (f *flights) do(ctx context.Context, key string, progress func(Progress), fn func(ctx context.Context, report func(Progress)) (*Image, error)) (*Image, error) {
	f.mu.Lock()
	if f.m == nil {
		f.m = map[string]*flight{}
	}
	fl, ok := f.m[key]
	// A flight whose waiters all left has been cancelled: start afresh
	// rather than inherit its cancellation.
	if !ok || fl.waiters == 0 {
		// WithoutCancel keeps the caller's values (loggers, trace ids) but
		// not its deadline: the flight outlives any single waiter.
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		nf := &flight{done: make(chan struct{}), cancel: cancel, progress: map[int]func(Progress){}}
		f.m[key] = nf
		fl = nf
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			img, err := fn(fctx, func(p Progress) { f.report(nf, p) })
			f.mu.Lock()
			nf.img, nf.err = img, err
			if f.m[key] == nf {
				delete(f.m, key)
			}
			f.mu.Unlock()
			cancel()
			close(nf.done)
		}()
	}
	fl.waiters++
	id := fl.nextID
	fl.nextID++
	if progress != nil {
		fl.progress[id] = progress
	}
	f.mu.Unlock()

	select {
	case <-fl.done:
		return fl.img, fl.err
	case <-ctx.Done():
		f.mu.Lock()
		delete(fl.progress, id)
		fl.waiters--
		if fl.waiters == 0 {
			fl.cancel()
		}
		f.mu.Unlock()
		return nil, ctx.Err()
	}
}

// wait blocks until every flight has finished (used by Close).
func (f *flights) wait() { f.wg.Wait() }
