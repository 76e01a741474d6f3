// Package state is the registry's `state` worker: a scoped key/value store
// served as state::* functions, with the `state` trigger type of
// upstream's trigger-type generation (what the published Node iii-sdk
// 0.22.1 speaks), over the kv adapter (in memory, or saved to files) or
// Redis. docs/standard-workers.md is its user's page; cmd/state is the
// binary Compose runs (workers/workerkit connects it).
package state

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/dropqueue"
	"github.com/iii-sandbox/iii/protocol"
)

// Event types of the change event (upstream's StateEventType).
const (
	EventCreated = "state:created"
	EventUpdated = "state:updated"
	EventDeleted = "state:deleted"
)

// TriggerType is the trigger type the worker provides.
const TriggerType = "state"

// Bounds of the fan-out (events wait per worker; each call may take).
const (
	eventQueue  = 1024
	callTimeout = 60 * time.Second
)

// Invoker calls a function through the engine: a trigger's condition and
// function, in the trigger's namespace, with its metadata.
type Invoker interface {
	Invoke(ctx context.Context, namespace, functionID string, payload, metadata json.RawMessage) (json.RawMessage, error)
}

// ClientInvoker is the Invoker of a connected worker.
type ClientInvoker struct{ C *client.Client }

// Invoke calls functionID in namespace ("" is default).
func (ci ClientInvoker) Invoke(ctx context.Context, ns, fn string, payload, md json.RawMessage) (json.RawMessage, error) {
	if ns == "" {
		ns = "default"
	}
	opts := []client.CallOption{client.WithNamespace(ns), client.WithTimeout(callTimeout)}
	if len(md) > 0 {
		opts = append(opts, client.WithMetadata(md))
	}
	return ci.C.Call(ctx, fn, payload, opts...)
}

// Options configure New.
type Options struct {
	Logger hclog.Logger
	// BaseDir anchors a relative kv file_path ($III_COMPOSE_DIR under
	// Compose, else the working directory).
	BaseDir string
	// Invoker fires the triggers; nil fires none (unit tests of the ops).
	Invoker Invoker
}

// Worker is the state worker's logic, independent of the connection.
type Worker struct {
	log     hclog.Logger
	store   store
	spec    StoreSpec
	invoker Invoker

	triggersOn atomic.Bool
	valueLimit atomic.Int64

	tmu      sync.RWMutex
	triggers map[string]boundTrigger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	events *dropqueue.Queue[stateEvent]

	snaps snapshots
}

type boundTrigger struct {
	id, functionID, namespace string
	metadata                  json.RawMessage
	cfg                       triggerConfig
}

// triggerConfig is a state trigger's config (upstream's StateTriggerSpec).
type triggerConfig struct {
	Scope               *string `json:"scope,omitempty"`
	Key                 *string `json:"key,omitempty"`
	ConditionFunctionID *string `json:"condition_function_id,omitempty"`
}

func (c triggerConfig) matches(scope, key string) bool {
	return (c.Scope == nil || *c.Scope == scope) && (c.Key == nil || *c.Key == key)
}

// stateEvent is the change event, upstream's payload.
type stateEvent struct {
	Type      string          `json:"type"`
	EventType string          `json:"event_type"`
	Scope     string          `json:"scope"`
	Key       string          `json:"key"`
	OldValue  json.RawMessage `json:"old_value"`
	NewValue  json.RawMessage `json:"new_value"`
	bindings  []boundTrigger
}

// New opens the store cfg names and starts the trigger dispatcher.
func New(ctx context.Context, cfg Config, o Options) (*Worker, error) {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	spec, err := cfg.Store(o.BaseDir)
	if err != nil {
		return nil, err
	}
	var st store
	switch spec.Adapter {
	case "redis":
		st, err = openRedis(ctx, spec.RedisURL)
	default:
		dir := ""
		if spec.Persist {
			dir = spec.Dir
		}
		st, err = openKV(o.Logger, dir, spec.SaveInterval)
	}
	if err != nil {
		return nil, err
	}
	w := &Worker{log: o.Logger, store: st, spec: spec, invoker: o.Invoker, triggers: map[string]boundTrigger{}}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	w.events = dropqueue.Start(&w.wg, eventQueue, w.deliver, func(n int) {
		w.log.Warn("state triggers too slow: change events dropped", "dropped", n)
	})
	w.snaps.init()
	w.Reconfigure(cfg)
	o.Logger.Info("state store open", "adapter", spec.Adapter, "file_based", spec.Persist, "dir", spec.Dir, "save_interval", spec.SaveInterval)
	return w, nil
}

