package stream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/protocol"
)

type function struct {
	def     engine.FunctionDef
	handler engine.Handler
}

func (w *Worker) functions() []function {
	fns := w.dataFunctions()
	for i := range fns {
		fns[i].handler = w.granted(fns[i].def.ID, fns[i].handler)
	}
	return fns
}

// granted refuses callers whose credential does not grant stream data
// (engine.StreamDataDenied; docs/security.md, "Who sees what").
func (w *Worker) granted(id string, h engine.Handler) engine.Handler {
	return func(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
		if errb := w.eng.StreamDataDenied(call, id); errb != nil {
			return nil, errb
		}
		return h(ctx, call)
	}
}

func (w *Worker) dataFunctions() []function {
	return []function{
		{engine.FunctionDef{ID: "stream::set", Description: "Set a value in a stream"}, w.set},
		{engine.FunctionDef{ID: "stream::get", Description: "Get a value from a stream"}, w.get},
		{engine.FunctionDef{ID: "stream::delete", Description: "Delete a value from a stream"}, w.delete},
		{engine.FunctionDef{ID: "stream::list", Description: "List all items in a stream group"}, w.list},
		{engine.FunctionDef{ID: "stream::list_groups", Description: "List all groups in a stream"}, w.listGroups},
		{engine.FunctionDef{ID: "stream::list_all", Description: "List all available streams with metadata"}, w.listAll},
		{engine.FunctionDef{ID: "stream::send", Description: "Send a custom event to stream subscribers"}, w.send},
		{engine.FunctionDef{ID: "stream::update", Description: "Atomically update a stream value with multiple operations"}, w.update},
	}
}

// input is every field a stream::* request may carry.
type input struct {
	StreamName *string         `json:"stream_name"`
	GroupID    *string         `json:"group_id"`
	ItemID     *string         `json:"item_id"`
	Data       json.RawMessage `json:"data"`
	Type       *string         `json:"type"`
	ID         *string         `json:"id"`
	Ops        json.RawMessage `json:"ops"`
}

// decode reads a request, requiring the fields named in need.
func decode(fn string, data json.RawMessage, need ...string) (*input, error) {
	in := &input{}
	raw := bytes.TrimSpace(data)
	if len(raw) == 0 || raw[0] != '{' {
		return nil, errorf(CodeInvalidInput, "%s takes an object", fn)
	}
	if err := json.Unmarshal(raw, in); err != nil {
		return nil, errorf(CodeInvalidInput, "%s: %v", fn, err)
	}
	for _, f := range need {
		missing := false
		switch f {
		case "stream_name":
			missing = in.StreamName == nil
		case "group_id":
			missing = in.GroupID == nil
		case "item_id":
			missing = in.ItemID == nil
		case "data":
			missing = in.Data == nil
		case "type":
			missing = in.Type == nil
		case "ops":
			missing = in.Ops == nil
		}
		if missing {
			return nil, errorf(CodeInvalidInput, "%s needs %s", fn, f)
		}
	}
	return in, nil
}

// custom calls a custom stream::<op>(<stream>) function when one is
// registered in the default namespace (the SDK's createStream registers
// them); ok is false when there is none. It runs as the caller of the
// stream:: function (as), never with the engine's rights for it: any
// worker may register a custom stream's functions.
func (w *Worker) custom(ctx context.Context, as engine.Caller, op, streamName string, data json.RawMessage) (res json.RawMessage, ok bool, err error) {
	id := "stream::" + op + "(" + streamName + ")"
	if !w.eng.HasFunction(engine.DefaultNamespace, id) {
		return nil, false, nil
	}
	res, err = w.eng.InvokeAs(ctx, as, engine.DefaultNamespace, id, data, nil)
	if err != nil {
		var eb *protocol.ErrorBody
		if errors.As(err, &eb) {
			return nil, true, err
		}
		return nil, true, errorf(CodeCustomFailed, "%s failed: %v", id, err)
	}
	return res, true, nil
}

type changeResult struct {
	OldValue json.RawMessage `json:"old_value"`
	NewValue json.RawMessage `json:"new_value"`
}

