package configuration

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strconv"
	"sync"
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
// goroutine, never under the worker's locks.
type hub struct {
	mu     sync.Mutex
	sinks  map[*sink]struct{}
	closed bool
	wg     sync.WaitGroup
}

// sink is one subscriber's bounded queue and the goroutine draining it.
type sink struct {
	match   func(rawEvent) bool // nil = every event
	deliver func(rawEvent)
	onDrop  func(dropped int)

	mu      sync.Mutex
	queue   []rawEvent
	dropped int
	stopped bool
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	gid     uint64 // the delivering goroutine
	gidSet  chan struct{}
	stopOne sync.Once
}

// add starts a sink; false when the hub is closed.
func (h *hub) add(s *sink) bool {
	s.wake = make(chan struct{}, 1)
	s.stop = make(chan struct{})
	s.done = make(chan struct{})
	s.gidSet = make(chan struct{})
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	if h.sinks == nil {
		h.sinks = map[*sink]struct{}{}
	}
	h.sinks[s] = struct{}{}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		s.run()
	}()
	return true
}

// remove stops s; it delivers nothing more. It does not wait.
func (h *hub) remove(s *sink) {
	h.mu.Lock()
	delete(h.sinks, s)
	h.mu.Unlock()
	s.halt()
}

// emit queues ev for every sink that wants it. Called with w.mu held.
func (h *hub) emit(ev rawEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.sinks {
		if s.match == nil || s.match(ev) {
			s.push(ev)
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
		s.halt()
	}
	h.wg.Wait()
}

func (s *sink) push(ev rawEvent) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	if len(s.queue) >= eventQueueLimit {
		s.queue[0] = rawEvent{}
		s.queue = s.queue[1:]
		s.dropped++
	}
	s.queue = append(s.queue, ev)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *sink) halt() {
	s.stopOne.Do(func() {
		s.mu.Lock()
		s.stopped = true
		s.queue = nil
		s.mu.Unlock()
		close(s.stop)
	})
}

func (s *sink) run() {
	defer close(s.done)
	s.gid = goroutineID()
	close(s.gidSet)
	for {
		select {
		case <-s.stop:
			return
		case <-s.wake:
		}
		for {
			s.mu.Lock()
			if s.stopped || len(s.queue) == 0 {
				s.mu.Unlock()
				break
			}
			ev := s.queue[0]
			s.queue[0] = rawEvent{}
			s.queue = s.queue[1:]
			dropped := s.dropped
			s.dropped = 0
			s.mu.Unlock()
			if dropped > 0 && s.onDrop != nil {
				s.onDrop(dropped)
			}
			s.deliver(ev)
		}
	}
}

// wait returns once the sink's goroutine has ended, unless called from
// that goroutine (a callback cancelling itself), which cannot wait for
// itself: then the current delivery is the last.
func (s *sink) wait() {
	select {
	case <-s.done:
		return
	case <-s.gidSet:
	}
	if s.gid == goroutineID() {
		return
	}
	<-s.done
}

// goroutineID reads the current goroutine's id from its stack header
// ("goroutine 42 [running]:").
func goroutineID() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseUint(string(b), 10, 64)
	return id
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
		s.wait()
	}
}
