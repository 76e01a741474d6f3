package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const wait = 20 * time.Second // a hang guard, not a timing

type call struct {
	ns, fn string
	data   json.RawMessage
	at     time.Time
}

// fakeInvoker records calls; answer decides each one's result (nil: ok).
type fakeInvoker struct {
	mu          sync.Mutex
	calls       []call
	inflight    int
	maxInflight int
	answer      func(c call, n int) error // n: calls of the same data so far, 1-based
	block       chan struct{}             // when set, each call waits for it to close
}

func (f *fakeInvoker) Invoke(ctx context.Context, ns, fn string, payload, _ json.RawMessage, _ time.Duration) (json.RawMessage, error) {
	c := call{ns: ns, fn: fn, data: payload, at: time.Now()}
	f.mu.Lock()
	f.calls = append(f.calls, c)
	n := 0
	for _, o := range f.calls {
		if string(o.data) == string(payload) && o.fn == fn {
			n++
		}
	}
	f.inflight++
	f.maxInflight = max(f.maxInflight, f.inflight)
	block, answer := f.block, f.answer
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inflight--
		f.mu.Unlock()
	}()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if answer != nil {
		if err := answer(c, n); err != nil {
			return nil, err
		}
	}
	return json.RawMessage(`null`), nil
}

func (f *fakeInvoker) snapshot() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

func failure(msg string) error {
	return &protocol.ErrorBody{Code: protocol.CodeInvocationFailed, Message: msg}
}

type harness struct {
	d      *Dispatcher
	store  *Store
	inv    *fakeInvoker
	cancel context.CancelFunc
	done   chan struct{}
}

func start(t *testing.T, store *Store, inv *fakeInvoker, queues string) *harness {
	t.Helper()
	cfg, err := ParseConfig(json.RawMessage(`{"adapter":{"name":"builtin","config":{"store_method":"in_memory"}},"queue_configs":` + queues + `}`))
	assert.NilError(t, err)
	d := NewDispatcher(DispatcherOptions{Store: store, Topics: inv, Enqueued: inv, Queues: cfg.QueueConfigs})
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{d: d, store: store, inv: inv, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(h.done); d.Run(ctx) }()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	h.cancel()
	<-h.done
}

func (h *harness) enqueue(t *testing.T, queue, fn, data string) string {
	t.Helper()
	id, err := h.d.Enqueue(EnqueueRequest{Queue: queue, FunctionID: fn, Data: json.RawMessage(data), ReceiptID: "r-" + data})
	assert.NilError(t, err)
	return id
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if cond() {
			return poll.Success()
		}
		return poll.Continue("waiting for %s", what)
	}, poll.WithTimeout(wait), poll.WithDelay(2*time.Millisecond))
}

// A job that fails twice then succeeds is called three times, each retry
// no sooner than backoff × 2^(attempt-1) after the failure, and is gone
// once it succeeds. max_retries counts retries: attempts = max_retries+1.
func TestRetryWithBackoff(t *testing.T) {
	inv := &fakeInvoker{answer: func(c call, n int) error {
		if n <= 2 {
			return failure(fmt.Sprintf("failure %d", n))
		}
		return nil
	}}
	h := start(t, OpenMemory(), inv, `{"jobs":{"max_retries":2,"backoff_ms":30}}`)
	assert.Check(t, is.Equal(h.enqueue(t, "jobs", "app::job", `{"n":1}`), `r-{"n":1}`))
	waitUntil(t, "the job to succeed", func() bool { return len(h.store.Pending()) == 0 && len(inv.snapshot()) == 3 })
	calls := inv.snapshot()
	assert.Check(t, calls[1].at.Sub(calls[0].at) >= 30*time.Millisecond, "first retry after %s", calls[1].at.Sub(calls[0].at))
	assert.Check(t, calls[2].at.Sub(calls[1].at) >= 60*time.Millisecond, "second retry after %s", calls[2].at.Sub(calls[1].at))
	assert.Check(t, is.Len(h.store.DLQ("jobs"), 0))
}

