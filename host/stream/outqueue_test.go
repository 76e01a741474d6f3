package stream

import (
	"bytes"
	"testing"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// TestQueueRejoinReplacesAndCaps: a re-join's sync replaces the one its
// subscription still waits for; past the per-connection bytes the client
// is closed 1008 LIMIT_EXCEEDED and nothing more is queued; every charge
// is released.
func TestQueueRejoinReplacesAndCaps(t *testing.T) {
	total := new(queuedTotal)
	c := &conn{out: make(chan *outItem, 256)}
	c.q.total = total
	c.q.closeFn = func(websocket.StatusCode, string) { t.Error("closed while under its cap") }
	big := bytes.Repeat([]byte("x"), 6<<20)
	for range 120 {
		c.enqueueSync("s", big)
	}
	assert.Equal(t, c.q.bytes, int64(6<<20), "one sync waits, not 120")
	live := 0
	for range len(c.out) {
		if c.q.take(<-c.out) != nil {
			live++
		}
	}
	assert.Equal(t, live, 1)
	assert.Equal(t, total.bytes, int64(0))

	done := make(chan string, 1)
	c.q.closeFn = func(s websocket.StatusCode, reason string) {
		assert.Check(t, s == websocket.StatusPolicyViolation)
		done <- reason
	}
	c.enqueueSync("a", big)
	c.enqueueSync("b", big)
	c.enqueueSync("c", big) // 18 MiB > 16 MiB
	reason := waitfor.Recv(t, done, waitFor, "the over-limit client to be closed")
	assert.Assert(t, bytes.HasPrefix([]byte(reason), []byte(codeLimitExceeded)), reason)
	assert.Assert(t, c.q.closing())
	c.enqueue([]byte("more"))
	c.q.release(c.out)
	assert.Equal(t, c.q.bytes, int64(0))
	assert.Equal(t, total.bytes, int64(0))
}
