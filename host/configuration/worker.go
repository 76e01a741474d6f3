// Package configuration is the engine-owned configuration worker (spec
// iii-0.26 §6): named entries with a JSON Schema and a value, served as
// configuration::* in the default namespace and as a Go API for in-process
// users (the sandbox router, the plugin host, Compose).
//
// Values are stored by a Store (the fs store: one YAML file per id). The
// schema is never stored; it is known once the owning worker registers
// after each start, and until then set fails with SCHEMA_UNAVAILABLE.
// Reads expand ${VAR} and ${VAR:default} against the live environment.
package configuration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/iii-sandbox/iii/host/config"
	"github.com/iii-sandbox/iii/internal/lazyre"
	"github.com/iii-sandbox/iii/protocol"
)

// Error codes of configuration::* (docs/configuration-worker.md).
const (
	CodeNotFound          = "NOT_FOUND"
	CodeNotRegistered     = "NOT_REGISTERED"
	CodeInvalidID         = "INVALID_ID"
	CodeSchemaInvalid     = "SCHEMA_INVALID"
	CodeSchemaUnavailable = "SCHEMA_UNAVAILABLE"
	CodeAdapterError      = "ADAPTER_ERROR"
	// CodeInvalidRequest: the request is not an object or a field has the
	// wrong type or is missing.
	CodeInvalidRequest = "INVALID_REQUEST"
)

var idRE = lazyre.New(`^[a-z0-9_-]{1,64}$`)

func validID(id string) bool { return idRE.MatchString(id) }

// Options configure a Worker.
type Options struct {
	Logger hclog.Logger // nil = null logger
	// Version replaces the default literal __III_ENGINE_VERSION__.
	Version string
	// Lookup reads environment variables on every get; nil = os.LookupEnv.
	Lookup config.LookupFunc
	// Store keeps the values; required.
	Store Store
	// Name is the worker name in the engine; "configuration" by default
	// (config.yaml may call it configuration#<instance>).
	Name string
	// TTL is ttl_seconds: when positive, an entry that the last
	// configuration trigger naming it left is deleted after TTL unless a
	// trigger names it again first (see SetTTL).
	TTL time.Duration
}

// Entry is a registered configuration as configuration::register returns
// it. Value is the stored template (placeholders not expanded).
type Entry struct {
	ID          string          `json:"id"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Schema      json.RawMessage `json:"schema"`
	Value       json.RawMessage `json:"value"`
	Metadata    json.RawMessage `json:"metadata,omitempty"`
}

// Summary describes an entry without its value (list, schema).
type Summary struct {
	ID          string          `json:"id"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Schema      json.RawMessage `json:"schema"`
	Metadata    json.RawMessage `json:"metadata,omitempty"`
}

// RegisterRequest is the input of register and ensure.
type RegisterRequest struct {
	ID           string          `json:"id"`
	Name         string          `json:"name"`
	Description  string          `json:"description"`
	Schema       json.RawMessage `json:"schema"`
	InitialValue json.RawMessage `json:"initial_value,omitempty"`
	Metadata     json.RawMessage `json:"metadata,omitempty"`
}

// record is one id's state. A record exists when the id is registered
// since this start, stored, or both.
type record struct {
	name, description string
	schema            json.RawMessage    // nil until registered
	compiled          *jsonschema.Schema // nil until registered
	metadata          json.RawMessage
	value             json.RawMessage // the stored template; nil = none
	stored            bool            // the store holds a file for it
}

func (r *record) registered() bool { return r.compiled != nil }

// Worker is the configuration worker.
type Worker struct {
	log     hclog.Logger
	name    string
	exp     expander
	printer *message.Printer

	mu       sync.Mutex
	store    Store
	records  map[string]*record
	inMemory map[string]json.RawMessage

	// watch is the running watcher of the current store.
	watchCancel context.CancelFunc
	watchDone   chan struct{}

	attached attachment

	// events fans changes out to Subscribe callbacks and configuration
	// triggers (events.go).
	events hub
	// trig serves the configuration trigger type (trigger.go).
	trig triggers
}

