package configuration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/iii-sandbox/iii/host/engine"
)

// Function ids served in the default namespace.
const (
	FnRegister = "configuration::register"
	FnSet      = "configuration::set"
	FnGet      = "configuration::get"
	FnList     = "configuration::list"
	FnSchema   = "configuration::schema"
	FnEnsure   = "configuration::ensure"
)

// Function is one configuration::* function: its definition (with request
// and response schemas, shown by engine::functions::info) and its handler.
type Function struct {
	Def     engine.FunctionDef
	Handler engine.Handler
}

const idSchema = `{"type":"string","pattern":"^[a-z0-9_-]{1,64}$","description":"Entry id; also its file name."}`

const entrySchema = `{"type":"object","required":["id","name","description","schema","value"],"properties":{` +
	`"id":` + idSchema + `,"name":{"type":"string"},"description":{"type":"string"},` +
	`"schema":{"description":"The entry's JSON Schema."},"value":{"description":"The stored value (placeholders not expanded); null when none."},` +
	`"metadata":{}}}`

const summarySchema = `{"type":"object","required":["id","name","description","schema"],"properties":{` +
	`"id":` + idSchema + `,"name":{"type":"string"},"description":{"type":"string"},` +
	`"schema":{"description":"The entry's JSON Schema; null while its owner has not registered since the engine started."},"metadata":{}}}`

const registerRequestSchema = `{"type":"object","required":["id","schema"],"properties":{` +
	`"id":` + idSchema + `,"name":{"type":"string","description":"Human name; defaults to the id."},` +
	`"description":{"type":"string"},"schema":{"description":"JSON Schema the value must match (draft 2020-12 unless $schema says otherwise)."},` +
	`"initial_value":{"description":"Stored when given (register) or when nothing non-null is stored (ensure); validated first."},` +
	`"metadata":{}}}`

// Functions returns the six configuration::* functions bound to w.
// register, ensure and set change the configuration workers run with, so
// they are privileged: only a caller holding the engine token (the local
// user, Compose, in-process callers) may call them. get, list and schema
// stay open; get expands ${VAR} only for such a caller (docs/security.md).
func (w *Worker) Functions() []Function {
	return []Function{
		{
			Def: engine.FunctionDef{
				ID:             FnRegister,
				Privileged:     true,
				Description:    "Register or replace a configuration entry's schema, name, description and metadata; keeps the stored value unless initial_value is given.",
				RequestSchema:  json.RawMessage(registerRequestSchema),
				ResponseSchema: json.RawMessage(entrySchema),
			},
			Handler: w.handleRegister(false),
		},
		{
			Def: engine.FunctionDef{
				ID:             FnEnsure,
				Privileged:     true,
				Description:    "Register an entry and seed initial_value only when no non-null value is stored; never overwrites.",
				RequestSchema:  json.RawMessage(registerRequestSchema),
				ResponseSchema: json.RawMessage(entrySchema),
			},
			Handler: w.handleRegister(true),
		},
		{
			Def: engine.FunctionDef{
				ID:          FnSet,
				Privileged:  true,
				Description: "Validate a value against the entry's schema and store it.",
				RequestSchema: json.RawMessage(`{"type":"object","required":["id","value"],"properties":{"id":` + idSchema +
					`,"value":{"description":"The new value; ${VAR:default} placeholders are stored as written."}}}`),
				ResponseSchema: json.RawMessage(`{"type":"object","required":["old_value","new_value"],"properties":{"old_value":{},"new_value":{}}}`),
			},
			Handler: w.handleSet,
		},
		{
			Def: engine.FunctionDef{
				ID:          FnGet,
				Description: "Read an entry's value, with ${VAR} and ${VAR:default} expanded from the engine's environment unless raw is true. Only a caller holding the engine token gets the expansion; any other caller gets the stored value as written.",
				RequestSchema: json.RawMessage(`{"type":"object","required":["id"],"properties":{"id":` + idSchema +
					`,"raw":{"type":"boolean","default":false,"description":"Return the stored template without expanding placeholders."}}}`),
				ResponseSchema: json.RawMessage(`{"type":"object","required":["id","value"],"properties":{"id":` + idSchema + `,"value":{}}}`),
			},
			Handler: w.handleGet,
		},
		{
			Def: engine.FunctionDef{
				ID:             FnList,
				Description:    "List every entry (without values), sorted by id.",
				RequestSchema:  json.RawMessage(`{"type":"object"}`),
				ResponseSchema: json.RawMessage(`{"type":"object","required":["configurations"],"properties":{"configurations":{"type":"array","items":` + summarySchema + `}}}`),
			},
			Handler: w.handleList,
		},
		{
			Def: engine.FunctionDef{
				ID:             FnSchema,
				Description:    "Describe one entry: id, name, description, schema and metadata.",
				RequestSchema:  json.RawMessage(`{"type":"object","required":["id"],"properties":{"id":` + idSchema + `}}`),
				ResponseSchema: json.RawMessage(summarySchema),
			},
			Handler: w.handleSchema,
		},
	}
}