// emit tells this engine's stream triggers about a change, and the
// backend's subscribers: with Redis those of every engine on it, this
// engine's included (they get it back from the subscription, once). A
// change that cannot be published is logged; the write stands (upstream's
// rule).
func (w *Worker) emit(ctx context.Context, streamName, groupID string, id *string, inner json.RawMessage) {
	ev := &Event{Type: "stream", Timestamp: time.Now().UnixMilli(), StreamName: streamName, GroupID: groupID, ID: id, Event: inner}
	w.fireStream(ev)
	if err := w.store.Publish(ctx, ev); err != nil {
		w.log.Warn("stream change not delivered to the subscribers", "stream", streamName, "group", groupID, "error", err)
	}
}

func changeKind(old json.RawMessage) string {
	if old == nil {
		return "create"
	}
	return "update"
}

func (w *Worker) set(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
	in, err := decode("stream::set", call.Data, "stream_name", "group_id", "item_id", "data")
	if err != nil {
		return nil, err
	}
	var r changeResult
	res, isCustom, err := w.custom(ctx, call.Caller, "set", *in.StreamName, call.Data)
	switch {
	case err != nil:
		return nil, err
	case isCustom:
		if json.Unmarshal(res, &r) != nil || r.NewValue == nil {
			return nil, errorf(CodeCustomFailed, "stream::set(%s) answered %s, not {old_value, new_value}", *in.StreamName, truncate(res))
		}
		if bytes.Equal(bytes.TrimSpace(r.OldValue), []byte("null")) {
			r.OldValue = nil
		}
	default:
		old, stored, err := w.store.Set(ctx, *in.StreamName, *in.GroupID, *in.ItemID, in.Data)
		if err != nil {
			return nil, err
		}
		r = changeResult{OldValue: old, NewValue: stored}
	}
	item := *in.ItemID
	w.emit(ctx, *in.StreamName, *in.GroupID, &item, dataEvent(changeKind(r.OldValue), r.NewValue))
	r.OldValue = orNull(r.OldValue)
	return json.Marshal(r)
}

func (w *Worker) get(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
	in, err := decode("stream::get", call.Data, "stream_name", "group_id", "item_id")
	if err != nil {
		return nil, err
	}
	return w.getItem(ctx, call.Caller, *in.StreamName, *in.GroupID, *in.ItemID)
}

// getItem is stream::get: the value, or null.
func (w *Worker) getItem(ctx context.Context, as engine.Caller, streamName, groupID, itemID string) (json.RawMessage, error) {
	req, _ := json.Marshal(map[string]string{"stream_name": streamName, "group_id": groupID, "item_id": itemID})
	if res, isCustom, err := w.custom(ctx, as, "get", streamName, req); err != nil || isCustom {
		return orNull(res), err
	}
	v, err := w.store.Get(ctx, streamName, groupID, itemID)
	return orNull(v), err
}

func (w *Worker) delete(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
	in, err := decode("stream::delete", call.Data, "stream_name", "group_id", "item_id")
	if err != nil {
		return nil, err
	}
	var old json.RawMessage
	res, isCustom, err := w.custom(ctx, call.Caller, "delete", *in.StreamName, call.Data)
	switch {
	case err != nil:
		return nil, err
	case isCustom:
		var r struct {
			OldValue json.RawMessage `json:"old_value"`
		}
		if json.Unmarshal(res, &r) != nil {
			return nil, errorf(CodeCustomFailed, "stream::delete(%s) answered %s, not {old_value}", *in.StreamName, truncate(res))
		}
		if !bytes.Equal(bytes.TrimSpace(r.OldValue), []byte("null")) {
			old = r.OldValue
		}
	default:
		if old, err = w.store.Delete(ctx, *in.StreamName, *in.GroupID, *in.ItemID); err != nil {
			return nil, err
		}
	}
	if old != nil {
		item := *in.ItemID
		w.emit(ctx, *in.StreamName, *in.GroupID, &item, dataEvent("delete", old))
	}
	return json.Marshal(struct {
		OldValue json.RawMessage `json:"old_value"`
	}{orNull(old)})
}

