// Package waitfor bounds every wait a test makes. A test that blocks on a
// channel, a WaitGroup, a process or a condition with no deadline hangs
// the whole package until `go test`'s timeout and reports only a goroutine
// dump; these helpers instead fail the test, within a deadline well under
// the package timeout, with a message naming what it waited for.
//
// Call them from the test goroutine (they call t.Fatalf).
package waitfor

import (
	"sync"
	"testing"
	"time"
)

// Default is the deadline for a unit test's wait on something that
// happens promptly (a goroutine starting, a handler returning, a local
// process exiting): long enough for a loaded two-core machine, short
// enough that a hang fails well before the package timeout.
const Default = 30 * time.Second

// Recv returns the next value received from ch, or the zero value if ch
// is closed. It fails t if neither happens within d.
func Recv[T any](t testing.TB, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("timed out after %s waiting for %s", d, what)
		panic("unreachable")
	}
}

// Closed waits until ch is closed, discarding any values sent before. It
// fails t if ch is still open after d.
func Closed[T any](t testing.TB, ch <-chan T, d time.Duration, what string) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timer.C:
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
	}
}

// Group waits for wg. It fails t if wg's counter has not reached zero
// after d; the goroutine waiting on wg is then left behind, which is
// harmless once the test has failed.
func Group(t testing.TB, wg *sync.WaitGroup, d time.Duration, what string) {
	t.Helper()
	Func(t, d, what, wg.Wait)
}

// Func calls fn, which blocks (cmd.Wait, sync.Cond.Wait under its lock,
// a read), and waits for it to return. It fails t if fn has not returned
// after d; fn then keeps running in its own goroutine, so it must not
// touch t.
func Func(t testing.TB, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	Closed(t, done, d, what)
}

// Value calls fn like Func and returns its result.
func Value[T any](t testing.TB, d time.Duration, what string, fn func() T) T {
	t.Helper()
	got := make(chan T, 1)
	go func() { got <- fn() }()
	return Recv(t, got, d, what)
}
