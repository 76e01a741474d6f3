// Package taskgroup counts a component's goroutines so that its Close can
// wait for all of them, and refuses new ones once closing has begun: a
// sync.WaitGroup alone cannot, since an Add racing a started Wait is a bug.
package taskgroup

import (
	"context"
	"sync"
)

// Group is a closable count of running tasks. The zero value is ready.
type Group struct {
	mu     sync.Mutex
	closed bool
	n      int
	zero   chan struct{} // closed when n drops to 0 while someone waits
}

// Add counts a new task, or refuses it (false) once Close was called; a
// refused task must not start.
func (g *Group) Add() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.n++
	return true
}

// Go runs fn on a goroutine of its own as a counted task; false (fn does
// not run) once Close was called.
func (g *Group) Go(fn func()) bool {
	if !g.Add() {
		return false
	}
	go func() {
		defer g.Done()
		fn()
	}()
	return true
}

// Done ends a task Add counted.
func (g *Group) Done() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	if g.n < 0 {
		panic("taskgroup: Done without a matching Add")
	}
	if g.n == 0 && g.zero != nil {
		close(g.zero)
		g.zero = nil
	}
}

// Close refuses every later Add. Tasks already counted run on.
func (g *Group) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// Wait returns when no task runs, or ctx's error when ctx ends first.
func (g *Group) Wait(ctx context.Context) error {
	g.mu.Lock()
	if g.n == 0 {
		g.mu.Unlock()
		return nil
	}
	if g.zero == nil {
		g.zero = make(chan struct{})
	}
	zero := g.zero
	g.mu.Unlock()
	select {
	case <-zero:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