// A job that always fails lands in the DLQ after max_retries+1 attempts
// with its last error; redrive puts it back (attempts reset), discard
// drops one; unknown ids are MESSAGE_NOT_FOUND.
func TestDLQRedriveDiscard(t *testing.T) {
	var mu sync.Mutex
	healthy := false
	inv := &fakeInvoker{answer: func(c call, n int) error {
		mu.Lock()
		defer mu.Unlock()
		if healthy && string(c.data) == `{"n":1}` {
			return nil
		}
		return failure("always")
	}}
	h := start(t, OpenMemory(), inv, `{"jobs":{"max_retries":1,"backoff_ms":1}}`)
	h.enqueue(t, "jobs", "app::job", `{"n":1}`)
	h.enqueue(t, "jobs", "app::job", `{"n":2}`)
	waitUntil(t, "both in the DLQ", func() bool { return len(h.store.DLQ("jobs")) == 2 })
	assert.Check(t, is.Len(inv.snapshot(), 4))
	items, err := h.d.DLQMessages("jobs", 0, 0)
	assert.NilError(t, err)
	assert.Assert(t, is.Len(items, 2))
	assert.Check(t, is.Equal(string(items[0].Payload), `{"n":1}`))
	assert.Check(t, is.Equal(items[0].Retries, 2))
	assert.Check(t, is.Equal(items[0].Error, "invocation_failed: always"))
	page, err := h.d.DLQMessages("jobs", 1, 5)
	assert.NilError(t, err)
	assert.Check(t, is.Len(page, 1))
	assert.Check(t, is.DeepEqual(h.d.DLQTopics(), []DLQTopic{{Name: "jobs", BrokerType: "builtin", MessageCount: 2}}))

	mu.Lock()
	healthy = true
	mu.Unlock()
	assert.NilError(t, h.d.RedriveMessage("jobs", items[0].ID))
	waitUntil(t, "the redriven job to succeed", func() bool { return len(h.store.Pending()) == 0 && len(h.store.DLQ("jobs")) == 1 })
	assert.NilError(t, h.d.Discard("jobs", items[1].ID))
	assert.Check(t, is.Len(h.store.DLQ("jobs"), 0))
	assert.Check(t, is.Equal(code(t, h.d.Discard("jobs", items[1].ID)), CodeMessageNotFound))
	assert.Check(t, is.Equal(code(t, h.d.RedriveMessage("other", "x")), CodeMessageNotFound))
	n, err := h.d.Redrive("jobs")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(n, 0))
}

// A fifo queue delivers one message of a group at a time, in order (a
// failing one holds its group back until it succeeds); groups run in
// parallel.
func TestFIFOPerGroup(t *testing.T) {
	var mu sync.Mutex
	busy := map[string]int{}
	overlap := false
	inv := &fakeInvoker{answer: func(c call, n int) error {
		var d struct {
			G string `json:"g"`
			I int    `json:"i"`
		}
		_ = json.Unmarshal(c.data, &d)
		mu.Lock()
		busy[d.G]++
		if busy[d.G] > 1 {
			overlap = true
		}
		mu.Unlock()
		time.Sleep(time.Millisecond) // widen the window an overlap would show in
		mu.Lock()
		busy[d.G]--
		mu.Unlock()
		if d.G == "a" && d.I == 2 && n == 1 {
			return failure("once")
		}
		return nil
	}}
	h := start(t, OpenMemory(), inv, `{"orders":{"type":"fifo","message_group_field":"g","concurrency":4,"backoff_ms":5}}`)
	for i := 1; i <= 5; i++ {
		h.enqueue(t, "orders", "app::order", fmt.Sprintf(`{"g":"a","i":%d}`, i))
		h.enqueue(t, "orders", "app::order", fmt.Sprintf(`{"g":"b","i":%d}`, i))
	}
	waitUntil(t, "every order", func() bool { return len(h.store.Pending()) == 0 })
	order := map[string][]int{}
	for _, c := range inv.snapshot() {
		var d struct {
			G string `json:"g"`
			I int    `json:"i"`
		}
		assert.NilError(t, json.Unmarshal(c.data, &d))
		order[d.G] = append(order[d.G], d.I)
	}
	assert.Check(t, is.DeepEqual(order["a"], []int{1, 2, 2, 3, 4, 5}))
	assert.Check(t, is.DeepEqual(order["b"], []int{1, 2, 3, 4, 5}))
	assert.Check(t, !overlap, "two messages of one group were delivered at once")

	_, err := h.d.Enqueue(EnqueueRequest{Queue: "orders", FunctionID: "f", Data: json.RawMessage(`{"i":1}`)})
	assert.Check(t, is.Equal(code(t, err), CodeInvalidArgument))
	assert.Check(t, is.ErrorContains(err, `no "g"`))
}