// New returns a worker over opts.Store. Call Open before serving calls.
func New(opts Options) *Worker {
	w := &Worker{
		log:      opts.Logger,
		name:     opts.Name,
		exp:      expander{lookup: opts.Lookup, version: opts.Version},
		printer:  message.NewPrinter(language.Und),
		store:    opts.Store,
		records:  map[string]*record{},
		inMemory: map[string]json.RawMessage{},
	}
	if w.log == nil {
		w.log = hclog.NewNullLogger()
	}
	if w.exp.lookup == nil {
		w.exp.lookup = os.LookupEnv
	}
	if w.name == "" {
		w.name = config.TypeConfiguration
	}
	w.trig.w, w.trig.ttl = w, opts.TTL
	return w
}

// Open loads the store and starts watching it for hand edits.
func (w *Worker) Open(ctx context.Context) error {
	if w.store == nil {
		return fmt.Errorf("configuration worker: no store")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.watchCancel != nil {
		return fmt.Errorf("configuration worker: already open")
	}
	if err := w.loadLocked(ctx, w.store); err != nil {
		return err
	}
	w.startWatchLocked()
	return nil
}

// Close stops the watcher and leaves the engine. Safe to call twice.
func (w *Worker) Close() {
	w.detach()
	w.mu.Lock()
	cancel, done := w.watchCancel, w.watchDone
	w.watchCancel, w.watchDone = nil, nil
	w.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	w.events.close()
}

// SwapStore moves the worker to another store (config.yaml changed the
// directory): registrations and in-memory entries stay, stored values are
// replaced by the new store's. On error the old store stays in use.
func (w *Worker) SwapStore(ctx context.Context, store Store) error {
	w.mu.Lock()
	cancel, done := w.watchCancel, w.watchDone
	w.watchCancel, w.watchDone = nil, nil
	w.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	before := make(map[string]record, len(w.records))
	for id, r := range w.records {
		before[id] = *r
	}
	if err := w.loadLocked(ctx, store); err != nil {
		w.startWatchLocked()
		return err
	}
	w.emitSwapLocked(before)
	w.log.Info("configuration store changed", "store", store.Describe())
	w.store = store
	w.startWatchLocked()
	return nil
}

// StoreDescription names the store in use ("fs:/srv/config").
func (w *Worker) StoreDescription() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.store.Describe()
}

// emitSwapLocked reports what a store switch changed: an entry the new
// store adds is registered, one whose value differs updated, one the
// worker no longer knows deleted.
func (w *Worker) emitSwapLocked(before map[string]record) {
	ids := make([]string, 0, len(w.records)+len(before))
	for id := range w.records {
		ids = append(ids, id)
	}
	for id := range before {
		if w.records[id] == nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		r := w.records[id]
		old, had := before[id]
		switch {
		case r == nil:
			w.events.emit(newEventLocked(EventDeleted, id, &old, old.value, nil))
		case !had:
			w.events.emit(newEventLocked(EventRegistered, id, r, nil, r.value))
		case !bytes.Equal(old.value, r.value):
			typ := EventUpdated
			if r.value == nil {
				typ = EventDeleted
			}
			w.events.emit(newEventLocked(typ, id, r, old.value, r.value))
		}
	}
}

func (w *Worker) loadLocked(ctx context.Context, store Store) error {
	entries, warnings, err := store.Load(ctx)
	if err != nil {
		return &protocol.ErrorBody{Code: CodeAdapterError, Message: fmt.Sprintf("configuration store %s: %v", store.Describe(), err)}
	}
	for _, wrn := range warnings {
		w.log.Warn("configuration entry skipped", "reason", wrn)
	}
	loaded := map[string]StoredEntry{}
	for _, e := range entries {
		loaded[e.ID] = e
	}
	for id, r := range w.records {
		r.value, r.stored = nil, false
		if !r.registered() {
			delete(w.records, id)
		}
	}
	for id, e := range loaded {
		r := w.records[id]
		if r == nil {
			r = &record{name: e.Name, description: e.Description}
			w.records[id] = r
		}
		if r.registered() {
			if v := w.violationsLocked(r, e.Value); len(v) > 0 {
				w.log.Warn("stored configuration does not match its schema; ignoring it", "id", id, "violations", strings.Join(v, "; "))
				continue
			}
		}
		r.value, r.stored = e.Value, true
	}
	return nil
}