// Reconfigure applies the live settings of cfg (triggers_enabled,
// max_value_bytes, save_interval_ms). A different adapter is logged: it
// takes effect when the worker starts again, as upstream's.
func (w *Worker) Reconfigure(cfg Config) {
	w.triggersOn.Store(cfg.TriggersOn())
	w.valueLimit.Store(cfg.ValueLimit())
	spec, err := cfg.Store("")
	if err != nil {
		w.log.Warn("state configuration not applied", "error", err)
		return
	}
	w.store.SetSaveInterval(spec.SaveInterval)
	if spec.Adapter != w.spec.Adapter || spec.Persist != w.spec.Persist || spec.RedisURL != w.spec.RedisURL {
		w.log.Warn("the state adapter changed; restart the worker to switch to it (compose::restart worker=state)", "from", w.spec.Adapter, "to", spec.Adapter)
	}
}

// Close stops the dispatcher (events not yet delivered are dropped) and
// saves and closes the store.
func (w *Worker) Close(ctx context.Context) error {
	w.cancel()
	w.events.Stop()
	w.events.Wait()
	return w.store.Close(ctx)
}

// --- requests ---

type scopeKey struct {
	Scope *string `json:"scope"`
	Key   *string `json:"key"`
}

func decodeObject(raw json.RawMessage, v any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return errorf(CodeInvalidInput, "the request must be a JSON object")
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return errorf(CodeInvalidInput, "%v", err)
	}
	return nil
}

func (r scopeKey) check(needKey bool) error {
	if r.Scope == nil {
		return errorf(CodeInvalidInput, "missing field `scope` (a string)")
	}
	if needKey && r.Key == nil {
		return errorf(CodeInvalidInput, "missing field `key` (a string)")
	}
	return nil
}

func orNullRaw(v json.RawMessage, ok bool) json.RawMessage {
	if !ok || v == nil {
		return json.RawMessage("null")
	}
	return v
}