func (w *Worker) list(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
	in, err := decode("stream::list", call.Data, "stream_name", "group_id")
	if err != nil {
		return nil, err
	}
	return w.listGroup(ctx, call.Caller, *in.StreamName, *in.GroupID)
}

// listGroup is stream::list: the group's values in insertion order.
func (w *Worker) listGroup(ctx context.Context, as engine.Caller, streamName, groupID string) (json.RawMessage, error) {
	req, _ := json.Marshal(map[string]string{"stream_name": streamName, "group_id": groupID})
	if res, isCustom, err := w.custom(ctx, as, "list", streamName, req); err != nil || isCustom {
		return orNull(res), err
	}
	vs, err := w.store.List(ctx, streamName, groupID)
	if err != nil {
		return nil, err
	}
	return json.Marshal(vs)
}

func (w *Worker) listGroups(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
	in, err := decode("stream::list_groups", call.Data, "stream_name")
	if err != nil {
		return nil, err
	}
	if res, isCustom, err := w.custom(ctx, call.Caller, "list_groups", *in.StreamName, call.Data); err != nil || isCustom {
		return orNull(res), err
	}
	gs, err := w.store.Groups(ctx, *in.StreamName)
	if err != nil {
		return nil, err
	}
	return json.Marshal(gs)
}

func (w *Worker) listAll(ctx context.Context, _ *engine.Call) (json.RawMessage, error) {
	all, err := w.store.All(ctx)
	if err != nil {
		return nil, err
	}
	return json.Marshal(struct {
		Stream []Meta `json:"stream"`
		Count  int    `json:"count"`
	}{all, len(all)})
}

func (w *Worker) send(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
	in, err := decode("stream::send", call.Data, "stream_name", "group_id", "type", "data")
	if err != nil {
		return nil, err
	}
	if err := w.limits.checkGroup(*in.StreamName, *in.GroupID); err != nil {
		return nil, err
	}
	if in.ID != nil {
		if err := w.limits.checkID("id", *in.ID); err != nil {
			return nil, err
		}
	}
	if err := w.limits.checkID("type", *in.Type); err != nil {
		return nil, err
	}
	data, err := w.limits.compactValue(in.Data)
	if err != nil {
		return nil, err
	}
	w.emit(ctx, *in.StreamName, *in.GroupID, in.ID, customEvent(*in.Type, data))
	return json.RawMessage("null"), nil
}

func (w *Worker) update(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
	in, err := decode("stream::update", call.Data, "stream_name", "group_id", "item_id", "ops")
	if err != nil {
		return nil, err
	}
	type updateResult struct {
		OldValue json.RawMessage `json:"old_value"`
		NewValue json.RawMessage `json:"new_value"`
		Errors   []OpError       `json:"errors,omitempty"`
	}
	var r updateResult
	res, isCustom, err := w.custom(ctx, call.Caller, "update", *in.StreamName, call.Data)
	switch {
	case err != nil:
		return nil, err
	case isCustom:
		if json.Unmarshal(res, &r) != nil || r.NewValue == nil {
			return nil, errorf(CodeCustomFailed, "stream::update(%s) answered %s, not {old_value, new_value}", *in.StreamName, truncate(res))
		}
		if bytes.Equal(bytes.TrimSpace(r.OldValue), []byte("null")) {
			r.OldValue = nil
		}
	default:
		ops, err := decodeOps(in.Ops)
		if err != nil {
			return nil, err
		}
		old, updated, errs, err := w.store.Update(ctx, *in.StreamName, *in.GroupID, *in.ItemID, ops)
		if err != nil {
			return nil, err
		}
		r = updateResult{OldValue: old, NewValue: updated, Errors: errs}
	}
	item := *in.ItemID
	w.emit(ctx, *in.StreamName, *in.GroupID, &item, dataEvent(changeKind(r.OldValue), r.NewValue))
	r.OldValue = orNull(r.OldValue)
	return json.Marshal(r)
}

func truncate(b []byte) string {
	const max = 200
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}