// decodeRequest reads a call's payload into v. Unknown fields are ignored:
// the engine adds _caller_worker_id, and newer callers may send more.
func decodeRequest(fn string, data json.RawMessage, v any) error {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return errf(CodeInvalidRequest, "%s takes a JSON object, for example {\"id\":\"http\"}", fn)
	}
	if err := json.Unmarshal(trimmed, v); err != nil {
		return errf(CodeInvalidRequest, "%s: %v", fn, err)
	}
	return nil
}

func respond(v any) (json.RawMessage, error) {
	out, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode response: %w", err)
	}
	return out, nil
}

func (w *Worker) handleRegister(ensure bool) engine.Handler {
	fn := FnRegister
	if ensure {
		fn = FnEnsure
	}
	return func(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
		var req RegisterRequest
		if err := decodeRequest(fn, call.Data, &req); err != nil {
			return nil, err
		}
		if req.ID == "" {
			return nil, errf(CodeInvalidID, "%s needs an id", fn)
		}
		e, err := w.register(ctx, req, ensure)
		if err != nil {
			return nil, err
		}
		return respond(e)
	}
}

func (w *Worker) handleSet(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
	var req struct {
		ID    string          `json:"id"`
		Value json.RawMessage `json:"value"`
	}
	if err := decodeRequest(FnSet, call.Data, &req); err != nil {
		return nil, err
	}
	if req.Value == nil {
		return nil, errf(CodeInvalidRequest, "%s needs a value (use null to clear it)", FnSet)
	}
	old, cur, err := w.Set(ctx, req.ID, req.Value)
	if err != nil {
		return nil, err
	}
	return respond(struct {
		Old json.RawMessage `json:"old_value"`
		New json.RawMessage `json:"new_value"`
	}{old, cur})
}

func (w *Worker) handleGet(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
	var req struct {
		ID  string `json:"id"`
		Raw bool   `json:"raw"`
	}
	if err := decodeRequest(FnGet, call.Data, &req); err != nil {
		return nil, err
	}
	// The engine's environment is the engine token holder's to see: any
	// other caller (a worker, a VM worker, another user) gets the stored
	// template, placeholders as written, as with raw.
	v, err := w.Get(ctx, req.ID, req.Raw || !call.CallerAdmin)
	if err != nil {
		return nil, err
	}
	return respond(struct {
		ID    string          `json:"id"`
		Value json.RawMessage `json:"value"`
	}{req.ID, v})
}

func (w *Worker) handleList(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
	// list takes no arguments; a missing or null payload is fine.
	if d := bytes.TrimSpace(call.Data); len(d) > 0 && !bytes.Equal(d, []byte("null")) {
		var ignored struct{}
		if err := decodeRequest(FnList, d, &ignored); err != nil {
			return nil, err
		}
	}
	return respond(struct {
		Configurations []Summary `json:"configurations"`
	}{w.List(ctx)})
}

func (w *Worker) handleSchema(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
	var req struct {
		ID string `json:"id"`
	}
	if err := decodeRequest(FnSchema, call.Data, &req); err != nil {
		return nil, err
	}
	s, err := w.Schema(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	return respond(s)
}

// attachment is the worker's presence in an engine.
type attachment struct {
	mu sync.Mutex
	lw *engine.LocalWorker
}

// Attach publishes the worker and its functions in eng's default
// namespace.
func (w *Worker) Attach(eng *engine.Engine) error {
	w.attached.mu.Lock()
	defer w.attached.mu.Unlock()
	if w.attached.lw != nil {
		return fmt.Errorf("configuration worker already attached")
	}
	lw, err := eng.AttachLocalWorker(engine.LocalWorkerSpec{
		Name:        w.name,
		Namespace:   engine.DefaultNamespace,
		Description: "Configuration entries with JSON Schemas, stored in " + w.StoreDescription(),
		Runtime:     "engine",
		Version:     w.exp.version,
		PID:         osPID(),
	})
	if err != nil {
		return fmt.Errorf("attach %s: %w", w.name, err)
	}
	for _, f := range w.Functions() {
		if err := lw.RegisterFunction(f.Def, f.Handler); err != nil {
			lw.Detach()
			return fmt.Errorf("register %s: %w", f.Def.ID, err)
		}
	}
	w.trig.start(w, eng)
	if err := lw.RegisterTriggerType(TriggerType, "Fires when a configuration entry is registered, updated or deleted (register, ensure, set, hand edits of its file, TTL expiry)", &w.trig); err != nil {
		lw.Detach()
		w.trig.stop()
		return fmt.Errorf("register trigger type %s: %w", TriggerType, err)
	}
	w.attached.lw = lw
	return nil
}

func (w *Worker) detach() {
	w.attached.mu.Lock()
	defer w.attached.mu.Unlock()
	if w.attached.lw != nil {
		// The provider stops first, so the bindings the detach removes
		// start no TTL countdown.
		w.trig.stop()
		w.attached.lw.Detach()
		w.attached.lw = nil
	}
}
