package queue

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"
)

// Store keeps the worker's pending messages, dead letters, subscriptions
// and defined queues: in memory, and (file_based, or redis) in an
// append-only log written before a publish or enqueue is answered, so a
// message accepted survives a crash of the worker (or of the engine) and
// is delivered again. The log is rewritten compacted at open and when it
// has grown to several times what it holds. One worker at a time uses a
// log (an flock on the directory's LOCK, a lock key in Redis).
type Store struct {
	mu      sync.Mutex
	sink    sink // nil: in memory
	size    int64
	pending map[string]Message
	dlq     map[string]DLQEntry
	subs    map[string]Subscription
	defs    map[string]QueueConfig
	seq     uint64
	closed  bool
	// Recovered says what Open found wrong with the log (torn tail,
	// corrupt record), "" when nothing.
	Recovered string
}

// sink is where the log lives.
type sink interface {
	// load is the whole log.
	load() ([]byte, error)
	// appendRecords adds encoded records, all or none.
	appendRecords(recs [][]byte) error
	// rewrite replaces the log with recs.
	rewrite(recs [][]byte) error
	// where names the log in messages.
	where() string
	sync() error
	close() error
}

const (
	logName  = "queue.log"
	lockName = "LOCK"
	// compactMin: below this size the log is never compacted while
	// running.
	compactMin = 4 << 20
)

func newMemState(s *Store) {
	s.pending = map[string]Message{}
	s.dlq = map[string]DLQEntry{}
	s.subs = map[string]Subscription{}
	s.defs = map[string]QueueConfig{}
}

// OpenMemory is a store that keeps nothing across a restart.
func OpenMemory() *Store {
	s := &Store{}
	newMemState(s)
	return s
}

// OpenStore opens (creating) the log in dir and replays it.
func OpenStore(dir string) (*Store, error) {
	fs, err := openFileSink(dir)
	if err != nil {
		return nil, err
	}
	return openSink(fs)
}

// openSink replays the log of k and compacts it.
func openSink(k sink) (*Store, error) {
	s := &Store{sink: k}
	newMemState(s)
	b, err := k.load()
	if err != nil {
		k.close()
		return nil, err
	}
	off := 0
	for off < len(b) {
		r, n, err := decodeRecord(b[off:])
		if err != nil {
			s.Recovered = fmt.Sprintf("%s at byte %d of %d: %v; the rest was set aside", k.where(), off, len(b), err)
			if fk, ok := k.(*fileSink); ok && !errors.Is(err, ErrShortRecord) {
				aside := fmt.Sprintf("%s.corrupt-%d", fk.path(), time.Now().UnixNano())
				_ = os.WriteFile(aside, b, 0o600)
				s.Recovered += " in " + aside
			}
			break
		}
		s.apply(r)
		off += n
	}
	if err := s.compact(); err != nil {
		k.close()
		return nil, err
	}
	return s, nil
}

// apply changes the in-memory state as r says.
func (s *Store) apply(r *record) {
	switch r.Op {
	case opPut:
		s.pending[r.Msg.ID] = *r.Msg
		s.seq = max(s.seq, r.Msg.Seq)
	case opAck:
		delete(s.pending, r.ID)
	case opDLQ:
		delete(s.pending, r.Entry.Job.ID)
		s.dlq[r.Entry.Job.ID] = *r.Entry
		s.seq = max(s.seq, r.Entry.Job.Seq)
	case opUndlq:
		delete(s.dlq, r.ID)
	case opSub:
		s.subs[r.Sub.ID] = *r.Sub
	case opUnsub:
		delete(s.subs, r.ID)
	case opDefine:
		s.defs[r.Queue] = *r.Def
	}
}

// snapshot is the records that rebuild the state.
func (s *Store) snapshot() []*record {
	var out []*record
	for _, q := range sortedKeys(s.defs) {
		d := s.defs[q]
		out = append(out, &record{Op: opDefine, Queue: q, Def: &d})
	}
	for _, id := range sortedKeys(s.subs) {
		sub := s.subs[id]
		out = append(out, &record{Op: opSub, Sub: &sub})
	}
	for _, m := range s.pendingSorted() {
		out = append(out, &record{Op: opPut, Msg: &m})
	}
	for _, id := range sortedKeys(s.dlq) {
		e := s.dlq[id]
		out = append(out, &record{Op: opDLQ, Entry: &e})
	}
	return out
}

// compact rewrites the log as the records that rebuild the state.
func (s *Store) compact() error {
	var recs [][]byte
	var size int64
	for _, r := range s.snapshot() {
		b, err := encodeRecord(r)
		if err != nil {
			return fmt.Errorf("compact the queue log: %w", err)
		}
		recs = append(recs, b)
		size += int64(len(b))
	}
	if err := s.sink.rewrite(recs); err != nil {
		return fmt.Errorf("compact the queue log %s: %w", s.sink.where(), err)
	}
	s.size = size
	return nil
}

