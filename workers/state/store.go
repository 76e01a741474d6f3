package state

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/internal/atomicfile"
)

// store is what the functions need of an adapter. Values are compact JSON.
type store interface {
	Get(ctx context.Context, scope, key string) (json.RawMessage, bool, error)
	// Set stores value and returns the old one (ok false: there was none).
	Set(ctx context.Context, scope, key string, value json.RawMessage) (json.RawMessage, bool, error)
	// Delete removes the item and returns the old value.
	Delete(ctx context.Context, scope, key string) (json.RawMessage, bool, error)
	// Update replaces the item with what f makes of it, atomically.
	Update(ctx context.Context, scope, key string, f func(old json.RawMessage, ok bool) (json.RawMessage, error)) (old json.RawMessage, existed bool, err error)
	// Entries lists a scope's items, by key.
	Entries(ctx context.Context, scope string) ([]Entry, error)
	// Scopes lists the scopes that hold an item, sorted.
	Scopes(ctx context.Context) ([]string, error)
	// SetSaveInterval changes how often a persisted store saves.
	SetSaveInterval(d time.Duration)
	// Close saves what is unsaved and releases the store.
	Close(ctx context.Context) error
}

// Entry is one item of a scope.
type Entry struct {
	Key   string
	Value json.RawMessage
}

// kvStore is the kv adapter: a map in memory, saved (file_based) one file
// per scope under dir every save interval and at Close, each file replaced
// atomically, so a crash loses at most one interval and never half a file.
type kvStore struct {
	log hclog.Logger
	dir string // "" = in_memory

	mu     sync.Mutex
	scopes map[string]map[string]json.RawMessage
	dirty  map[string]bool

	interval chan time.Duration
	stop     chan struct{}
	done     chan struct{}
	closing  sync.Once
}

var _ store = (*kvStore)(nil)

// scopeFile is the file of scope under dir: the name is hex so any scope
// (slashes, dots, unicode) is a safe file name.
func scopeFile(dir, scope string) string {
	return filepath.Join(dir, "scope-"+hex.EncodeToString([]byte(scope))+".json")
}

type scopeFileData struct {
	Scope   string                     `json:"scope"`
	Entries map[string]json.RawMessage `json:"entries"`
}

// openKV opens the kv store; with dir (file_based) it loads every scope
// file there first. A file that is not one of ours is refused rather than
// silently dropped on the next save.
func openKV(log hclog.Logger, dir string, interval time.Duration) (*kvStore, error) {
	s := &kvStore{log: log, dir: dir, scopes: map[string]map[string]json.RawMessage{}, dirty: map[string]bool{}}
	if dir == "" {
		return s, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, errorf(CodeStoreUnavailable, "create the state directory %s: %v", dir, err)
	}
	names, err := filepath.Glob(filepath.Join(dir, "scope-*.json"))
	if err != nil {
		return nil, errorf(CodeStoreUnavailable, "list %s: %v", dir, err)
	}
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, errorf(CodeStoreUnavailable, "read %s: %v", name, err)
		}
		var f scopeFileData
		if err := json.Unmarshal(b, &f); err != nil || scopeFile(dir, f.Scope) != name {
			return nil, errorf(CodeStoreUnavailable, "%s is not a state scope file (%v); move it away to start without it", name, err)
		}
		if len(f.Entries) > 0 {
			s.scopes[f.Scope] = f.Entries
		}
	}
	s.interval = make(chan time.Duration, 1)
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go s.saver(interval)
	return s, nil
}

func (s *kvStore) saver(interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case d := <-s.interval:
			t.Reset(d)
		case <-t.C:
			if err := s.save(); err != nil {
				s.log.Error("save the state store", "error", err)
			}
		}
	}
}

// save writes the scopes changed since the last save.
func (s *kvStore) save() error {
	s.mu.Lock()
	type job struct {
		scope string
		data  []byte
	}
	var jobs []job
	for scope := range s.dirty {
		var data []byte
		if m := s.scopes[scope]; len(m) > 0 {
			b, err := json.Marshal(scopeFileData{Scope: scope, Entries: m})
			if err != nil {
				s.mu.Unlock()
				return err
			}
			data = b
		}
		jobs = append(jobs, job{scope, data})
	}
	clear(s.dirty)
	s.mu.Unlock()
	var errs []error
	for _, j := range jobs {
		path := scopeFile(s.dir, j.scope)
		var err error
		if j.data == nil {
			if err = os.Remove(path); errors.Is(err, os.ErrNotExist) {
				err = nil
			}
		} else {
			err = atomicfile.Write(path, j.data, 0o600)
		}
		if err != nil {
			// Written again at the next save.
			s.mu.Lock()
			s.dirty[j.scope] = true
			s.mu.Unlock()
			errs = append(errs, fmt.Errorf("save scope %q: %w", j.scope, err))
		}
	}
	return errors.Join(errs...)
}

func (s *kvStore) touch(scope string) {
	if s.dir != "" {
		s.dirty[scope] = true
	}
}

func (s *kvStore) Get(_ context.Context, scope, key string) (json.RawMessage, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.scopes[scope][key]
	return v, ok, nil
}

func (s *kvStore) Set(_ context.Context, scope, key string, value json.RawMessage) (json.RawMessage, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.scopes[scope]
	if m == nil {
		m = map[string]json.RawMessage{}
		s.scopes[scope] = m
	}
	old, ok := m[key]
	m[key] = value
	s.touch(scope)
	return old, ok, nil
}

func (s *kvStore) Delete(_ context.Context, scope, key string) (json.RawMessage, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.scopes[scope]
	old, ok := m[key]
	if !ok {
		return nil, false, nil
	}
	delete(m, key)
	if len(m) == 0 {
		delete(s.scopes, scope)
	}
	s.touch(scope)
	return old, true, nil
}

func (s *kvStore) Update(_ context.Context, scope, key string, f func(json.RawMessage, bool) (json.RawMessage, error)) (json.RawMessage, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.scopes[scope][key]
	next, err := f(old, ok)
	if err != nil {
		return old, ok, err
	}
	m := s.scopes[scope]
	if m == nil {
		m = map[string]json.RawMessage{}
		s.scopes[scope] = m
	}
	m[key] = next
	s.touch(scope)
	return old, ok, nil
}

func (s *kvStore) Entries(_ context.Context, scope string) ([]Entry, error) {
	s.mu.Lock()
	m := s.scopes[scope]
	out := make([]Entry, 0, len(m))
	for k, v := range m {
		out = append(out, Entry{k, v})
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

func (s *kvStore) Scopes(context.Context) ([]string, error) {
	s.mu.Lock()
	out := make([]string, 0, len(s.scopes))
	for k := range s.scopes {
		out = append(out, k)
	}
	s.mu.Unlock()
	slices.Sort(out)
	return out, nil
}

func (s *kvStore) SetSaveInterval(d time.Duration) {
	if s.interval == nil {
		return
	}
	select {
	case <-s.interval:
	default:
	}
	s.interval <- d
}

// Close stops the saver and saves what changed since its last save.
func (s *kvStore) Close(context.Context) error {
	if s.dir == "" || s.stop == nil {
		return nil
	}
	var err error
	s.closing.Do(func() {
		close(s.stop)
		<-s.done
		err = s.save()
	})
	return err
}
