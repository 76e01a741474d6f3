package state

import (
	"context"
	"encoding/json"

	"github.com/iii-sandbox/iii/client"
)

// Function ids (upstream's).
const (
	FnSet         = "state::set"
	FnGet         = "state::get"
	FnDelete      = "state::delete"
	FnUpdate      = "state::update"
	FnList        = "state::list"
	FnListKeys    = "state::list_keys"
	FnListGroups  = "state::list_groups"
	FnListEntries = "state::list_entries"
)

const (
	schemaScopeKey = `{"type":"object","required":["scope","key"],"properties":{"scope":{"type":"string"},"key":{"type":"string"}}}`
	schemaScope    = `{"type":"object","required":["scope"],"properties":{"scope":{"type":"string"}}}`
	schemaAny      = `{"type":["string","number","boolean","object","array","null"]}`
)

type fn struct {
	id, desc, req, resp string
	h                   func(context.Context, json.RawMessage) (any, error)
}

func (w *Worker) functions() []fn {
	return []fn{
		{FnSet, "Set a value in state", `{"type":"object","required":["scope","key"],"properties":{"scope":{"type":"string"},"key":{"type":"string"},"value":{},"data":{}}}`,
			`{"type":"object","properties":{"old_value":{},"new_value":{}}}`,
			func(ctx context.Context, raw json.RawMessage) (any, error) { return w.Set(ctx, raw) }},
		{FnGet, "Get a value from state", schemaScopeKey, schemaAny,
			func(ctx context.Context, raw json.RawMessage) (any, error) { return w.Get(ctx, raw) }},
		{FnDelete, "Delete a value from state", schemaScopeKey, schemaAny,
			func(ctx context.Context, raw json.RawMessage) (any, error) { return w.Delete(ctx, raw) }},
		{FnUpdate, "Update a value in state", `{"type":"object","required":["scope","key","ops"],"properties":{"scope":{"type":"string"},"key":{"type":"string"},"ops":{"type":"array","maxItems":256,"items":{"type":"object","required":["type"],"properties":{"type":{"enum":["set","merge","increment","decrement","append","remove"]}}}}}}`,
			`{"type":"object","properties":{"old_value":{},"new_value":{},"errors":{"type":"array"}}}`,
			func(ctx context.Context, raw json.RawMessage) (any, error) { return w.Update(ctx, raw) }},
		{FnList, "Get a group from state", schemaScope, `{"type":"array"}`,
			func(ctx context.Context, raw json.RawMessage) (any, error) { return w.List(ctx, raw) }},
		{FnListKeys, "List the keys stored in a scope", schemaScope, `{"type":"object","properties":{"keys":{"type":"array","items":{"type":"string"}}}}`,
			func(ctx context.Context, raw json.RawMessage) (any, error) { return w.ListKeys(ctx, raw) }},
		{FnListGroups, "List all state groups", `{"type":"object"}`, `{"type":"object","properties":{"groups":{"type":"array","items":{"type":"string"}}}}`,
			func(ctx context.Context, raw json.RawMessage) (any, error) { return w.ListGroups(ctx, raw) }},
		{FnListEntries, "Page through a snapshot of a scope's entries", `{"type":"object","required":["scope"],"properties":{"scope":{"type":"string","maxLength":1024},"cursor":{"type":"string"},"limit":{"type":"integer","minimum":1,"maximum":1000},"max_bytes":{"type":"integer","minimum":256,"maximum":8000000}}}`,
			`{"type":"object","properties":{"entries":{"type":"array"},"next_cursor":{"type":["string","null"]},"done":{"type":"boolean"},"offset":{"type":"integer"},"total":{"type":"integer"}}}`,
			func(ctx context.Context, raw json.RawMessage) (any, error) { return w.ListEntries(ctx, raw) }},
	}
}

// Register serves the functions and the `state` trigger type on c. The
// trigger type is registered first, as the SDKs do, so a trigger bound
// to it as soon as the functions appear is not parked.
func (w *Worker) Register(c *client.Client) error {
	if _, err := c.RegisterTriggerType(client.TriggerTypeDef{
		ID:                   TriggerType,
		Description:          "State change events: {type: \"state\", event_type, scope, key, old_value, new_value}",
		TriggerRequestSchema: json.RawMessage(`{"type":"object","properties":{"scope":{"type":"string"},"key":{"type":"string"},"condition_function_id":{"type":"string"}}}`),
		CallRequestSchema:    json.RawMessage(`{"type":"object","properties":{"type":{"const":"state"},"event_type":{"enum":["state:created","state:updated","state:deleted"]},"scope":{"type":"string"},"key":{"type":"string"},"old_value":{},"new_value":{}}}`),
	}, w); err != nil {
		return err
	}
	for _, f := range w.functions() {
		h := f.h
		if _, err := c.RegisterFunction(client.FunctionDef{ID: f.id, Description: f.desc,
			RequestSchema: json.RawMessage(f.req), ResponseSchema: json.RawMessage(f.resp)},
			func(ctx context.Context, inv *client.Invocation) (any, error) { return h(ctx, inv.Data) }); err != nil {
			return err
		}
	}
	return nil
}
