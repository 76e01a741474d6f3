package stream

import (
	"bytes"
	"context"
	"encoding/json"
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

// fireStream queues ev for the stream triggers it concerns. A full queue
// makes the caller wait (until ctx ends: the event's triggers are then
// skipped and logged).
func (w *Worker) fireStream(ctx context.Context, ev *Event) {
	ts := w.trig.matching(TriggerStream, ev.StreamName, ev.GroupID, ev.ID)
	if len(ts) == 0 {
		return
	}
	payload, err := json.Marshal(ev)
	if err != nil {
		return
	}
	h := fnv.New32a()
	h.Write([]byte(ev.StreamName))
	q := w.queues[h.Sum32()%uint32(len(w.queues))]
	select {
	case q <- dispatchJob{triggers: ts, payload: payload}:
	case <-ctx.Done():
		w.log.Warn("stream triggers skipped: the caller left while the trigger queue was full", "stream", ev.StreamName, "group", ev.GroupID)
	case <-w.ctx.Done():
	}
}

// dispatchLoop runs the jobs of one queue in order: the events of one
// stream always go to the same queue, so its triggers see them in order.
func (w *Worker) dispatchLoop(queue chan dispatchJob) {
	defer w.wg.Done()
	for {
		select {
		case <-w.ctx.Done():
			return
		case job := <-queue:
			for _, bt := range job.triggers {
				w.runTrigger(bt, job.payload)
			}
		}
	}
}

// runTrigger calls one stream trigger's function, after its condition
// function when it has one (a condition answering false skips it; any other
// answer runs it, as upstream).
func (w *Worker) runTrigger(bt boundTrigger, payload json.RawMessage) {
	ctx, cancel := context.WithTimeout(w.ctx, callTimeout)
	defer cancel()
	if nonEmpty(bt.cfg.ConditionFunctionID) {
		res, err := w.eng.Invoke(ctx, bt.b.Namespace, *bt.cfg.ConditionFunctionID, payload)
		if err != nil {
			w.log.Warn("stream trigger condition failed", "trigger", bt.b.ID, "condition_function_id", *bt.cfg.ConditionFunctionID, "error", err)
			return
		}
		if bytes.Equal(bytes.TrimSpace(res), []byte("false")) {
			return
		}
	}
	if _, err := w.eng.InvokeWithMetadata(ctx, bt.b.Namespace, bt.b.FunctionID, payload, bt.b.Metadata); err != nil {
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
		res, err := w.eng.InvokeWithMetadata(cctx, bt.b.Namespace, bt.b.FunctionID, payload, bt.b.Metadata)
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
