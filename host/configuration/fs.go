package configuration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/internal/atomicfile"
)

// Defaults of the fs store's watcher.
const (
	DefaultPollInterval = 250 * time.Millisecond
	// DefaultDebounce is how long a file must stay unchanged before an
	// edit is applied, so an editor's half-written save is never read.
	DefaultDebounce = 500 * time.Millisecond
	// maxFileSize bounds what the store reads per entry.
	maxFileSize = 8 << 20
)

// FSOptions configure an FSStore.
type FSOptions struct {
	Dir          string
	PollInterval time.Duration // 0 = DefaultPollInterval
	Debounce     time.Duration // 0 = DefaultDebounce
}

// FSStore keeps one <id>.yaml per entry in a directory, holding id, name,
// description and value. The directory is created on the first write, so
// an engine that never stores anything leaves no trace.
//
// The watcher polls instead of using inotify: it works the same on every
// platform and filesystem (network mounts, bind mounts into containers),
// and a few small files are cheap to re-read.
type FSStore struct {
	dir      string
	poll     time.Duration
	debounce time.Duration

	mu sync.Mutex
	// known holds, per id, the hash of the content the worker has seen
	// ("" = no file). The watcher reports only departures from it, and
	// Put records its own writes here first, so they are never reported
	// as hand edits.
	known map[string]string
}

var _ Store = (*FSStore)(nil)

// NewFSStore returns a store over opts.Dir (which should be absolute).
func NewFSStore(opts FSOptions) *FSStore {
	s := &FSStore{dir: opts.Dir, poll: opts.PollInterval, debounce: opts.Debounce, known: map[string]string{}}
	if s.poll <= 0 {
		s.poll = DefaultPollInterval
	}
	if s.debounce <= 0 {
		s.debounce = DefaultDebounce
	}
	return s
}

// Dir is the directory the store uses.
func (s *FSStore) Dir() string { return s.dir }

// Describe implements Store.
func (s *FSStore) Describe() string { return "fs:" + s.dir }

func (s *FSStore) path(id string) string { return filepath.Join(s.dir, id+".yaml") }

// idFromFile maps "<id>.yaml" to id; other names (temp files, editor
// backups, files whose name is not a valid id) are not entries.
func idFromFile(name string) (string, bool) {
	id, ok := strings.CutSuffix(name, ".yaml")
	if !ok || !validID(id) {
		return "", false
	}
	return id, true
}

// Load implements Store. A missing directory is an empty store.
func (s *FSStore) Load(ctx context.Context) ([]StoredEntry, []error, error) {
	files, err := s.scan()
	if err != nil {
		return nil, nil, err
	}
	ids := make([]string, 0, len(files))
	for id := range files {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var entries []StoredEntry
	var warnings []error
	s.mu.Lock()
	defer s.mu.Unlock()
	s.known = map[string]string{}
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		f := files[id]
		s.known[id] = f.hash
		if f.err != nil {
			warnings = append(warnings, f.err)
			continue
		}
		e, err := decodeEntryFile(id, f.data)
		if err != nil {
			warnings = append(warnings, fmt.Errorf("%s: %w", s.path(id), err))
			continue
		}
		entries = append(entries, e)
	}
	return entries, warnings, nil
}

type fileState struct {
	data []byte
	hash string
	err  error
}

// scan reads every entry file of the directory.
func (s *FSStore) scan() (map[string]fileState, error) {
	des, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]fileState{}, nil
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("cannot read directory %s: %w", s.dir, err)
	}
	out := map[string]fileState{}
	for _, de := range des {
		id, ok := idFromFile(de.Name())
		if !ok || de.IsDir() {
			continue
		}
		data, err := readLimited(s.path(id))
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed between ReadDir and the read
		}
		st := fileState{data: data, hash: hashOf(data), err: err}
		if err != nil {
			// An unreadable file still counts as present; its hash marks
			// the failure so it is reported once, not on every poll.
			st.hash = "unreadable:" + err.Error()
		}
		out[id] = st
	}
	return out, nil
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxFileSize)
	}
	return data, nil
}

