package waitfor

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

// recorder is a testing.TB whose Fatalf records the message and ends the
// calling goroutine, as the real one does.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	panic(r)
}

// run calls fn with a recorder and returns the failure message, or "" if
// fn did not fail.
func run(t *testing.T, fn func(tb testing.TB)) string {
	r := &recorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != nil && p != any(r) {
				panic(p)
			}
		}()
		fn(r)
	}()
	return r.failed
}

func TestRecvReturnsTheValue(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	assert.Equal(t, Recv(t, ch, time.Second, "seven"), 7)
	close(ch)
	assert.Equal(t, Recv(t, ch, time.Second, "zero"), 0)
}

func TestTimeoutsFailNamingWhatWasAwaited(t *testing.T) {
	var wg sync.WaitGroup
	wg.Add(1)
	defer wg.Done()
	never := make(chan int)
	for name, fn := range map[string]func(tb testing.TB){
		"recv":   func(tb testing.TB) { Recv(tb, never, 10*time.Millisecond, "the answer") },
		"closed": func(tb testing.TB) { Closed(tb, never, 10*time.Millisecond, "the answer") },
		"group":  func(tb testing.TB) { Group(tb, &wg, 10*time.Millisecond, "the answer") },
		"func":   func(tb testing.TB) { Func(tb, 10*time.Millisecond, "the answer", func() { <-never }) },
		"value": func(tb testing.TB) {
			Value(tb, 10*time.Millisecond, "the answer", func() int { return <-never })
		},
	} {
		t.Run(name, func(t *testing.T) {
			msg := run(t, fn)
			assert.Assert(t, strings.Contains(msg, "waiting for the answer"), "got %q", msg)
			assert.Assert(t, strings.Contains(msg, "10ms"), "got %q", msg)
		})
	}
}

func TestClosedDrainsValues(t *testing.T) {
	ch := make(chan int, 2)
	ch <- 1
	ch <- 2
	close(ch)
	assert.Equal(t, run(t, func(tb testing.TB) { Closed(tb, ch, time.Second, "close") }), "")
}

func TestGroupAndFuncReturn(t *testing.T) {
	var wg sync.WaitGroup
	wg.Add(1)
	go wg.Done()
	Group(t, &wg, time.Second, "the group")
	ran := false
	Func(t, time.Second, "fn", func() { ran = true })
	assert.Assert(t, ran)
	assert.Equal(t, Value(t, time.Second, "fn", func() string { return "v" }), "v")
}
