// Package pubsub is the registry's `pubsub` worker, deprecated upstream
// and kept for projects that still declare it: the bare function
// `publish {topic, data}` and the trigger type `subscribe {topic}`. A
// publish reaches every subscriber of its topic once, fire and forget:
// no retries, no persistence, nothing kept for a topic without
// subscribers. For messages that must not be lost use the queue worker
// (iii::durable::publish); docs/standard-workers.md says how to move.
// cmd/pubsub is the binary Compose runs (workers/workerkit connects it).
package pubsub

import (
	"context"
	"encoding/json"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Subscription is one `subscribe` trigger: its target function and where
// it resolves.
type Subscription struct {
	ID         string
	Topic      string
	FunctionID string
	Namespace  string // "" is default
	Metadata   json.RawMessage
}

// Invoker fires a subscriber's function without waiting for its result;
// the engine checks the call as the trigger's registrant.
type Invoker interface {
	Fire(ctx context.Context, ns, fn string, data, metadata json.RawMessage) error
}

// Hub holds this worker's subscriptions and delivers to them.
type Hub struct {
	inv Invoker
	log hclog.Logger

	mu      sync.RWMutex
	byTopic map[string]map[string]Subscription
	topicOf map[string]string // subscription id → topic
}

// NewHub delivers through inv.
func NewHub(inv Invoker, log hclog.Logger) *Hub {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Hub{inv: inv, log: log, byTopic: map[string]map[string]Subscription{}, topicOf: map[string]string{}}
}

// Subscribe adds s, replacing a subscription of the same id. A
// subscription without a topic registers nothing (upstream's behaviour)
// and says so: Subscribe reports false.
func (h *Hub) Subscribe(s Subscription) bool {
	if s.Topic == "" {
		h.log.Warn("a subscribe trigger without a topic registers nothing", "trigger_id", s.ID, "function_id", s.FunctionID)
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.removeLocked(s.ID)
	subs := h.byTopic[s.Topic]
	if subs == nil {
		subs = map[string]Subscription{}
		h.byTopic[s.Topic] = subs
	}
	subs[s.ID] = s
	h.topicOf[s.ID] = s.Topic
	return true
}

// Unsubscribe removes the subscription id, reporting whether it existed.
func (h *Hub) Unsubscribe(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.removeLocked(id)
}

func (h *Hub) removeLocked(id string) bool {
	topic, ok := h.topicOf[id]
	if !ok {
		return false
	}
	delete(h.topicOf, id)
	delete(h.byTopic[topic], id)
	if len(h.byTopic[topic]) == 0 {
		delete(h.byTopic, topic)
	}
	return true
}

// Subscribers lists a topic's subscriptions, by id.
func (h *Hub) Subscribers(topic string) []Subscription {
	h.mu.RLock()
	out := make([]Subscription, 0, len(h.byTopic[topic]))
	for _, s := range h.byTopic[topic] {
		out = append(out, s)
	}
	h.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Deliver fires data at every subscriber of topic and returns how many
// were fired. A failed fire is logged, not retried.
func (h *Hub) Deliver(ctx context.Context, topic string, data json.RawMessage) int {
	n := 0
	for _, s := range h.Subscribers(topic) {
		if err := h.inv.Fire(ctx, s.Namespace, s.FunctionID, data, s.Metadata); err != nil {
			h.log.Warn("pubsub delivery failed (not retried: use the queue worker for messages that must arrive)",
				"topic", topic, "trigger_id", s.ID, "function_id", s.FunctionID, "error", err)
			continue
		}
		n++
	}
	return n
}

// deprecationEvery is how often one entry point and caller is told that
// pubsub is deprecated (upstream's: at most once in 10 minutes).
const deprecationEvery = 10 * time.Minute

// maxDeprecationKeys bounds the remembered (entry point, caller) pairs.
const maxDeprecationKeys = 4096

// deprecation rate-limits the deprecation warning per entry point and
// caller, in bounded memory.
type deprecation struct {
	log hclog.Logger
	now func() time.Time

	mu   sync.Mutex
	last map[string]time.Time
}

func newDeprecation(log hclog.Logger, now func() time.Time) *deprecation {
	if now == nil {
		now = time.Now
	}
	return &deprecation{log: log.Named("iii::deprecation"), now: now, last: map[string]time.Time{}}
}

// warn logs the deprecation for entry and caller unless it did within
// deprecationEvery; it reports whether it logged.
func (d *deprecation) warn(entry, caller string) bool {
	now := d.now()
	key := entry + "\x00" + caller
	d.mu.Lock()
	if t, ok := d.last[key]; ok && now.Sub(t) < deprecationEvery {
		d.mu.Unlock()
		return false
	}
	if len(d.last) >= maxDeprecationKeys {
		for k, t := range d.last {
			if now.Sub(t) >= deprecationEvery {
				delete(d.last, k)
			}
		}
		if len(d.last) >= maxDeprecationKeys {
			// Every key is recent: forget them all rather than grow.
			clear(d.last)
		}
	}
	d.last[key] = now
	d.mu.Unlock()
	d.log.Warn("pubsub is deprecated: use the queue worker's iii::durable::publish and durable:subscriber (at-least-once), or a function of your own that calls its subscribers (docs/standard-workers.md#pubsub)",
		"entry_point", entry, "caller", caller)
	return true
}
