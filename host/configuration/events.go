package configuration

import (
	"bytes"
	"encoding/json"
	"sync"

	"github.com/iii-sandbox/iii/internal/dropqueue"
)

// Event types of the configuration trigger type and of Subscribe.
const (
	EventRegistered = "configuration:registered"
	EventUpdated    = "configuration:updated"
	EventDeleted    = "configuration:deleted"
)

// eventQueueLimit bounds the events waiting for one subscriber (a
// Subscribe callback or one configuration trigger). When a slow subscriber
// lets it fill, the oldest waiting event is dropped and a warning logged:
// set and register never wait for a subscriber.
const eventQueueLimit = 256

// Event is one change to an entry, as Subscribe's callback receives it.
// OldValue and NewValue are expanded as configuration::get expands them
// for the engine token's holder (read from the environment when the event
// is delivered); "null" when there is none (OldValue of a first
// registration, NewValue of a deletion). Schema is "null" while the
// entry's owner has not registered since the engine started. Metadata is
// nil when the registration carried none.
type Event struct {
	EventType   string
	ID          string
	Name        string
	Description string
	Schema      json.RawMessage
	OldValue    json.RawMessage
	NewValue    json.RawMessage
	Metadata    json.RawMessage
}

// rawEvent is an Event whose values are still the stored templates.
type rawEvent Event

func orNullJSON(v json.RawMessage) json.RawMessage {
	if v == nil {
		return json.RawMessage("null")
	}
	return v
}

// newEventLocked describes a change of r (w.mu held).
func newEventLocked(typ, id string, r *record, old, new json.RawMessage) rawEvent {
	return rawEvent{
		EventType: typ, ID: id, Name: r.name, Description: r.description,
		Schema: orNullJSON(r.schema), OldValue: orNullJSON(old), NewValue: orNullJSON(new),
		Metadata: r.metadata,
	}
}

// expanded returns ev with its values expanded. A value that cannot be
// expanded stays as stored.
func (w *Worker) expanded(ev rawEvent) Event {
	out := Event(ev)
	for _, v := range []*json.RawMessage{&out.OldValue, &out.NewValue} {
		if bytes.Equal(*v, []byte("null")) {
			continue
		}
		if x, _, err := w.exp.expand(*v); err == nil {
			*v = x
		}
	}
	return out
}

// hub fans events out to the sinks: Subscribe callbacks and configuration
// triggers. emit runs under w.mu (so events are queued in the order the
// changes happened) and never blocks; each sink delivers from its own
// goroutine (a dropqueue), never under the worker's locks.
type hub struct {
	mu     sync.Mutex
	sinks  map[*sink]struct{}
	closed bool
	wg     sync.WaitGroup // every sink's goroutine, removed ones too
}

// sink is one subscriber: the events it wants and its queue.
type sink struct {
	match   func(rawEvent) bool // nil = every event
	deliver func(rawEvent)
	onDrop  func(dropped int)
	q       *dropqueue.Queue[rawEvent]
}

// add starts a sink; false when the hub is closed.
func (h *hub) add(s *sink) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	if h.sinks == nil {
		h.sinks = map[*sink]struct{}{}
	}
	s.q = dropqueue.Start(&h.wg, eventQueueLimit, s.deliver, s.onDrop)
	h.sinks[s] = struct{}{}
	return true
}

// remove stops s; it delivers nothing more. It does not wait.
func (h *hub) remove(s *sink) {
	h.mu.Lock()
	delete(h.sinks, s)
	h.mu.Unlock()
	s.q.Stop()
}

// emit queues ev for every sink that wants it. Called with w.mu held.
func (h *hub) emit(ev rawEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.sinks {
		if s.match == nil || s.match(ev) {
			s.q.Push(ev)
		}
	}
}

// close stops every sink and waits for their goroutines.
func (h *hub) close() {
	h.mu.Lock()
	h.closed = true
	sinks := h.sinks
	h.sinks = nil
	h.mu.Unlock()
	for s := range sinks {
		s.q.Stop()
	}
	h.wg.Wait()
}

// Subscribe calls fn with every change to any entry from now on:
// configuration:registered (register or ensure of an id the worker did not
// know, or a new file), configuration:updated (a later register or ensure,
// set, a hand edit of the file, a store switch that changed the value) and
// configuration:deleted (the file removed). Reads never produce events; nor
// do in-memory entries (SetInMemory).
//
// fn runs on a goroutine of the worker's, one event at a time in the order
// the changes happened, never under the worker's locks, so it may call the
// worker. A slow fn never delays set or register: at most 256 events wait
// for it, and beyond that the oldest waiting one is dropped (logged as a
// warning). cancel stops further calls and returns once none is running
// (called from within fn it returns at once; that call is the last). After
// Close, Subscribe returns a cancel that does nothing and fn is never
// called.
func (w *Worker) Subscribe(fn func(Event)) (cancel func()) {
	s := &sink{
		deliver: func(ev rawEvent) { fn(w.expanded(ev)) },
		onDrop: func(n int) {
			w.log.Warn("configuration subscriber too slow: events dropped", "dropped", n)
		},
	}
	if !w.events.add(s) {
		return func() {}
	}
	return func() {
		w.events.remove(s)
		s.q.Wait()
	}
}
