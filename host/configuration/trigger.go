package configuration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/protocol"
)

// TriggerType is the trigger type the worker provides in the default
// namespace: a binding's function is called with every change to the
// entries its config selects.
const TriggerType = "configuration"

// triggerCallTimeout bounds one call of a trigger's function (and of its
// condition function).
const triggerCallTimeout = 60 * time.Second

var eventTypes = []string{EventRegistered, EventUpdated, EventDeleted}

// triggerConfig is a configuration trigger's config; every field is
// optional.
type triggerConfig struct {
	ConfigurationID     string    `json:"configuration_id"`
	EventTypes          *[]string `json:"event_types"`
	ConditionFunctionID string    `json:"condition_function_id"`
}

// triggerPayload is what a trigger's function receives (upstream's
// ConfigurationEventData).
type triggerPayload struct {
	Type        string          `json:"type"`
	EventType   string          `json:"event_type"`
	ID          string          `json:"id"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Schema      json.RawMessage `json:"schema"`
	OldValue    json.RawMessage `json:"old_value"`
	NewValue    json.RawMessage `json:"new_value"`
	Metadata    json.RawMessage `json:"metadata,omitempty"`
}

// triggers is the worker's engine.TriggerProvider: one sink per binding,
// so a slow trigger function holds up only its own binding's events.
type triggers struct {
	w *Worker

	mu        sync.Mutex
	eng       *engine.Engine
	ctx       context.Context // ends when the worker leaves the engine
	cancelCtx context.CancelFunc
	// bound holds the sink of each binding id.
	bound map[string]*boundTrigger
	// perID counts the bindings that name each configuration_id, and
	// expiry holds the TTL countdown of an id none names any more.
	perID  map[string]int
	expiry map[string]*countdown
	ttl    time.Duration
}

// countdown is one entry's TTL timer.
type countdown struct{ timer *time.Timer }

type boundTrigger struct {
	b    engine.TriggerBinding
	cfg  triggerConfig
	sink *sink
}

var _ engine.TriggerProvider = (*triggers)(nil)

func invalidTrigger(b engine.TriggerBinding, format string, args ...any) error {
	return errf(CodeInvalidRequest, "configuration trigger "+b.ID+": "+format, args...)
}

func parseTriggerConfig(b engine.TriggerBinding) (triggerConfig, error) {
	var cfg triggerConfig
	raw := bytes.TrimSpace(b.Config)
	if len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		if raw[0] != '{' || json.Unmarshal(raw, &cfg) != nil {
			return cfg, invalidTrigger(b, "config must be an object with the optional fields configuration_id (string), event_types (array of %s) and condition_function_id (string)", strings.Join(eventTypes, ", "))
		}
	}
	if cfg.ConfigurationID != "" && !validID(cfg.ConfigurationID) {
		return cfg, invalidTrigger(b, "configuration_id %q is not a valid configuration id (1 to 64 characters from a-z, 0-9, _ and -)", cfg.ConfigurationID)
	}
	if cfg.EventTypes != nil {
		if len(*cfg.EventTypes) == 0 {
			return cfg, invalidTrigger(b, "event_types is empty: omit it to receive every event type, or name some of %s", strings.Join(eventTypes, ", "))
		}
		for _, t := range *cfg.EventTypes {
			if !slices.Contains(eventTypes, t) {
				return cfg, invalidTrigger(b, "unknown event type %q in event_types: use %s", t, strings.Join(eventTypes, ", "))
			}
		}
	}
	return cfg, nil
}

func (c triggerConfig) matches(ev rawEvent) bool {
	if c.ConfigurationID != "" && c.ConfigurationID != ev.ID {
		return false
	}
	return c.EventTypes == nil || slices.Contains(*c.EventTypes, ev.EventType)
}

// RegisterTrigger accepts a binding and starts delivering the events its
// config selects from now on.
func (t *triggers) RegisterTrigger(b engine.TriggerBinding) error {
	cfg, err := parseTriggerConfig(b)
	if err != nil {
		return err
	}
	bt := &boundTrigger{b: b, cfg: cfg}
	bt.sink = &sink{
		match:   cfg.matches,
		deliver: func(ev rawEvent) { t.fire(bt, ev) },
		onDrop: func(n int) {
			t.w.log.Warn("configuration trigger too slow: events dropped", "trigger", b.ID, "function_id", b.FunctionID, "dropped", n)
		},
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.eng == nil {
		return &protocol.ErrorBody{Code: protocol.CodeInvocationStopped, Message: "configuration trigger " + b.ID + ": the configuration worker has stopped"}
	}
	if old := t.bound[b.ID]; old != nil {
		t.dropLocked(old)
	}
	if !t.w.events.add(bt.sink) {
		return &protocol.ErrorBody{Code: protocol.CodeInvocationStopped, Message: "configuration trigger " + b.ID + ": the configuration worker has stopped"}
	}
	t.bound[b.ID] = bt
	if id := cfg.ConfigurationID; id != "" {
		t.perID[id]++
		if cd := t.expiry[id]; cd != nil {
			cd.timer.Stop()
			delete(t.expiry, id)
			t.w.log.Debug("configuration TTL countdown cancelled: a trigger subscribed again", "id", id)
		}
	}
	t.w.log.Debug("configuration trigger registered", "trigger", b.ID, "function_id", b.FunctionID, "configuration_id", cfg.ConfigurationID)
	return nil
}

// UnregisterTrigger stops a binding's deliveries (a call in flight ends on
// its own). When it was the last binding naming its configuration_id and
// ttl_seconds is set, the TTL countdown of that entry starts.
func (t *triggers) UnregisterTrigger(b engine.TriggerBinding) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if bt := t.bound[b.ID]; bt != nil {
		t.dropLocked(bt)
	}
}

func (t *triggers) dropLocked(bt *boundTrigger) {
	delete(t.bound, bt.b.ID)
	t.w.events.remove(bt.sink)
	id := bt.cfg.ConfigurationID
	if id == "" {
		return
	}
	if t.perID[id]--; t.perID[id] > 0 {
		return
	}
	delete(t.perID, id)
	if t.ttl > 0 && t.eng != nil && t.expiry[id] == nil {
		cd := &countdown{}
		cd.timer = time.AfterFunc(t.ttl, func() { t.expire(id, cd) })
		t.expiry[id] = cd
		t.w.log.Debug("configuration TTL countdown started: no trigger subscribes to it", "id", id, "ttl", t.ttl)
	}
}

// expire deletes id when its countdown cd ran out with no trigger naming
// it again.
func (t *triggers) expire(id string, cd *countdown) {
	t.mu.Lock()
	if t.expiry[id] != cd || t.perID[id] > 0 {
		t.mu.Unlock()
		return
	}
	delete(t.expiry, id)
	t.mu.Unlock()
	if err := t.w.expire(context.Background(), id); err != nil {
		t.w.log.Error("configuration TTL expiry failed", "id", id, "error", err)
	}
}

// fire calls a binding's function with ev, after its condition function
// when it has one: an answer of false skips it, any other answer runs it,
// and a failing condition skips it (logged), as upstream. Values are
// expanded only for a registrant holding the engine token, as
// configuration::get expands them only for such a caller.
func (t *triggers) fire(bt *boundTrigger, raw rawEvent) {
	t.mu.Lock()
	eng, base := t.eng, t.ctx
	t.mu.Unlock()
	if eng == nil {
		return
	}
	ev := Event(raw)
	if bt.b.RegistrantAdmin {
		ev = t.w.expanded(raw)
	}
	payload, err := json.Marshal(triggerPayload{
		Type: TriggerType, EventType: ev.EventType, ID: ev.ID, Name: ev.Name, Description: ev.Description,
		Schema: ev.Schema, OldValue: ev.OldValue, NewValue: ev.NewValue, Metadata: ev.Metadata,
	})
	if err != nil {
		t.w.log.Error("configuration trigger: encode the event", "trigger", bt.b.ID, "error", err)
		return
	}
	ctx, cancel := context.WithTimeout(base, triggerCallTimeout)
	defer cancel()
	var condErr *engine.ConditionError
	switch err := eng.Fire(ctx, bt.b, bt.cfg.ConditionFunctionID, payload); {
	case errors.As(err, &condErr):
		t.w.log.Warn("configuration trigger condition failed; skipping the trigger", "trigger", bt.b.ID, "condition_function_id", condErr.FunctionID, "id", ev.ID, "error", condErr.Err)
	case err != nil:
		t.w.log.Warn("configuration trigger failed", "trigger", bt.b.ID, "function_id", bt.b.FunctionID, "id", ev.ID, "event_type", ev.EventType, "error", err)
	}
}

// start readies the provider for eng.
func (t *triggers) start(w *Worker, eng *engine.Engine) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.w, t.eng = w, eng
	t.ctx, t.cancelCtx = context.WithCancel(context.Background())
	t.bound = map[string]*boundTrigger{}
	t.perID = map[string]int{}
	t.expiry = map[string]*countdown{}
}

// stop ends every binding's deliveries, cancels the calls in flight and
// every TTL countdown.
func (t *triggers) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.eng == nil {
		return
	}
	for _, bt := range t.bound {
		t.w.events.remove(bt.sink)
	}
	for _, cd := range t.expiry {
		cd.timer.Stop()
	}
	t.cancelCtx()
	t.eng, t.bound, t.perID, t.expiry = nil, nil, nil, nil
}

// SetTTL sets ttl_seconds: when positive, an entry that the last
// configuration trigger naming it (by configuration_id) left is deleted
// after ttl unless a trigger names it again first. 0 disables expiry;
// countdowns already running keep their duration.
func (w *Worker) SetTTL(ttl time.Duration) {
	w.trig.mu.Lock()
	defer w.trig.mu.Unlock()
	w.trig.ttl = ttl
}
