package queue

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"
)

// Store keeps the worker's pending messages, dead letters, subscriptions
// and defined queues: in memory, and (file_based) in an append-only log
// written before a publish or enqueue is answered, so a message accepted
// survives a crash of the worker (or of the engine) and is delivered
// again. The log is rewritten compacted at open and when it has grown to
// several times what it holds. One worker at a time uses a directory (an
// flock on LOCK).
type Store struct {
	mu      sync.Mutex
	dir     string
	f       *os.File // nil: in memory
	lock    *os.File
	size    int64 // bytes in the log
	dirty   bool  // written since the last fsync
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
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create the queue directory %s: %w", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", filepath.Join(dir, lockName), err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("another queue worker uses %s (its LOCK is held): give each queue worker its own file_path", dir)
	}
	s := &Store{dir: dir, lock: lock}
	newMemState(s)
	path := filepath.Join(dir, logName)
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		lock.Close()
		return nil, fmt.Errorf("read the queue log %s: %w", path, err)
	}
	off := 0
	for off < len(b) {
		r, n, err := decodeRecord(b[off:])
		if err != nil {
			s.Recovered = fmt.Sprintf("%s at byte %d of %d: %v; the rest was set aside", path, off, len(b), err)
			if !errors.Is(err, ErrShortRecord) {
				aside := fmt.Sprintf("%s.corrupt-%d", path, time.Now().UnixNano())
				_ = os.WriteFile(aside, b, 0o600)
				s.Recovered += " in " + aside
			}
			break
		}
		s.apply(r)
		off += n
	}
	if err := s.rewrite(); err != nil {
		lock.Close()
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
		m := m
		out = append(out, &record{Op: opPut, Msg: &m})
	}
	for _, id := range sortedKeys(s.dlq) {
		e := s.dlq[id]
		out = append(out, &record{Op: opDLQ, Entry: &e})
	}
	return out
}

// rewrite writes the state to a new log and puts it in place (fsynced),
// then appends to it.
func (s *Store) rewrite() error {
	path := filepath.Join(s.dir, logName)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("compact the queue log: %w", err)
	}
	var size int64
	for _, r := range s.snapshot() {
		b, err := encodeRecord(r)
		if err == nil {
			_, err = f.Write(b)
		}
		if err != nil {
			f.Close()
			os.Remove(tmp)
			return fmt.Errorf("compact the queue log: %w", err)
		}
		size += int64(len(b))
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("compact the queue log: %w", err)
	}
	f.Close()
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("compact the queue log: %w", err)
	}
	if d, err := os.Open(s.dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	nf, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open the queue log: %w", err)
	}
	if s.f != nil {
		s.f.Close()
	}
	s.f, s.size, s.dirty = nf, size, false
	return nil
}

// write appends r to the log (when there is one), then applies it. The
// log is written before the state changes: what the state holds is on
// disk.
func (s *Store) write(r *record) error {
	if s.closed {
		return errorf(CodeStoreUnavailable, "the queue store is closed")
	}
	if s.f != nil {
		b, err := encodeRecord(r)
		if err != nil {
			return errorf(CodeStoreFailed, "%v", err)
		}
		if _, err := s.f.Write(b); err != nil {
			return errorf(CodeStoreFailed, "write the queue log: %v", err)
		}
		s.size += int64(len(b))
		s.dirty = true
	}
	s.apply(r)
	if s.f != nil && s.size > compactMin && s.size > 4*s.liveEstimate() {
		if err := s.rewrite(); err != nil {
			return errorf(CodeStoreFailed, "%v", err)
		}
	}
	return nil
}

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
	if s.closed {
		return errorf(CodeStoreUnavailable, "the queue store is closed")
	}
	if s.f != nil {
		var buf []byte
		for i := range ms {
			b, err := encodeRecord(&record{Op: opPut, Msg: &ms[i]})
			if err != nil {
				return errorf(CodeStoreFailed, "%v", err)
			}
			buf = append(buf, b...)
		}
		if _, err := s.f.Write(buf); err != nil {
			return errorf(CodeStoreFailed, "write the queue log: %v", err)
		}
		s.size += int64(len(buf))
		s.dirty = true
	}
	for i := range ms {
		s.apply(&record{Op: opPut, Msg: &ms[i]})
	}
	return nil
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
	if s.f == nil || !s.dirty {
		return nil
	}
	s.dirty = false
	return s.f.Sync()
}

// Close syncs and closes the log and releases the directory.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var err error
	if s.f != nil {
		err = s.f.Sync()
		if cerr := s.f.Close(); err == nil {
			err = cerr
		}
	}
	if s.lock != nil {
		s.lock.Close()
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