func (w *Worker) startWatchLocked() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	w.watchCancel, w.watchDone = cancel, done
	store := w.store
	go func() {
		defer close(done)
		store.Watch(ctx, w.applyChange)
	}()
}

// applyChange takes in a hand edit. One that does not parse or does not
// match the registered schema is refused with a warning and the old value
// stays, so a typo in a file never reaches the workers that read it.
func (w *Worker) applyChange(c Change) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.records[c.ID]
	switch {
	case c.Err != nil:
		w.log.Warn("configuration file edit rejected; keeping the old value", "id", c.ID, "file", c.Source, "reason", c.Err)
	case c.Deleted:
		if r == nil {
			return
		}
		old := r.value
		r.value, r.stored = nil, false
		if !r.registered() {
			delete(w.records, c.ID)
		}
		w.events.emit(newEventLocked(EventDeleted, c.ID, r, old, nil))
		w.log.Info("configuration file removed; the entry has no value now", "id", c.ID, "file", c.Source)
	default:
		if r != nil && r.registered() {
			if v := w.violationsLocked(r, c.Entry.Value); len(v) > 0 {
				w.log.Warn("configuration file edit rejected: it does not match the schema; keeping the old value",
					"id", c.ID, "file", c.Source, "violations", strings.Join(v, "; "))
				return
			}
		}
		typ := EventUpdated
		if r == nil {
			typ = EventRegistered
			r = &record{}
			w.records[c.ID] = r
		}
		if !r.registered() {
			r.name, r.description = c.Entry.Name, c.Entry.Description
		}
		old := r.value
		r.value, r.stored = c.Entry.Value, true
		w.events.emit(newEventLocked(typ, c.ID, r, old, r.value))
		w.log.Info("configuration file edit applied", "id", c.ID, "file", c.Source)
	}
}

// violationsLocked validates a value the way set does: after expansion,
// and not at all while a referenced variable is unset (the value is only
// complete in the environment it will be read in).
func (w *Worker) violationsLocked(r *record, value json.RawMessage) []string {
	expanded, unresolved, err := w.exp.expand(value)
	if err != nil {
		return []string{err.Error()}
	}
	if len(unresolved) > 0 {
		return nil
	}
	v, err := validate(w.printer, r.compiled, expanded)
	if err != nil {
		return []string{err.Error()}
	}
	return v
}

func errf(code, format string, args ...any) *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: code, Message: fmt.Sprintf(format, args...)}
}

func checkID(id string) error {
	if !validID(id) {
		return errf(CodeInvalidID, "invalid configuration id %q: use 1 to 64 characters from a-z, 0-9, _ and - (the id is also a file name)", id)
	}
	return nil
}

func isNullJSON(v json.RawMessage) bool {
	s := strings.TrimSpace(string(v))
	return s == "" || s == "null"
}

// compactJSON checks v is one JSON value and returns it compact.
func compactJSON(field string, v json.RawMessage) (json.RawMessage, error) {
	n, err := jsonToNode(v)
	if err != nil {
		return nil, errf(CodeInvalidRequest, "%s is not valid JSON: %v", field, err)
	}
	out, err := nodeToJSON(n)
	if err != nil {
		return nil, errf(CodeInvalidRequest, "%s: %v", field, err)
	}
	return out, nil
}

func (w *Worker) inMemoryError(id, op string) error {
	return errf(CodeNotRegistered, "configuration %q is not registered: the engine holds it in memory (Compose sets it each time it starts the worker it configures), so %s cannot change it; edit config_override in worker-compose.yaml and run compose::restart", id, op)
}

// Register creates or replaces an entry's schema, name, description and
// metadata. The stored value stays unless InitialValue is given (and
// valid). Idempotent.
func (w *Worker) Register(ctx context.Context, req RegisterRequest) (*Entry, error) {
	return w.register(ctx, req, false)
}