func hashOf(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Put implements Store: write a temporary file, fsync it, rename it over
// the entry, fsync the directory. A crash leaves the old or the new file,
// never a torn one.
func (s *FSStore) Put(ctx context.Context, e StoredEntry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := encodeEntryFile(e)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", s.dir, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Recorded before the rename: a poll that sees the new file must
	// already know it is ours.
	prev, had := s.known[e.ID]
	s.known[e.ID] = hashOf(data)
	if err := writeAtomic(s.path(e.ID), data); err != nil {
		if had {
			s.known[e.ID] = prev
		} else {
			delete(s.known, e.ID)
		}
		return err
	}
	return nil
}

// Delete implements Store: it removes <id>.yaml and syncs the directory.
func (s *FSStore) Delete(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, had := s.known[id]
	// Forgotten before the removal: a poll that misses the file must
	// already know it went away on purpose.
	delete(s.known, id)
	if err := os.Remove(s.path(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		if had {
			s.known[id] = prev
		}
		return fmt.Errorf("remove %s: %w", s.path(id), err)
	}
	if d, err := os.Open(s.dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// writeAtomic replaces path with data. Entry files are the user's own
// (0600, in a 0700 directory): a value may hold a secret, e.g. a
// redis_url with its password.
func writeAtomic(path string, data []byte) error {
	if err := atomicfile.Write(path, data, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

type pending struct {
	hash  string
	since time.Time
}

// Watch implements Store.
func (s *FSStore) Watch(ctx context.Context, fn func(Change)) {
	t := time.NewTicker(s.poll)
	defer t.Stop()
	waiting := map[string]pending{}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.poll1(now, waiting, fn)
		}
	}
}

// poll1 compares the directory with what the worker knows. A difference
// is applied once it has stayed the same for the debounce time.
func (s *FSStore) poll1(now time.Time, waiting map[string]pending, fn func(Change)) {
	files, err := s.scan()
	if err != nil {
		return // an unreadable directory keeps the current values
	}
	s.mu.Lock()
	ids := map[string]bool{}
	for id := range files {
		ids[id] = true
	}
	for id, h := range s.known {
		if h != "" {
			ids[id] = true
		}
	}
	var due []string
	for id := range ids {
		cur := files[id].hash // "" when the file is gone
		if cur == s.known[id] {
			delete(waiting, id)
			continue
		}
		w, ok := waiting[id]
		if !ok || w.hash != cur {
			waiting[id] = pending{hash: cur, since: now}
			continue
		}
		if now.Sub(w.since) >= s.debounce {
			s.known[id] = cur
			delete(waiting, id)
			due = append(due, id)
		}
	}
	s.mu.Unlock()
	sort.Strings(due)
	for _, id := range due {
		f, present := files[id]
		c := Change{ID: id, Source: s.path(id)}
		switch {
		case !present:
			c.Deleted = true
		case f.err != nil:
			c.Err = f.err
		default:
			e, err := decodeEntryFile(id, f.data)
			if err != nil {
				c.Err = err
			} else {
				c.Entry = &e
			}
		}
		fn(c)
	}
}

// The on-disk shape is {id, name, description, value}. The schema is
// deliberately absent: it belongs to the registering worker.

func encodeEntryFile(e StoredEntry) ([]byte, error) {
	value, err := jsonToNode(e.Value)
	if err != nil {
		return nil, fmt.Errorf("value of %s: %w", e.ID, err)
	}
	str := func(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }
	doc := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
		str("id"), str(e.ID),
		str("name"), str(e.Name),
		str("description"), str(e.Description),
		str("value"), value,
	}}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("encode %s: %w", e.ID, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode %s: %w", e.ID, err)
	}
	return buf.Bytes(), nil
}

// decodeEntryFile reads one <id>.yaml. It is strict (unknown or repeated
// keys, an id that differs from the file name) because a hand edit with a
// typo must be refused, not half-applied.
func decodeEntryFile(id string, data []byte) (e StoredEntry, err error) {
	defer func() {
		// yaml.v3 is third-party code fed with a user's file.
		if r := recover(); r != nil {
			err = fmt.Errorf("the YAML parser failed on this file (%v)", r)
		}
	}()
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return e, fmt.Errorf("not valid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if len(doc.Content) == 0 {
		return e, errors.New("the file is empty; it needs id, name, description and value")
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return e, errors.New("the file must be a mapping with id, name, description and value")
	}
	seen := map[string]bool{}
	var valueNode *yaml.Node
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		if seen[k.Value] {
			return e, fmt.Errorf("line %d: key %q appears twice", k.Line, k.Value)
		}
		seen[k.Value] = true
		switch k.Value {
		case "id", "name", "description":
			if v.Kind != yaml.ScalarNode {
				return e, fmt.Errorf("line %d: %s must be a string", v.Line, k.Value)
			}
			s := v.Value
			if v.ShortTag() == "!!null" {
				s = ""
			}
			switch k.Value {
			case "id":
				e.ID = s
			case "name":
				e.Name = s
			default:
				e.Description = s
			}
		case "value":
			valueNode = v
		default:
			return e, fmt.Errorf("line %d: unknown key %q; an entry file has id, name, description and value", k.Line, k.Value)
		}
	}
	if e.ID != id {
		return e, fmt.Errorf("id %q does not match the file name %s.yaml", e.ID, id)
	}
	e.Value = []byte("null")
	if valueNode != nil {
		if e.Value, err = nodeToJSON(valueNode); err != nil {
			return e, fmt.Errorf("value: %w", err)
		}
	}
	return e, nil
}
