package stream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/internal/atomicfile"
)

// Limits bound what one client can make the worker hold. Zero fields take
// the defaults (DefaultLimits).
type Limits struct {
	// IDBytes bounds stream_name, group_id, item_id and a subscription id.
	IDBytes int
	// ValueBytes bounds one item's value (compact JSON).
	ValueBytes int
	// StoreBytes bounds the whole store: every id and value, plus
	// itemOverhead per item.
	StoreBytes int64
	// Connections bounds the stream socket's open connections.
	Connections int
	// SubscriptionsPerConnection bounds the joins one connection holds.
	SubscriptionsPerConnection int
	// FrameBytes bounds one message a client sends on the stream socket.
	FrameBytes int64
}

// DefaultLimits are the limits a zero Limits field takes.
var DefaultLimits = Limits{
	IDBytes:                    256,
	ValueBytes:                 1 << 20,
	StoreBytes:                 64 << 20,
	Connections:                1024,
	SubscriptionsPerConnection: 128,
	FrameBytes:                 64 << 10,
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.IDBytes > 0 {
		d.IDBytes = l.IDBytes
	}
	if l.ValueBytes > 0 {
		d.ValueBytes = l.ValueBytes
	}
	if l.StoreBytes > 0 {
		d.StoreBytes = l.StoreBytes
	}
	if l.Connections > 0 {
		d.Connections = l.Connections
	}
	if l.SubscriptionsPerConnection > 0 {
		d.SubscriptionsPerConnection = l.SubscriptionsPerConnection
	}
	if l.FrameBytes > 0 {
		d.FrameBytes = l.FrameBytes
	}
	return d
}

// itemOverhead is what one item costs beyond its ids and value in the
// StoreBytes account, so a flood of empty items is bounded too.
const itemOverhead = 64

// storeFile is the persisted store's name inside its directory.
const storeFile = "streams.json"

type group struct {
	keys  []string // insertion order, as upstream lists a group
	items map[string]json.RawMessage
}

// Store is the kv adapter: streams > groups > items, each item a JSON
// value. With a directory it is persisted there as one file, written
// atomically (temporary file, fsync, rename) every save interval when it
// changed and when it closes, and read back when it opens.
type Store struct {
	limits Limits
	dir    string // "" = in memory

	mu      sync.Mutex
	streams map[string]map[string]*group
	bytes   int64
	dirty   bool
	gen     uint64 // counts changes, so a save knows what it wrote

	saveMu sync.Mutex // one save at a time
	stop   chan struct{}
	done   chan struct{}
}

// OpenStore opens the store. dir "" keeps it in memory; otherwise the
// directory is created (0700) and the file in it, if any, is loaded: a file
// that cannot be read back fails with STREAM_STORE_CORRUPT rather than be
// overwritten. saveEvery > 0 starts the save loop.
func OpenStore(dir string, saveEvery time.Duration, limits Limits) (*Store, error) {
	s := &Store{limits: limits.withDefaults(), dir: dir, streams: map[string]map[string]*group{}}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, errorf(CodeStoreIO, "create the stream store directory %s: %v", dir, err)
		}
		if err := s.load(); err != nil {
			return nil, err
		}
	}
	if dir != "" && saveEvery > 0 {
		s.stop, s.done = make(chan struct{}), make(chan struct{})
		go s.saveLoop(saveEvery)
	}
	return s, nil
}

// Path is the persisted file ("" in memory).
func (s *Store) Path() string {
	if s.dir == "" {
		return ""
	}
	return filepath.Join(s.dir, storeFile)
}

// Close stops the save loop and saves what changed.
func (s *Store) Close() error {
	if s.stop != nil {
		close(s.stop)
		<-s.done
		s.stop = nil
	}
	return s.Save()
}

func (s *Store) saveLoop(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			_ = s.Save() // retried at the next tick and at Close
		}
	}
}

func cost(itemID string, v json.RawMessage) int64 {
	return int64(len(itemID)+len(v)) + itemOverhead
}

// groupCost is what a new stream or group adds.
func groupCost(name string) int64 { return int64(len(name)) + itemOverhead }

func (s *Store) groupLocked(streamName, groupID string, create bool) (*group, int64) {
	st := s.streams[streamName]
	var added int64
	if st == nil {
		if !create {
			return nil, 0
		}
		st = map[string]*group{}
		added += groupCost(streamName)
	}
	g := st[groupID]
	if g == nil {
		if !create {
			return nil, 0
		}
		g = &group{items: map[string]json.RawMessage{}}
		added += groupCost(groupID)
	}
	return g, added
}