// No more deliveries of a queue run at once than its concurrency.
func TestConcurrencyCap(t *testing.T) {
	inv := &fakeInvoker{block: make(chan struct{})}
	h := start(t, OpenMemory(), inv, `{"jobs":{"concurrency":2}}`)
	for i := range 10 {
		h.enqueue(t, "jobs", "app::job", fmt.Sprintf(`{"i":%d}`, i))
	}
	waitUntil(t, "two deliveries under way", func() bool { return h.d.InFlight() == 2 })
	// Both inside the function too: a delivery counts as in flight before
	// its call starts, and closing block before the second call began
	// would let the calls run one after the other.
	waitUntil(t, "two calls under way", func() bool {
		inv.mu.Lock()
		defer inv.mu.Unlock()
		return inv.inflight == 2
	})
	// More enqueues and wake-ups do not start a third.
	h.enqueue(t, "jobs", "app::job", `{"i":10}`)
	h.d.poke()
	assert.Check(t, is.Equal(h.d.InFlight(), 2))
	close(inv.block)
	waitUntil(t, "every job", func() bool { return len(h.store.Pending()) == 0 })
	inv.mu.Lock()
	defer inv.mu.Unlock()
	assert.Check(t, is.Equal(inv.maxInflight, 2))
	assert.Check(t, is.Len(inv.calls, 11))
}

// A publish reaches every subscription of its topic once (a consumer
// group once between its members), none of another topic's.
func TestPublishFanOut(t *testing.T) {
	inv := &fakeInvoker{}
	h := start(t, OpenMemory(), inv, `{}`)
	assert.NilError(t, h.d.Subscribe("t1", "app::a", "", json.RawMessage(`{"topic":"orders"}`), nil))
	assert.NilError(t, h.d.Subscribe("t2", "app::b", "", json.RawMessage(`{"queue":"orders"}`), nil))
	assert.NilError(t, h.d.Subscribe("t3", "app::g1", "", json.RawMessage(`{"queue":"orders","group":"g"}`), nil))
	assert.NilError(t, h.d.Subscribe("t4", "app::g2", "", json.RawMessage(`{"queue":"orders","group":"g"}`), nil))
	assert.NilError(t, h.d.Subscribe("t5", "app::c", "", json.RawMessage(`{"queue":"other"}`), nil))
	// The same trigger sent again (a reconnect) is fine; another config
	// under its id is not.
	assert.NilError(t, h.d.Subscribe("t1", "app::a", "", json.RawMessage(`{"topic":"orders"}`), nil))
	assert.Check(t, is.Equal(code(t, h.d.Subscribe("t1", "app::a", "", json.RawMessage(`{"topic":"x"}`), nil)), CodeAlreadyRegistered))
	assert.Check(t, is.Equal(code(t, h.d.Subscribe("t9", "app::a", "", json.RawMessage(`{"topic":""}`), nil)), CodeInvalidConfig))

	n, err := h.d.Publish("orders", json.RawMessage(`{"id":1}`))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(n, 3))
	waitUntil(t, "three deliveries", func() bool { return len(h.store.Pending()) == 0 && len(inv.snapshot()) == 3 })
	got := map[string]int{}
	for _, c := range inv.snapshot() {
		got[c.fn]++
	}
	assert.Check(t, is.Equal(got["app::a"], 1))
	assert.Check(t, is.Equal(got["app::b"], 1))
	assert.Check(t, is.Equal(got["app::g1"]+got["app::g2"], 1))
	assert.Check(t, is.Equal(got["app::c"], 0))
	_, err = h.d.Publish("", nil)
	assert.Check(t, is.Equal(code(t, err), CodeTopicNotSet))

	topics := h.d.Topics()
	assert.Check(t, is.DeepEqual(topics, []TopicInfo{{Name: "orders", BrokerType: "builtin", SubscriberCount: 4}, {Name: "other", BrokerType: "builtin", SubscriberCount: 1}}))
	st, err := h.d.Stats("orders")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(st.ConsumerCount, 4))
}

