package batchconn

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// gatedConn records writes; while gate is set, each write waits for it.
type gatedConn struct {
	net.Conn // nil: only Write, Close and SetWriteDeadline are used

	mu      sync.Mutex
	writes  []string
	entered chan struct{} // a write began (buffered)
	gate    chan struct{} // nil: writes pass
	closed  bool
}

func (g *gatedConn) Write(p []byte) (int, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if g.entered != nil {
		g.entered <- struct{}{}
	}
	if gate != nil {
		<-gate
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.writes = append(g.writes, string(p))
	return len(p), nil
}

func (g *gatedConn) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	return nil
}

func (g *gatedConn) SetWriteDeadline(time.Time) error { return nil }

func (g *gatedConn) recorded() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.writes...)
}

// While one socket write is in the kernel, what others write is gathered
// and goes out in one write, in the order written.
func TestGathersWhileWriting(t *testing.T) {
	g := &gatedConn{entered: make(chan struct{}, 100), gate: make(chan struct{})}
	c := New(g, 1024)
	_, err := c.Write([]byte("first;"))
	assert.NilError(t, err)
	<-g.entered // the flusher is in its write, held
	for i := range 20 {
		n, err := c.Write([]byte(fmt.Sprintf("m%d;", i)))
		assert.NilError(t, err)
		assert.Equal(t, n, len(fmt.Sprintf("m%d;", i)))
	}
	close(g.gate)
	assert.NilError(t, c.Flush())
	var want strings.Builder
	for i := range 20 {
		fmt.Fprintf(&want, "m%d;", i)
	}
	assert.DeepEqual(t, g.recorded(), []string{"first;", want.String()})
	assert.NilError(t, c.Close())
}

// At most limit bytes wait: a writer past it waits until the socket took
// what was before; a write larger than the limit goes out directly, after
// what came before it.
func TestBoundedAndOrdered(t *testing.T) {
	g := &gatedConn{entered: make(chan struct{}, 100), gate: make(chan struct{})}
	c := New(g, 10)
	_, _ = c.Write([]byte("aaaaa"))
	<-g.entered
	_, _ = c.Write([]byte("bbbbbbbb")) // gathered: 8 of 10
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = c.Write([]byte("ccc")) // 11 > 10: waits
		_, _ = c.Write([]byte("dddddddddddddddddddd"))
	}()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.buf) != 8 {
			return poll.Error(fmt.Errorf("gathered %d bytes, want 8: the limit was passed", len(c.buf)))
		}
		return poll.Success()
	})
	select {
	case <-done:
		t.Fatal("a write past the limit returned while the socket held the bytes before it")
	default:
	}
	close(g.gate)
	<-done
	assert.NilError(t, c.Flush())
	assert.Check(t, is.Equal(strings.Join(g.recorded(), ""), "aaaaabbbbbbbbcccdddddddddddddddddddd"))
	assert.Check(t, is.Contains(g.recorded(), "dddddddddddddddddddd"), "the large write went out alone")
	assert.NilError(t, c.Close())
}

// Many goroutines writing at once: every byte arrives, each write whole
// and in one piece, in fewer socket writes than writes.
func TestConcurrentWriters(t *testing.T) {
	a, b := net.Pipe()
	c := New(a, 256)
	var got bytes.Buffer
	read := make(chan error, 1)
	go func() {
		_, err := io.Copy(&got, b)
		read <- err
	}()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				_, err := c.Write([]byte(fmt.Sprintf("<%d:%03d>", w, i)))
				assert.Check(t, err)
			}
		}()
	}
	wg.Wait()
	assert.NilError(t, c.Close())
	assert.NilError(t, <-read)
	next := map[string]int{}
	s := got.String()
	for len(s) > 0 {
		end := strings.IndexByte(s, '>')
		assert.Assert(t, s[0] == '<' && end > 0, "a write was split or interleaved: %.40q", s)
		var w, i int
		_, err := fmt.Sscanf(s[:end+1], "<%d:%d>", &w, &i)
		assert.NilError(t, err)
		key := fmt.Sprint(w)
		assert.Equal(t, i, next[key], "writer %d's writes in order", w)
		next[key]++
		s = s[end+1:]
	}
	for w := range 8 {
		assert.Check(t, is.Equal(next[fmt.Sprint(w)], 200))
	}
}

// Close writes what is gathered before closing; after it writes fail.
func TestCloseFlushes(t *testing.T) {
	g := &gatedConn{}
	c := New(g, 0)
	_, _ = c.Write([]byte("last words"))
	assert.NilError(t, c.Close())
	assert.Check(t, is.DeepEqual(g.recorded(), []string{"last words"}))
	assert.Check(t, g.closed)
	_, err := c.Write([]byte("x"))
	assert.Check(t, is.ErrorIs(err, net.ErrClosed))
}

// A peer that stops reading holds Close up for CloseFlushTimeout at most,
// and a writer waiting for room is released with an error.
func TestCloseOnStuckPeer(t *testing.T) {
	a, b := net.Pipe() // nobody reads b
	defer b.Close()
	c := New(a, 8)
	_, err := c.Write([]byte("12345678"))
	assert.NilError(t, err)
	waiting := make(chan error, 1)
	go func() {
		// The flusher may not have taken the first write yet: write until
		// this goroutine has to wait for room.
		for {
			if _, err := c.Write([]byte("more")); err != nil {
				waiting <- err
				return
			}
		}
	}()
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		assert.NilError(t, err)
	case <-time.After(30 * CloseFlushTimeout):
		t.Fatal("Close waited on a peer that does not read")
	}
	assert.Check(t, <-waiting != nil, "the waiting writer fails (the flush's timeout or the close)")
}