func (s *Store) attachLocked(streamName, groupID string, g *group) {
	st := s.streams[streamName]
	if st == nil {
		st = map[string]*group{}
		s.streams[streamName] = st
	}
	st[groupID] = g
}

// putLocked stores value (already compact) as the item, checking the
// store's bound; it returns the old value (nil when there was none).
func (s *Store) putLocked(streamName, groupID, itemID string, value json.RawMessage) (json.RawMessage, error) {
	g, added := s.groupLocked(streamName, groupID, true)
	old, had := g.items[itemID]
	delta := added + cost(itemID, value)
	if had {
		delta -= cost(itemID, old)
	}
	if s.bytes+delta > s.limits.StoreBytes {
		return nil, errorf(CodeStoreFull, "the stream store holds %d of its %d bytes and this write needs %d more; delete items or groups first", s.bytes, s.limits.StoreBytes, delta)
	}
	if !had {
		g.keys = append(g.keys, itemID)
	}
	g.items[itemID] = value
	s.attachLocked(streamName, groupID, g)
	s.bytes += delta
	s.changedLocked()
	if !had {
		return nil, nil
	}
	return old, nil
}

func (s *Store) changedLocked() {
	s.dirty = true
	s.gen++
}

// Set stores data as the item and returns the old value (nil: created).
func (s *Store) Set(_ context.Context, streamName, groupID, itemID string, data json.RawMessage) (old, stored json.RawMessage, err error) {
	if err := s.limits.checkKey(streamName, groupID, itemID); err != nil {
		return nil, nil, err
	}
	v, err := s.limits.compactValue(data)
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, err = s.putLocked(streamName, groupID, itemID, v)
	return old, v, err
}

// Get returns the item's value, or nil when it does not exist.
func (s *Store) Get(_ context.Context, streamName, groupID, itemID string) (json.RawMessage, error) {
	if err := s.limits.checkKey(streamName, groupID, itemID); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g, _ := s.groupLocked(streamName, groupID, false)
	if g == nil {
		return nil, nil
	}
	return g.items[itemID], nil
}

// Delete removes the item and returns its value (nil: there was none).
// An emptied group, and an emptied stream, go too.
func (s *Store) Delete(_ context.Context, streamName, groupID, itemID string) (json.RawMessage, error) {
	if err := s.limits.checkKey(streamName, groupID, itemID); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g, _ := s.groupLocked(streamName, groupID, false)
	if g == nil {
		return nil, nil
	}
	old, had := g.items[itemID]
	if !had {
		return nil, nil
	}
	delete(g.items, itemID)
	g.keys = slices.DeleteFunc(g.keys, func(k string) bool { return k == itemID })
	s.bytes -= cost(itemID, old)
	if len(g.items) == 0 {
		st := s.streams[streamName]
		delete(st, groupID)
		s.bytes -= groupCost(groupID)
		if len(st) == 0 {
			delete(s.streams, streamName)
			s.bytes -= groupCost(streamName)
		}
	}
	s.changedLocked()
	return old, nil
}

// List returns the group's values in insertion order ([] when empty).
func (s *Store) List(_ context.Context, streamName, groupID string) ([]json.RawMessage, error) {
	if err := s.limits.checkGroup(streamName, groupID); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []json.RawMessage{}
	g, _ := s.groupLocked(streamName, groupID, false)
	if g == nil {
		return out, nil
	}
	for _, k := range g.keys {
		out = append(out, g.items[k])
	}
	return out, nil
}

// Groups returns the stream's group ids, sorted ([] when none).
func (s *Store) Groups(_ context.Context, streamName string) ([]string, error) {
	if err := s.limits.checkID("stream_name", streamName); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []string{}
	for g := range s.streams[streamName] {
		out = append(out, g)
	}
	slices.Sort(out)
	return out, nil
}

// Meta is one stream of stream::list_all.
type Meta struct {
	ID     string   `json:"id"`
	Groups []string `json:"groups"`
}

// All returns every stream with its groups, sorted.
func (s *Store) All(context.Context) ([]Meta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Meta{}
	for name, st := range s.streams {
		m := Meta{ID: name, Groups: []string{}}
		for g := range st {
			m.Groups = append(m.Groups, g)
		}
		slices.Sort(m.Groups)
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Meta) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	return out, nil
}

