package stream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"hash/fnv"
	"sort"
	"sync"

	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/protocol"
)

// triggerConfig is a stream trigger's config (stream_name is required),
// or a join/leave trigger's (every field optional).
type triggerConfig struct {
	StreamName          *string `json:"stream_name"`
	GroupID             *string `json:"group_id"`
	ItemID              *string `json:"item_id"`
	ConditionFunctionID *string `json:"condition_function_id"`
}

type boundTrigger struct {
	b   engine.TriggerBinding
	cfg triggerConfig
}

// triggerSet is the worker's engine.TriggerProvider: the bindings of its
// three trigger types.
type triggerSet struct {
	mu     sync.RWMutex
	byType map[string]map[string]boundTrigger
}

var _ engine.TriggerProvider = (*triggerSet)(nil)

func (t *triggerSet) init() {
	t.byType = map[string]map[string]boundTrigger{TriggerStream: {}, TriggerJoin: {}, TriggerLeave: {}}
}

func nonEmpty(p *string) bool { return p != nil && *p != "" }

// RegisterTrigger accepts a binding whose config is an object (or absent)
// with string fields; a stream trigger needs stream_name.
func (t *triggerSet) RegisterTrigger(b engine.TriggerBinding) error {
	var cfg triggerConfig
	raw := bytes.TrimSpace(b.Config)
	if len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		if raw[0] != '{' || json.Unmarshal(raw, &cfg) != nil {
			return &protocol.ErrorBody{Code: CodeInvalidInput, Message: b.TriggerType + " trigger " + b.ID + ": config must be an object with string fields stream_name, group_id, item_id and condition_function_id"}
		}
	}
	if b.TriggerType == TriggerStream && !nonEmpty(cfg.StreamName) {
		return &protocol.ErrorBody{Code: CodeInvalidInput, Message: "stream trigger " + b.ID + ": config.stream_name is required (the stream whose changes call " + b.FunctionID + ")"}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.byType[b.TriggerType]
	if m == nil {
		return &protocol.ErrorBody{Code: CodeInvalidInput, Message: "unknown trigger type " + b.TriggerType}
	}
	m[b.ID] = boundTrigger{b: b, cfg: cfg}
	return nil
}

// UnregisterTrigger drops a binding.
func (t *triggerSet) UnregisterTrigger(b engine.TriggerBinding) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.byType[b.TriggerType], b.ID)
}

// matching lists, sorted by id, the bindings of typ that ev concerns.
func (t *triggerSet) matching(typ, streamName, groupID string, itemID *string) []boundTrigger {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []boundTrigger
	for _, bt := range t.byType[typ] {
		c := bt.cfg
		if nonEmpty(c.StreamName) && *c.StreamName != streamName {
			continue
		}
		if typ == TriggerStream {
			if nonEmpty(c.GroupID) && *c.GroupID != groupID {
				continue
			}
			if nonEmpty(c.ItemID) && (itemID == nil || *c.ItemID != *itemID) {
				continue
			}
		}
		out = append(out, bt)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].b.ID < out[j].b.ID })
	return out
}

type dispatchJob struct {
	triggers []boundTrigger
	payload  json.RawMessage
}

// fireStream queues ev for the stream triggers it concerns. It never
// waits: a dispatcher that is triggerQueue/dispatchers events behind drops
// its oldest waiting event (logged).
func (w *Worker) fireStream(ev *Event) {
	ts := w.trig.matching(TriggerStream, ev.StreamName, ev.GroupID, ev.ID)
	if len(ts) == 0 {
		return
	}
	payload, err := json.Marshal(ev)
	if err != nil {
		return
	}
	// The events of one stream always go to the same dispatcher, so its
	// triggers see them in order.
	h := fnv.New32a()
	h.Write([]byte(ev.StreamName))
	w.queues[h.Sum32()%uint32(len(w.queues))].Push(dispatchJob{triggers: ts, payload: payload})
}

// runJob runs one event's triggers in order.
func (w *Worker) runJob(job dispatchJob) {
	for _, bt := range job.triggers {
		w.runTrigger(bt, job.payload)
	}
}

func (w *Worker) logDropped(n int) {
	w.log.Warn("stream triggers too slow: change events dropped", "dropped", n)
}

// stopDispatch ends the dispatchers (w.wg counts them): waiting events are
// discarded, calls in flight end with w.ctx.
func (w *Worker) stopDispatch() {
	for _, q := range w.queues {
		q.Stop()
	}
}

// runTrigger calls one stream trigger's function, after its condition
// function when it has one (a condition answering false skips it; any other
// answer runs it, as upstream).
func (w *Worker) runTrigger(bt boundTrigger, payload json.RawMessage) {
	ctx, cancel := context.WithTimeout(w.ctx, callTimeout)
	defer cancel()
	cond := ""
	if nonEmpty(bt.cfg.ConditionFunctionID) {
		cond = *bt.cfg.ConditionFunctionID
	}
	var condErr *engine.ConditionError
	switch err := w.eng.Fire(ctx, bt.b, cond, payload); {
	case errors.As(err, &condErr):
		w.log.Warn("stream trigger condition failed", "trigger", bt.b.ID, "condition_function_id", condErr.FunctionID, "error", condErr.Err)
	case err != nil:
		w.log.Warn("stream trigger failed", "trigger", bt.b.ID, "function_id", bt.b.FunctionID, "error", err)
	}
}

// joinLeave calls the join or leave triggers in order and reports whether
// one of the join triggers answered {unauthorized: true}.
func (w *Worker) joinLeave(ctx context.Context, typ string, ev JoinLeave) (unauthorized bool) {
	ts := w.trig.matching(typ, ev.StreamName, ev.GroupID, ev.ID)
	if len(ts) == 0 {
		return false
	}
	if ev.Context == nil {
		ev.Context = json.RawMessage("null")
	}
	payload, err := json.Marshal(ev)
	if err != nil {
		return false
	}
	for _, bt := range ts {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		// As the worker that registered the trigger: a join trigger decides
		// who may read, and must not run with the engine's rights.
		res, err := w.eng.InvokeAs(cctx, bt.b.Caller(), bt.b.Namespace, bt.b.FunctionID, payload, bt.b.Metadata)
		cancel()
		if err != nil {
			w.log.Warn(typ+" trigger failed", "trigger", bt.b.ID, "function_id", bt.b.FunctionID, "error", err)
			continue
		}
		if typ == TriggerJoin {
			var r struct {
				Unauthorized bool `json:"unauthorized"`
			}
			if json.Unmarshal(res, &r) == nil && r.Unauthorized {
				unauthorized = true
			}
		}
	}
	return unauthorized
}