// Ensure is Register that seeds InitialValue only when no non-null value is
// stored, and never overwrites one: the race-free way to seed defaults.
func (w *Worker) Ensure(ctx context.Context, req RegisterRequest) (*Entry, error) {
	return w.register(ctx, req, true)
}

func (w *Worker) register(ctx context.Context, req RegisterRequest, ensure bool) (*Entry, error) {
	op := "configuration::register"
	if ensure {
		op = "configuration::ensure"
	}
	if err := checkID(req.ID); err != nil {
		return nil, err
	}
	if isNullJSON(req.Schema) {
		return nil, errf(CodeInvalidRequest, "%s needs a schema (a JSON Schema for the value)", op)
	}
	schema, err := compactJSON("schema", req.Schema)
	if err != nil {
		return nil, err
	}
	compiled, err := compileSchema(req.ID, schema)
	if err != nil {
		return nil, errf(CodeSchemaInvalid, "the schema of %q is not a valid JSON Schema: %v", req.ID, err)
	}
	var metadata json.RawMessage
	if !isNullJSON(req.Metadata) {
		if metadata, err = compactJSON("metadata", req.Metadata); err != nil {
			return nil, err
		}
	}
	var initial json.RawMessage
	if !isNullJSON(req.InitialValue) {
		if initial, err = compactJSON("initial_value", req.InitialValue); err != nil {
			return nil, err
		}
	}
	name := req.Name
	if name == "" {
		name = req.ID
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.inMemory[req.ID]; ok {
		return nil, errf(CodeInvalidID, "configuration id %q is reserved: the engine holds it in memory (Compose sets it for the worker it configures); register another id", req.ID)
	}
	r := w.records[req.ID]
	next := record{name: name, description: req.Description, schema: schema, compiled: compiled, metadata: metadata}
	if r != nil {
		next.value, next.stored = r.value, r.stored
	}
	seed := initial != nil && (!ensure || isNullJSON(next.value))
	if seed {
		if v := w.violationsLocked(&next, initial); len(v) > 0 {
			return nil, errf(CodeSchemaInvalid, "initial_value of %q does not match its schema:\n- %s", req.ID, strings.Join(v, "\n- "))
		}
		next.value = initial
	}
	nameChanged := r != nil && (r.name != next.name || r.description != next.description)
	if seed || (next.stored && nameChanged) {
		if err := w.store.Put(ctx, StoredEntry{ID: req.ID, Name: next.name, Description: next.description, Value: next.value}); err != nil {
			return nil, errf(CodeAdapterError, "store %q in %s: %v", req.ID, w.store.Describe(), err)
		}
		next.stored = true
	}
	typ := EventUpdated
	var old json.RawMessage
	if r == nil {
		typ = EventRegistered
		r = &record{}
		w.records[req.ID] = r
	} else {
		old = r.value
	}
	*r = next
	w.events.emit(newEventLocked(typ, req.ID, r, old, r.value))
	w.log.Debug("configuration registered", "id", req.ID, "op", op)
	return r.entry(req.ID), nil
}

func (r *record) entry(id string) *Entry {
	v := r.value
	if v == nil {
		v = json.RawMessage("null")
	}
	return &Entry{ID: id, Name: r.name, Description: r.description, Schema: r.schema, Value: v, Metadata: r.metadata}
}

func (r *record) summary(id string) Summary {
	s := r.schema
	if s == nil {
		s = json.RawMessage("null")
	}
	return Summary{ID: id, Name: r.name, Description: r.description, Schema: s, Metadata: r.metadata}
}

// Set validates value against the registered schema and stores it. It
// returns the previous and the new stored values (templates).
func (w *Worker) Set(ctx context.Context, id string, value json.RawMessage) (old, new json.RawMessage, err error) {
	if err := checkID(id); err != nil {
		return nil, nil, err
	}
	if value == nil {
		value = json.RawMessage("null")
	}
	value, err = compactJSON("value", value)
	if err != nil {
		return nil, nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.inMemory[id]; ok {
		return nil, nil, w.inMemoryError(id, "configuration::set")
	}
	r := w.records[id]
	switch {
	case r == nil:
		return nil, nil, errf(CodeNotRegistered, "configuration %q is not registered: the worker that owns it registers it with configuration::register (or configuration::ensure) first", id)
	case !r.registered():
		return nil, nil, errf(CodeSchemaUnavailable, "the schema of %q is not known yet: the store does not keep schemas, and the worker that owns %q has not registered since the engine started; start that worker, then set it again", id, id)
	}
	if v := w.violationsLocked(r, value); len(v) > 0 {
		return nil, nil, errf(CodeSchemaInvalid, "value of %q does not match its schema:\n- %s", id, strings.Join(v, "\n- "))
	}
	if err := w.store.Put(ctx, StoredEntry{ID: id, Name: r.name, Description: r.description, Value: value}); err != nil {
		return nil, nil, errf(CodeAdapterError, "store %q in %s: %v", id, w.store.Describe(), err)
	}
	old = r.value
	if old == nil {
		old = json.RawMessage("null")
	}
	r.value, r.stored = value, true
	w.events.emit(newEventLocked(EventUpdated, id, r, old, value))
	return old, value, nil
}

// Get returns an entry's value. Unless raw, placeholders in string leaves
// are expanded against the environment now; unset variables without a
// default stay as written.
func (w *Worker) Get(ctx context.Context, id string, raw bool) (json.RawMessage, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	w.mu.Lock()
	value, ok := w.inMemory[id]
	if !ok {
		r := w.records[id]
		if r == nil {
			w.mu.Unlock()
			return nil, errf(CodeNotFound, "configuration %q not found: nothing registered or stored it", id)
		}
		value = r.value
	}
	w.mu.Unlock()
	if value == nil {
		return json.RawMessage("null"), nil
	}
	if raw {
		return value, nil
	}
	out, _, err := w.exp.expand(value)
	if err != nil {
		return nil, errf(CodeAdapterError, "expand %q: %v", id, err)
	}
	return out, nil
}

// List describes every registered or stored entry, sorted by id. Values
// are never included.
func (w *Worker) List(ctx context.Context) []Summary {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Summary, 0, len(w.records))
	for id, r := range w.records {
		out = append(out, r.summary(id))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Schema describes one entry.
func (w *Worker) Schema(ctx context.Context, id string) (*Summary, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.records[id]
	if r == nil {
		if _, ok := w.inMemory[id]; ok {
			return nil, errf(CodeNotFound, "configuration %q has no schema: the engine holds it in memory and nothing registered it", id)
		}
		return nil, errf(CodeNotFound, "configuration %q not found: nothing registered or stored it", id)
	}
	if !r.registered() {
		return nil, errf(CodeSchemaUnavailable, "the schema of %q is not known yet: the worker that owns it has not registered since the engine started", id)
	}
	s := r.summary(id)
	return &s, nil
}

// SetInMemory makes get return value for id without writing it anywhere.
// The engine uses it for entries it derives itself (Compose's
// <ns>-sandbox-libkrun); configuration::set on such an id fails with
// NOT_REGISTERED, and register refuses the id.
func (w *Worker) SetInMemory(id string, value json.RawMessage) error {
	if err := checkID(id); err != nil {
		return err
	}
	if value == nil {
		value = json.RawMessage("null")
	}
	value, err := compactJSON("value", value)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inMemory[id] = value
	return nil
}

// ClearInMemory forgets an in-memory entry.
func (w *Worker) ClearInMemory(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.inMemory, id)
}

// expire deletes an entry whose TTL ran out: its file and its
// registration (the owner registers it again to bring it back). It fires
// configuration:deleted. In-memory entries never expire.
func (w *Worker) expire(ctx context.Context, id string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.records[id]
	if r == nil {
		return nil
	}
	if _, ok := w.inMemory[id]; ok {
		return nil
	}
	if r.stored {
		if err := w.store.Delete(ctx, id); err != nil {
			return errf(CodeAdapterError, "delete %q from %s: %v", id, w.store.Describe(), err)
		}
	}
	delete(w.records, id)
	w.events.emit(newEventLocked(EventDeleted, id, r, r.value, nil))
	w.log.Info("configuration expired: no trigger subscribed to it for ttl_seconds; deleted", "id", id)
	return nil
}

func osPID() int { return os.Getpid() }