// Update applies ops to the item atomically and stores the result (the
// item is created when missing). old is nil when it did not exist.
func (s *Store) Update(_ context.Context, streamName, groupID, itemID string, ops []UpdateOp) (old, updated json.RawMessage, errs []OpError, err error) {
	if err := s.limits.checkKey(streamName, groupID, itemID); err != nil {
		return nil, nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var cur any
	exists := false
	if g, _ := s.groupLocked(streamName, groupID, false); g != nil {
		if raw, ok := g.items[itemID]; ok {
			if cur, err = decodeValue(raw); err != nil {
				return nil, nil, nil, errorf(CodeStoreCorrupt, "item %s/%s/%s holds invalid JSON: %v", streamName, groupID, itemID, err)
			}
			exists = true
		}
	}
	next, errs := applyOps(cur, exists, ops)
	raw, err := json.Marshal(next)
	if err != nil {
		return nil, nil, nil, errorf(CodeInvalidInput, "the updated value cannot be encoded: %v", err)
	}
	if len(raw) > s.limits.ValueBytes {
		return nil, nil, nil, errorf(CodeValueTooLarge, "the updated value is %d bytes; at most %d are allowed per item", len(raw), s.limits.ValueBytes)
	}
	old, err = s.putLocked(streamName, groupID, itemID, raw)
	if err != nil {
		return nil, nil, nil, err
	}
	return old, raw, errs, nil
}

// ── persistence ───────────────────────────────────────────────────────────

type fileItem struct {
	ID    string          `json:"id"`
	Value json.RawMessage `json:"value"`
}

type fileGroup struct {
	ID    string     `json:"id"`
	Items []fileItem `json:"items"`
}

type fileStream struct {
	Name   string      `json:"name"`
	Groups []fileGroup `json:"groups"`
}

type fileDoc struct {
	Version int          `json:"version"`
	Streams []fileStream `json:"streams"`
}

const fileVersion = 1

// Save writes the store when it changed since the last save.
func (s *Store) Save() error {
	if s.dir == "" {
		return nil
	}
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	s.mu.Lock()
	if !s.dirty {
		s.mu.Unlock()
		return nil
	}
	doc := fileDoc{Version: fileVersion, Streams: []fileStream{}}
	for name, st := range s.streams {
		fs := fileStream{Name: name}
		for gid, g := range st {
			fg := fileGroup{ID: gid, Items: make([]fileItem, 0, len(g.keys))}
			for _, k := range g.keys {
				fg.Items = append(fg.Items, fileItem{ID: k, Value: g.items[k]})
			}
			fs.Groups = append(fs.Groups, fg)
		}
		doc.Streams = append(doc.Streams, fs)
	}
	gen := s.gen
	data, err := json.Marshal(doc)
	s.mu.Unlock()
	if err != nil {
		return errorf(CodeStoreIO, "encode the stream store: %v", err)
	}
	if err := atomicfile.Write(filepath.Join(s.dir, storeFile), data, 0o600); err != nil {
		return errorf(CodeStoreIO, "save the stream store: %v", err)
	}
	s.mu.Lock()
	if s.gen == gen {
		s.dirty = false
	}
	s.mu.Unlock()
	return nil
}

// load reads the persisted file back, through the same checks as a write,
// so a file edited by hand cannot exceed the limits.
func (s *Store) load() error {
	path := filepath.Join(s.dir, storeFile)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return errorf(CodeStoreIO, "open %s: %v", path, err)
	}
	defer f.Close()
	// A JSON file of the store is about its size in the account; allow
	// room for escaping.
	max := 2*s.limits.StoreBytes + 1<<20
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return errorf(CodeStoreIO, "read %s: %v", path, err)
	}
	corrupt := func(format string, args ...any) error {
		return errorf(CodeStoreCorrupt, "%s: %s; move the file away to start with an empty store (its data is not read)", path, fmt.Sprintf(format, args...))
	}
	if int64(len(data)) > max {
		return corrupt("the file is over %d bytes", max)
	}
	var doc fileDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return corrupt("not a stream store file: %v", err)
	}
	if doc.Version != fileVersion {
		return corrupt("version %d is not %d", doc.Version, fileVersion)
	}
	for _, st := range doc.Streams {
		for _, g := range st.Groups {
			for _, it := range g.Items {
				if err := s.limits.checkKey(st.Name, g.ID, it.ID); err != nil {
					return corrupt("%v", err)
				}
				v, err := s.limits.compactValue(it.Value)
				if err != nil {
					return corrupt("item %s/%s/%s: %v", st.Name, g.ID, it.ID, err)
				}
				if _, err := s.putLocked(st.Name, g.ID, it.ID, v); err != nil {
					return corrupt("%v", err)
				}
			}
		}
	}
	s.dirty = false
	return nil
}