func compact(v json.RawMessage) (json.RawMessage, error) {
	var b bytes.Buffer
	if err := json.Compact(&b, v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// SetResult is state::set's answer.
type SetResult struct {
	OldValue json.RawMessage `json:"old_value"`
	NewValue json.RawMessage `json:"new_value"`
}

// Set is state::set: {scope, key, value} (or data).
func (w *Worker) Set(ctx context.Context, raw json.RawMessage) (*SetResult, error) {
	var r struct {
		scopeKey
		Value json.RawMessage `json:"value"`
		Data  json.RawMessage `json:"data"`
	}
	if err := decodeObject(raw, &r); err != nil {
		return nil, err
	}
	if err := r.check(true); err != nil {
		return nil, err
	}
	v := r.Value
	if v == nil {
		v = r.Data
	}
	if v == nil {
		return nil, errorf(CodeInvalidInput, "missing field `value` (any JSON value; `data` is accepted too)")
	}
	v, err := compact(v)
	if err != nil {
		return nil, errorf(CodeInvalidInput, "value: %v", err)
	}
	if limit := w.valueLimit.Load(); limit > 0 && int64(len(v)) > limit {
		return nil, errorf(CodeValueTooLarge, "value of %d bytes exceeds the configured max_value_bytes limit of %d", len(v), limit)
	}
	old, ok, err := w.store.Set(ctx, *r.Scope, *r.Key, v)
	if err != nil {
		return nil, wrap(CodeSetError, "Failed to set value", err)
	}
	et := EventCreated
	if ok {
		et = EventUpdated
	}
	w.fire(et, *r.Scope, *r.Key, orNullRaw(old, ok), v)
	return &SetResult{OldValue: orNullRaw(old, ok), NewValue: v}, nil
}

// Get is state::get: the value, or null.
func (w *Worker) Get(ctx context.Context, raw json.RawMessage) (json.RawMessage, error) {
	var r scopeKey
	if err := decodeObject(raw, &r); err != nil {
		return nil, err
	}
	if err := r.check(true); err != nil {
		return nil, err
	}
	v, ok, err := w.store.Get(ctx, *r.Scope, *r.Key)
	if err != nil {
		return nil, wrap(CodeGetError, "Failed to get value", err)
	}
	return orNullRaw(v, ok), nil
}

// Delete is state::delete: the deleted value, or null. The deleted event
// fires even when there was nothing (upstream's).
func (w *Worker) Delete(ctx context.Context, raw json.RawMessage) (json.RawMessage, error) {
	var r scopeKey
	if err := decodeObject(raw, &r); err != nil {
		return nil, err
	}
	if err := r.check(true); err != nil {
		return nil, err
	}
	old, ok, err := w.store.Delete(ctx, *r.Scope, *r.Key)
	if err != nil {
		return nil, wrap(CodeDeleteError, "Failed to delete value", err)
	}
	w.fire(EventDeleted, *r.Scope, *r.Key, orNullRaw(old, ok), json.RawMessage("null"))
	return orNullRaw(old, ok), nil
}

// UpdateResult is state::update's answer; old_value is absent when the
// item was created, errors when every operation applied.
type UpdateResult struct {
	OldValue json.RawMessage `json:"old_value,omitempty"`
	NewValue json.RawMessage `json:"new_value"`
	Errors   []OpError       `json:"errors,omitempty"`
}

// Update is state::update: {scope, key, ops}, applied atomically in order.
func (w *Worker) Update(ctx context.Context, raw json.RawMessage) (*UpdateResult, error) {
	var r struct {
		scopeKey
		Ops json.RawMessage `json:"ops"`
	}
	if err := decodeObject(raw, &r); err != nil {
		return nil, err
	}
	if err := r.check(true); err != nil {
		return nil, err
	}
	if r.Ops == nil {
		return nil, errorf(CodeInvalidInput, "missing field `ops` (an array of update operations)")
	}
	ops, err := decodeOps(r.Ops)
	if err != nil {
		return nil, err
	}
	var next json.RawMessage
	var opErrs []OpError
	old, existed, err := w.store.Update(ctx, *r.Scope, *r.Key, func(old json.RawMessage, ok bool) (json.RawMessage, error) {
		var cur any
		if ok {
			v, err := decodeValue(old)
			if err != nil {
				return nil, err
			}
			cur = v
		}
		out, errs := applyOps(cur, ok, ops)
		b, err := json.Marshal(out)
		if err != nil {
			return nil, err
		}
		next, opErrs = b, errs
		return b, nil
	})
	if err != nil {
		return nil, wrap(CodeUpdateError, "Failed to update value", err)
	}
	et := EventCreated
	if existed {
		et = EventUpdated
	}
	w.fire(et, *r.Scope, *r.Key, orNullRaw(old, existed), next)
	res := &UpdateResult{NewValue: next, Errors: opErrs}
	if existed {
		res.OldValue = old
	}
	return res, nil
}

func (w *Worker) entries(ctx context.Context, raw json.RawMessage, code string) (string, []Entry, error) {
	var r scopeKey
	if err := decodeObject(raw, &r); err != nil {
		return "", nil, err
	}
	if err := r.check(false); err != nil {
		return "", nil, err
	}
	es, err := w.store.Entries(ctx, *r.Scope)
	if err != nil {
		return "", nil, wrap(code, "Failed to list", err)
	}
	return *r.Scope, es, nil
}

// List is state::list: the scope's values, by key.
func (w *Worker) List(ctx context.Context, raw json.RawMessage) ([]json.RawMessage, error) {
	_, es, err := w.entries(ctx, raw, CodeListError)
	if err != nil {
		return nil, err
	}
	out := make([]json.RawMessage, len(es))
	for i, e := range es {
		out[i] = e.Value
	}
	return out, nil
}

// KeysResult is state::list_keys' answer.
type KeysResult struct {
	Keys []string `json:"keys"`
}

// ListKeys is state::list_keys.
func (w *Worker) ListKeys(ctx context.Context, raw json.RawMessage) (*KeysResult, error) {
	_, es, err := w.entries(ctx, raw, CodeListKeysError)
	if err != nil {
		return nil, err
	}
	out := &KeysResult{Keys: make([]string, len(es))}
	for i, e := range es {
		out.Keys[i] = e.Key
	}
	return out, nil
}

// GroupsResult is state::list_groups' answer.
type GroupsResult struct {
	Groups []string `json:"groups"`
}

// ListGroups is state::list_groups: every scope that holds an item.
func (w *Worker) ListGroups(ctx context.Context, _ json.RawMessage) (*GroupsResult, error) {
	gs, err := w.store.Scopes(ctx)
	if err != nil {
		return nil, wrap(CodeListGroupsError, "Failed to list groups", err)
	}
	if gs == nil {
		gs = []string{}
	}
	return &GroupsResult{Groups: slices.Compact(gs)}, nil
}

// --- triggers ---

// RegisterTrigger binds a state trigger (a duplicate id replaces the
// binding, as upstream's).
func (w *Worker) RegisterTrigger(_ context.Context, t client.TriggerRegistration) error {
	var cfg triggerConfig
	raw := bytes.TrimSpace(t.Config)
	if len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		if raw[0] != '{' || json.Unmarshal(raw, &cfg) != nil {
			return &protocol.ErrorBody{Code: CodeInvalidInput, Message: "Failed to parse trigger config: state trigger " + t.ID + " needs an object with the optional strings scope, key and condition_function_id"}
		}
	}
	w.tmu.Lock()
	w.triggers[t.ID] = boundTrigger{id: t.ID, functionID: t.FunctionID, namespace: t.Namespace, metadata: t.Metadata, cfg: cfg}
	w.tmu.Unlock()
	return nil
}

// UnregisterTrigger drops a binding.
func (w *Worker) UnregisterTrigger(_ context.Context, t client.TriggerRegistration) error {
	w.tmu.Lock()
	delete(w.triggers, t.ID)
	w.tmu.Unlock()
	return nil
}

var _ client.TriggerHandler = (*Worker)(nil)

// fire queues the change event for the triggers it concerns: after the
// write, never waiting for them (a failing trigger never undoes a write).
func (w *Worker) fire(et, scope, key string, old, new json.RawMessage) {
	if w.invoker == nil || !w.triggersOn.Load() {
		return
	}
	w.tmu.RLock()
	var bs []boundTrigger
	for _, b := range w.triggers {
		if b.cfg.matches(scope, key) {
			bs = append(bs, b)
		}
	}
	w.tmu.RUnlock()
	if len(bs) == 0 {
		return
	}
	slices.SortFunc(bs, func(a, b boundTrigger) int { return strings.Compare(a.id, b.id) })
	w.events.Push(stateEvent{Type: "state", EventType: et, Scope: scope, Key: key, OldValue: old, NewValue: new, bindings: bs})
}

// deliver runs one event's triggers one after the other, in the order the
// writes happened: a condition answering false skips its trigger, a
// failing condition skips it too (logged), anything else runs it.
func (w *Worker) deliver(ev stateEvent) {
	payload, err := json.Marshal(ev)
	if err != nil {
		w.log.Error("encode a state event", "error", err)
		return
	}
	for _, b := range ev.bindings {
		if w.ctx.Err() != nil {
			return
		}
		if b.cfg.ConditionFunctionID != nil && *b.cfg.ConditionFunctionID != "" {
			ctx, cancel := context.WithTimeout(w.ctx, callTimeout)
			out, err := w.invoker.Invoke(ctx, b.namespace, *b.cfg.ConditionFunctionID, payload, nil)
			cancel()
			if err != nil {
				w.log.Warn("state trigger condition failed; trigger skipped", "trigger_id", b.id, "condition_function_id", *b.cfg.ConditionFunctionID, "error", err)
				continue
			}
			if bytes.Equal(bytes.TrimSpace(out), []byte("false")) {
				continue
			}
		}
		ctx, cancel := context.WithTimeout(w.ctx, callTimeout)
		_, err := w.invoker.Invoke(ctx, b.namespace, b.functionID, payload, b.metadata)
		cancel()
		if err != nil && w.ctx.Err() == nil {
			w.log.Warn("state trigger function failed", "trigger_id", b.id, "function_id", b.functionID, "error", err)
		}
	}
}

// String names the store for logs.
func (s StoreSpec) String() string {
	if s.Adapter == "redis" {
		return "redis " + redactURL(s.RedisURL)
	}
	if s.Persist {
		return fmt.Sprintf("kv file_based %s (saved every %s)", s.Dir, s.SaveInterval)
	}
	return "kv in_memory"
}
