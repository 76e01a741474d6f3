package stream

import (
	"fmt"
	"sync"

	"github.com/coder/websocket"
)

const (
	// queuedBytesPerConnection caps what waits to be written to one
	// stream client (one message larger than it still passes alone). A
	// client past it is not reading: it is closed with 1008 and a reason
	// starting LIMIT_EXCEEDED, and what was queued for it is dropped.
	queuedBytesPerConnection = 16 << 20
	// queuedBytesTotal caps what waits for all stream clients together; a
	// client whose message does not fit is closed the same way.
	queuedBytesTotal = 128 << 20
	// syncLanes caps the join syncs being built at once (each lists a
	// group or reads an item: up to the store's size, transiently), so
	// many clients joining a large group at once cannot multiply it.
	syncLanes = 4
)

// outItem is one message waiting for a client. A sync is tagged with its
// subscription, so a re-join replaces the sync still waiting.
type outItem struct {
	data []byte // nil once dropped
	cost int64
	sub  string
}

// queue is a connection's bookkeeping of what waits in conn.out: bytes
// (against the caps) and the sync each subscription still waits for.
type queue struct {
	mu      sync.Mutex
	bytes   int64
	syncs   map[string]*outItem
	over    bool
	total   *queuedTotal
	closeFn func(websocket.StatusCode, string)
}

// queuedTotal is the hub-wide count of queued bytes.
type queuedTotal struct {
	mu    sync.Mutex
	bytes int64
}

func (t *queuedTotal) add(n int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n > 0 && t.bytes > 0 && t.bytes+n > queuedBytesTotal {
		return false
	}
	t.bytes += n
	return true
}

// admit charges it to the connection and the hub; false means it does not
// fit: the connection is being closed and nothing more is queued for it.
// A sync replaces the one its subscription still waits for.
func (q *queue) admit(it *outItem) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.over {
		return false
	}
	if it.sub != "" {
		if old := q.syncs[it.sub]; old != nil && old.data != nil {
			q.dropLocked(old)
		}
	}
	it.cost = min(int64(len(it.data)), queuedBytesPerConnection)
	if q.bytes > 0 && q.bytes+it.cost > queuedBytesPerConnection {
		q.overflowLocked(fmt.Sprintf("%s: more than %d bytes wait for this client, which does not read them; it is closed",
			codeLimitExceeded, queuedBytesPerConnection))
		return false
	}
	if !q.total.add(it.cost) {
		q.overflowLocked(fmt.Sprintf("%s: the stream socket holds %d bytes for its clients, its limit; this client is closed",
			codeLimitExceeded, queuedBytesTotal))
		return false
	}
	q.bytes += it.cost
	if it.sub != "" {
		if q.syncs == nil {
			q.syncs = map[string]*outItem{}
		}
		q.syncs[it.sub] = it
	}
	return true
}

// closing reports that the connection went over a cap.
func (q *queue) closing() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.over
}

// take is the writer's (or the drop-oldest rule's): it returns the data
// to write, nil for an item already dropped, and releases its charge.
func (q *queue) take(it *outItem) []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	data := it.data
	if data != nil {
		q.dropLocked(it)
	}
	return data
}

func (q *queue) dropLocked(it *outItem) {
	q.bytes -= it.cost
	q.total.add(-it.cost)
	it.data = nil
	if it.sub != "" && q.syncs[it.sub] == it {
		delete(q.syncs, it.sub)
	}
}

// overflowLocked marks the connection over its cap and closes it: the
// client is told why in the close frame, if it ever reads again.
func (q *queue) overflowLocked(reason string) {
	q.over = true
	go q.closeFn(websocket.StatusPolicyViolation, reason)
}

// release drops every charge left when the connection ends.
func (q *queue) release(out chan *outItem) {
	for {
		select {
		case it := <-out:
			q.take(it)
		default:
			return
		}
	}
}

// codeLimitExceeded is the engine's code for a documented cap.
const codeLimitExceeded = "LIMIT_EXCEEDED"