// writeAll appends rs to the log (when there is one), then applies them.
// The log is written before the state changes: what the state holds is on
// disk.
func (s *Store) writeAll(rs ...*record) error {
	if s.closed {
		return errorf(CodeStoreUnavailable, "the queue store is closed")
	}
	if s.sink != nil {
		recs := make([][]byte, 0, len(rs))
		for _, r := range rs {
			b, err := encodeRecord(r)
			if err != nil {
				return errorf(CodeStoreFailed, "%v", err)
			}
			recs = append(recs, b)
			s.size += int64(len(b))
		}
		if err := s.sink.appendRecords(recs); err != nil {
			return errorf(CodeStoreFailed, "write the queue log %s: %v", s.sink.where(), err)
		}
	}
	for _, r := range rs {
		s.apply(r)
	}
	if s.sink != nil && s.size > compactMin && s.size > 4*s.liveEstimate() {
		if err := s.compact(); err != nil {
			return errorf(CodeStoreFailed, "%v", err)
		}
	}
	return nil
}

func (s *Store) write(r *record) error { return s.writeAll(r) }

// liveEstimate guesses the compacted size from the data sizes.
func (s *Store) liveEstimate() int64 {
	var n int64 = 1
	for _, m := range s.pending {
		n += int64(len(m.Data)) + 256
	}
	for _, e := range s.dlq {
		n += int64(len(e.Job.Data)+len(e.Error)) + 320
	}
	return n + int64(len(s.subs)+len(s.defs))*256
}

// NextSeq is a new message's sequence number (order of acceptance).
func (s *Store) NextSeq() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return s.seq
}

// Put records a pending message (new, or its attempts updated).
func (s *Store) Put(m Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.write(&record{Op: opPut, Msg: &m})
}

// PutAll records several new messages at once (a fan-out): all or none
// are written.
func (s *Store) PutAll(ms []Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := make([]*record, len(ms))
	for i := range ms {
		rs[i] = &record{Op: opPut, Msg: &ms[i]}
	}
	return s.writeAll(rs...)
}

// Ack forgets a delivered message.
func (s *Store) Ack(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.write(&record{Op: opAck, ID: id})
}

// ToDLQ moves a message to its queue's DLQ.
func (s *Store) ToDLQ(e DLQEntry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.write(&record{Op: opDLQ, Entry: &e})
}

// Redrive moves a DLQ entry back to pending as m (attempts reset): one
// record for the removal and one for the message, the message first so a
// crash between them delivers it rather than loses it.
func (s *Store) Redrive(id string, m Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.dlq[id]; !ok {
		return errorf(CodeMessageNotFound, "message %q is not in a DLQ", clip(id))
	}
	if err := s.write(&record{Op: opPut, Msg: &m}); err != nil {
		return err
	}
	return s.write(&record{Op: opUndlq, ID: id})
}

// Discard removes a DLQ entry.
func (s *Store) Discard(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.dlq[id]; !ok {
		return errorf(CodeMessageNotFound, "message %q is not in a DLQ", clip(id))
	}
	return s.write(&record{Op: opUndlq, ID: id})
}

// PutSub records a subscription.
func (s *Store) PutSub(sub Subscription) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.write(&record{Op: opSub, Sub: &sub})
}

// DelSub forgets a subscription.
func (s *Store) DelSub(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.write(&record{Op: opUnsub, ID: id})
}

// Define records a function queue defined at run time.
func (s *Store) Define(name string, q QueueConfig) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.write(&record{Op: opDefine, Queue: name, Def: &q})
}

// Pending is every pending message in order of acceptance.
func (s *Store) Pending() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pendingSorted()
}

func (s *Store) pendingSorted() []Message {
	out := make([]Message, 0, len(s.pending))
	for _, m := range s.pending {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out
}

// DLQ is queue's dead letters, oldest first.
func (s *Store) DLQ(queue string) []DLQEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []DLQEntry
	for _, e := range s.dlq {
		if e.Job.Queue == queue {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Job.Seq < out[j].Job.Seq })
	return out
}

// DLQEntry is one dead letter.
func (s *Store) DLQEntry(id string) (DLQEntry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.dlq[id]
	return e, ok
}

// DLQCounts is the number of dead letters per queue.
func (s *Store) DLQCounts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, e := range s.dlq {
		out[e.Job.Queue]++
	}
	return out
}

// Subs is every subscription.
func (s *Store) Subs() []Subscription {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Subscription, 0, len(s.subs))
	for _, id := range sortedKeys(s.subs) {
		out = append(out, s.subs[id])
	}
	return out
}

// Defs is every queue defined with queue::define.
func (s *Store) Defs() map[string]QueueConfig {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]QueueConfig, len(s.defs))
	for k, v := range s.defs {
		out[k] = v
	}
	return out
}

// Sync flushes the log to disk when it was written since the last time.
func (s *Store) Sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sink == nil || s.closed {
		return nil
	}
	return s.sink.sync()
}

// Close syncs and closes the log and releases it.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.sink == nil {
		return nil
	}
	err := s.sink.sync()
	if cerr := s.sink.close(); err == nil {
		err = cerr
	}
	return err
}

// SyncEvery fsyncs the log every d until stop is closed.
func (s *Store) SyncEvery(d time.Duration, stop <-chan struct{}, onErr func(error)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if err := s.Sync(); err != nil && onErr != nil {
				onErr(err)
			}
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