// A target that is not registered (or an engine that is not there)
// spends no attempt: the message waits and is delivered once it is.
func TestNotReadySpendsNoAttempt(t *testing.T) {
	var mu sync.Mutex
	up := false
	inv := &fakeInvoker{answer: func(call, int) error {
		mu.Lock()
		defer mu.Unlock()
		if !up {
			return &protocol.ErrorBody{Code: protocol.CodeFunctionNotFound, Message: "not yet"}
		}
		return nil
	}}
	h := start(t, OpenMemory(), inv, `{"jobs":{"max_retries":0}}`)
	h.enqueue(t, "jobs", "app::later", `{}`)
	waitUntil(t, "a first try", func() bool { return len(inv.snapshot()) >= 1 })
	mu.Lock()
	up = true
	mu.Unlock()
	waitUntil(t, "the delivery", func() bool { return len(h.store.Pending()) == 0 })
	assert.Check(t, is.Len(h.store.DLQ("jobs"), 0), "max_retries 0 and a failed attempt would have sent it to the DLQ")
}

// Unknown queue: upstream's message; an empty queue name is refused.
func TestEnqueueRefusals(t *testing.T) {
	h := start(t, OpenMemory(), &fakeInvoker{}, `{"jobs":{}}`)
	_, err := h.d.Enqueue(EnqueueRequest{Queue: "nope", FunctionID: "f"})
	assert.Check(t, is.Equal(code(t, err), CodeNotProvisioned))
	assert.Check(t, is.ErrorContains(err, "function queue 'nope' is not provisioned"))
	_, err = h.d.Enqueue(EnqueueRequest{Queue: "", FunctionID: "f"})
	assert.Check(t, is.Equal(code(t, err), CodeInvalidArgument))
	assert.Check(t, is.ErrorContains(err, "queue name is empty"))
	_, err = h.d.Enqueue(EnqueueRequest{Queue: "jobs"})
	assert.Check(t, is.Equal(code(t, err), CodeInvalidArgument))

	changed, err := h.d.Define("later", json.RawMessage(`{"concurrency":1}`))
	assert.NilError(t, err)
	assert.Check(t, changed)
	changed, err = h.d.Define("later", json.RawMessage(`{"concurrency":1}`))
	assert.NilError(t, err)
	assert.Check(t, !changed)
	_, err = h.d.Define("later", json.RawMessage(`{"concurrency":1,"bogus":1}`))
	assert.Check(t, is.Equal(code(t, err), CodeInvalidConfig))
	h.enqueue(t, "later", "f", `{}`)
}

// A message delivered but not acked when the worker stopped is delivered
// again by the next worker on the same directory; one acked is not.
func TestRedeliveredAfterRestart(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir)
	assert.NilError(t, err)
	inv := &fakeInvoker{}
	first := &fakeInvoker{}
	h := start(t, s, first, `{"jobs":{"concurrency":1}}`)
	h.enqueue(t, "jobs", "app::job", `{"i":1}`)
	waitUntil(t, "the first job", func() bool { return len(s.Pending()) == 0 })
	first.mu.Lock()
	first.block = make(chan struct{})
	first.mu.Unlock()
	h.enqueue(t, "jobs", "app::job", `{"i":2}`)
	waitUntil(t, "the second job under way", func() bool { return h.d.InFlight() == 1 })
	h.stop() // the worker stops mid-delivery
	assert.NilError(t, s.Close())

	s2, err := OpenStore(dir)
	assert.NilError(t, err)
	defer s2.Close()
	h2 := start(t, s2, inv, `{"jobs":{"concurrency":1}}`)
	waitUntil(t, "the redelivery", func() bool { return len(s2.Pending()) == 0 })
	calls := inv.snapshot()
	assert.Assert(t, is.Len(calls, 1))
	assert.Check(t, is.Equal(string(calls[0].data), `{"i":2}`))
	h2.stop()
}
