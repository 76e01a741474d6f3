package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/protocol"
)

// Error codes of the builtins, beside the protocol's.
const (
	// CodeNotFound answers an introspection lookup that resolves nothing (or
	// is ambiguous without a namespace).
	CodeNotFound = "NOT_FOUND"
	// CodeInvalidArgument answers a request whose input is malformed.
	CodeInvalidArgument = "invalid_argument"
)

// Builtin function ids.
const (
	FnFunctionsList   = "engine::functions::list"
	FnFunctionsInfo   = "engine::functions::info"
	FnWorkersList     = "engine::workers::list"
	FnWorkersInfo     = "engine::workers::info"
	FnWorkersRegister = "engine::workers::register"
	FnChannelsCreate  = "engine::channels::create"
	FnChannelsDrop    = "engine::channels::drop"
)

// functionInfoBatchMax caps function_ids: a batch saves round trips, it is
// not a way to dump the catalogue (that is engine::functions::list).
const functionInfoBatchMax = 32

type builtin struct {
	def FunctionDef
	h   func(e *Engine, ctx context.Context, call *Call) (any, *protocol.ErrorBody)
}

func (e *Engine) registerBuiltins(b *LocalWorker) {
	for _, bi := range builtinTable() {
		h := bi.h
		handler := func(ctx context.Context, call *Call) (json.RawMessage, error) {
			out, errb := h(e, ctx, call)
			if errb != nil {
				return nil, errb
			}
			if raw, ok := out.(json.RawMessage); ok {
				return raw, nil // written by hand (a builtin every streaming request pays for)
			}
			raw, err := json.Marshal(out)
			if err != nil {
				return nil, &protocol.ErrorBody{Code: protocol.CodeInvocationFailed, Message: "encode result: " + err.Error()}
			}
			return raw, nil
		}
		// engine::channels::watch waits, so it does not run inline on the
		// caller's read loop.
		inline := bi.def.ID != FnChannelsWatch
		if err := b.register(bi.def, handler, inline); err != nil {
			e.log.Error("register builtin", "function_id", bi.def.ID, "error", err)
		}
	}
}

func builtinTable() []builtin {
	return []builtin{
		{FunctionDef{ID: FnFunctionsList, Description: "List registered functions.",
			RequestSchema: json.RawMessage(schemaFunctionsListIn), ResponseSchema: json.RawMessage(schemaFunctionsListOut)}, (*Engine).fnFunctionsList},
		{FunctionDef{ID: FnFunctionsInfo, Description: "Describe one function (function_id) or several (function_ids, at most 32).",
			RequestSchema: json.RawMessage(schemaFunctionsInfoIn), ResponseSchema: json.RawMessage(schemaFunctionsInfoOut)}, (*Engine).fnFunctionsInfo},
		{FunctionDef{ID: FnWorkersList, Description: "List connected workers.",
			RequestSchema: json.RawMessage(schemaWorkersListIn), ResponseSchema: json.RawMessage(schemaWorkersListOut)}, (*Engine).fnWorkersList},
		{FunctionDef{ID: FnWorkersInfo, Description: "Describe one worker by name, with its functions and triggers.",
			RequestSchema: json.RawMessage(schemaWorkersInfoIn), ResponseSchema: json.RawMessage(schemaWorkersInfoOut)}, (*Engine).fnWorkersInfo},
		{FunctionDef{ID: FnWorkersRegister, Description: "Report the calling worker's metadata; fixes its namespace and claims its name.",
			RequestSchema: json.RawMessage(schemaWorkersRegisterIn), ResponseSchema: json.RawMessage(schemaSuccessOut)}, (*Engine).fnWorkersRegister},
		{FunctionDef{ID: FnChannelsCreate, Description: "Create a streaming channel; returns its writer and reader refs.",
			RequestSchema: json.RawMessage(schemaChannelsCreateIn), ResponseSchema: json.RawMessage(schemaChannelsCreateOut)}, (*Engine).fnChannelsCreate},
		{FunctionDef{ID: FnChannelsDrop, Description: "Remove a channel now, given either of its refs (its id and access key): ends that are open close as going away. Returns {dropped}.",
			RequestSchema: json.RawMessage(schemaChannelsDropIn), ResponseSchema: json.RawMessage(schemaChannelsDropOut)}, (*Engine).fnChannelsDrop},
		{FunctionDef{ID: FnChannelsLease, Description: "The calling connection's channel lease: an id prefix and a secret to mint channel refs with, checked when an end is first opened. Returns {lease_id, secret}.",
			RequestSchema: json.RawMessage(schemaChannelsLeaseIn), ResponseSchema: json.RawMessage(schemaChannelsLeaseOut)}, (*Engine).fnChannelsLease},
		{FunctionDef{ID: FnChannelsWatch, Description: "For a channel lease's holder: retire the counters under retire_below, then answer the served channels whose reader opened, waiting up to wait_ms for one. Returns {opened}.",
			RequestSchema: json.RawMessage(schemaChannelsWatchIn), ResponseSchema: json.RawMessage(schemaChannelsWatchOut)}, (*Engine).fnChannelsWatch},
		{FunctionDef{ID: FnCredentialsIssue, Privileged: true, Description: "Issue a narrow credential: its holder may register in one namespace and call what it grants, never a privileged function. Returns {token}.",
			RequestSchema: schemaCredentialsIssueIn}, (*Engine).fnCredentialsIssue},
		{FunctionDef{ID: FnCredentialsRevoke, Privileged: true, Description: "Revoke a credential and close the connections made with it.",
			RequestSchema: schemaCredentialsRevokeIn}, (*Engine).fnCredentialsRevoke},
		{FunctionDef{ID: FnRuntimeStats, Privileged: true, Description: "The engine process's goroutines, open file descriptors and resident memory: {goroutines, open_fds, rss_bytes}.",
			RequestSchema: schemaRuntimeStatsIn, ResponseSchema: schemaRuntimeStatsOut}, (*Engine).fnRuntimeStats},
	}
}

// decodeInput reads a builtin's input object. Absent or null input is an
// empty object.
func decodeInput(data json.RawMessage, v any) *protocol.ErrorBody {
	d := bytes.TrimSpace(data)
	if len(d) == 0 || string(d) == "null" {
		return nil
	}
	if d[0] != '{' {
		return &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "input must be a JSON object"}
	}
	if err := json.Unmarshal(d, v); err != nil {
		return &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "invalid input: " + err.Error()}
	}
	return nil
}

// ── engine::functions::list / info ────────────────────────────────────────

type functionSummary struct {
	FunctionID  string          `json:"function_id"`
	Namespace   string          `json:"namespace"`
	WorkerName  string          `json:"worker_name"`
	Description string          `json:"description,omitempty"`
	Metadata    json.RawMessage `json:"metadata,omitempty"`
}

type registeredTriggerRef struct {
	ID          string          `json:"id"`
	TriggerType string          `json:"trigger_type"`
	Config      json.RawMessage `json:"config"`
}

type functionDetail struct {
	FunctionID         string                 `json:"function_id"`
	Namespace          string                 `json:"namespace"`
	WorkerName         string                 `json:"worker_name"`
	Description        string                 `json:"description,omitempty"`
	RequestSchema      json.RawMessage        `json:"request_schema,omitempty"`
	ResponseSchema     json.RawMessage        `json:"response_schema,omitempty"`
	Metadata           json.RawMessage        `json:"metadata,omitempty"`
	RegisteredTriggers []registeredTriggerRef `json:"registered_triggers"`
}

func ownerName(f *function) string {
	if n := f.owner.name(); n != "" {
		return n
	}
	if i := strings.Index(f.id, "::"); i >= 0 {
		return f.id[:i]
	}
	return f.id
}

func summarize(f *function) functionSummary {
	return functionSummary{FunctionID: f.id, Namespace: f.ns, WorkerName: ownerName(f), Description: f.description, Metadata: f.metadata}
}

// hiddenByDefault is true for engine-internal functions, which
// engine::functions::list shows only with include_internal: engine::*
// except the queue family, and anything whose metadata says internal.
func hiddenByDefault(f *function) bool {
	if strings.HasPrefix(f.id, "engine::") && !strings.HasPrefix(f.id, "engine::queue::") {
		return true
	}
	if len(f.metadata) > 0 {
		var md struct {
			Internal bool `json:"internal"`
		}
		if json.Unmarshal(f.metadata, &md) == nil && md.Internal {
			return true
		}
	}
	return false
}

func (e *Engine) fnFunctionsList(_ context.Context, call *Call) (any, *protocol.ErrorBody) {
	var in struct {
		Search          string   `json:"search"`
		Prefix          string   `json:"prefix"`
		Worker          string   `json:"worker"`
		Workers         []string `json:"workers"`
		IncludeInternal bool     `json:"include_internal"`
	}
	if errb := decodeInput(call.Data, &in); errb != nil {
		return nil, errb
	}
	needle := strings.ToLower(in.Search)
	wantWorkers := slices.Clone(in.Workers)
	if in.Worker != "" {
		wantWorkers = append(wantWorkers, in.Worker)
	}
	out := []functionSummary{}
	for _, f := range e.reg.snapshot() {
		if !in.IncludeInternal && hiddenByDefault(f) {
			continue
		}
		if in.Prefix != "" && !strings.HasPrefix(f.id, in.Prefix) {
			continue
		}
		if needle != "" && !strings.Contains(strings.ToLower(f.id), needle) && !strings.Contains(strings.ToLower(f.description), needle) {
			continue
		}
		s := summarize(f)
		if len(wantWorkers) > 0 && !slices.Contains(wantWorkers, s.WorkerName) {
			continue
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b functionSummary) int {
		if c := strings.Compare(a.FunctionID, b.FunctionID); c != 0 {
			return c
		}
		return strings.Compare(a.Namespace, b.Namespace)
	})
	return map[string]any{"functions": out}, nil
}

func (e *Engine) functionDetail(f *function) functionDetail {
	refs := e.triggers.triggersFor(f.ns, f.id)
	slices.SortFunc(refs, func(a, b registeredTriggerRef) int { return strings.Compare(a.ID, b.ID) })
	return functionDetail{
		FunctionID: f.id, Namespace: f.ns, WorkerName: ownerName(f), Description: f.description,
		RequestSchema: f.requestSchema, ResponseSchema: f.responseSchema, Metadata: f.metadata,
		RegisteredTriggers: refs,
	}
}

// lookupFunctionLoose resolves an introspection lookup: strictly in ns when
// given; otherwise default wins, then a namespace that uniquely holds the
// id; several candidates are an ambiguity, reported with their names.
func (e *Engine) lookupFunctionLoose(ns *string, id string) (*function, *protocol.ErrorBody) {
	if ns != nil {
		if f := e.reg.get(*ns, id); f != nil {
			return f, nil
		}
		where := e.reg.namespacesOf(id)
		msg := "Function " + id + " is not registered in namespace " + *ns + "."
		if len(where) > 0 {
			msg += " It is registered in namespace(s): " + strings.Join(where, ", ") + "."
		}
		return nil, &protocol.ErrorBody{Code: CodeNotFound, Message: msg}
	}
	where := e.reg.namespacesOf(id)
	switch {
	case slices.Contains(where, DefaultNamespace):
		if f := e.reg.get(DefaultNamespace, id); f != nil {
			return f, nil
		}
	case len(where) == 1:
		if f := e.reg.get(where[0], id); f != nil {
			return f, nil
		}
	case len(where) > 1:
		return nil, &protocol.ErrorBody{Code: CodeNotFound, Message: "Function " + id +
			" is ambiguous: it is registered in namespace(s): " + strings.Join(where, ", ") + ". Pass namespace to select one."}
	}
	return nil, &protocol.ErrorBody{Code: CodeNotFound, Message: "Function " + id + " is not registered."}
}

func (e *Engine) fnFunctionsInfo(_ context.Context, call *Call) (any, *protocol.ErrorBody) {
	var in struct {
		FunctionID  *string  `json:"function_id"`
		FunctionIDs []string `json:"function_ids"`
		Namespace   *string  `json:"namespace"`
	}
	if errb := decodeInput(call.Data, &in); errb != nil {
		return nil, errb
	}
	if in.Namespace != nil {
		if errb := validNamespace(*in.Namespace); errb != nil {
			return nil, errb
		}
	}
	switch {
	case in.FunctionID != nil && in.FunctionIDs != nil:
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "pass function_id or function_ids, not both"}
	case in.FunctionID != nil:
		f, errb := e.lookupFunctionLoose(in.Namespace, *in.FunctionID)
		if errb != nil {
			return nil, errb
		}
		return e.functionDetail(f), nil
	case in.FunctionIDs != nil:
		ids := make([]string, 0, len(in.FunctionIDs))
		for _, id := range in.FunctionIDs {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		if len(ids) > functionInfoBatchMax {
			return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "function_ids holds more than 32 ids; use engine::functions::list for the catalogue"}
		}
		entries := make([]any, 0, len(ids))
		for _, id := range ids {
			if f, errb := e.lookupFunctionLoose(in.Namespace, id); errb == nil {
				entries = append(entries, e.functionDetail(f))
			} else {
				entries = append(entries, map[string]string{"function_id": id, "error": "not_found"})
			}
		}
		return map[string]any{"functions": entries}, nil
	default:
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "pass function_id or function_ids"}
	}
}

// ── engine::workers::list / info ──────────────────────────────────────────

type workerSummary struct {
	Name              *string `json:"name"`
	Description       *string `json:"description"`
	Version           *string `json:"version"`
	ID                string  `json:"id"`
	Namespace         string  `json:"namespace"`
	Runtime           *string `json:"runtime"`
	OS                *string `json:"os"`
	Status            string  `json:"status"`
	FunctionCount     int     `json:"function_count"`
	ConnectedAtMS     int64   `json:"connected_at_ms"`
	ActiveInvocations int64   `json:"active_invocations"`
	Isolation         *string `json:"isolation"`
	IPAddress         *string `json:"ip_address"`
}

type workerDetail struct {
	workerSummary
	PID      *int `json:"pid,omitempty"`
	Internal bool `json:"internal"`
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (w *worker) summary() workerSummary {
	w.mu.Lock()
	defer w.mu.Unlock()
	ns := w.namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	status := "connected"
	if w.conn == nil {
		status = "available"
	}
	iso := w.meta.Isolation
	if w.conn == nil && iso == "" {
		iso = "in-process"
	}
	return workerSummary{
		Name: optString(w.meta.Name), Description: optString(w.meta.Description), Version: optString(w.meta.Version),
		ID: w.id, Namespace: ns, Runtime: optString(w.meta.Runtime), OS: optString(w.meta.OS), Status: status,
		FunctionCount: len(w.functions), ConnectedAtMS: w.connectedAt.UnixMilli(), ActiveInvocations: w.active.Load(),
		Isolation: optString(iso), IPAddress: optString(w.ip),
	}
}

func (e *Engine) fnWorkersList(_ context.Context, call *Call) (any, *protocol.ErrorBody) {
	var in struct {
		Search          string `json:"search"`
		Runtime         string `json:"runtime"`
		Status          string `json:"status"`
		IncludeInternal bool   `json:"include_internal"`
	}
	if errb := decodeInput(call.Data, &in); errb != nil {
		return nil, errb
	}
	needle := strings.ToLower(in.Search)
	out := []workerSummary{}
	for _, w := range e.snapshotWorkers() {
		if w.closing.Load() || (w.internal && !in.IncludeInternal) {
			continue
		}
		s := w.summary()
		if needle != "" && (s.Name == nil || !strings.Contains(strings.ToLower(*s.Name), needle)) {
			continue
		}
		if in.Runtime != "" && (s.Runtime == nil || *s.Runtime != in.Runtime) {
			continue
		}
		if in.Status != "" && s.Status != in.Status {
			continue
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b workerSummary) int {
		an, bn := a.ID, b.ID
		if a.Name != nil {
			an = *a.Name
		}
		if b.Name != nil {
			bn = *b.Name
		}
		if c := strings.Compare(an, bn); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return map[string]any{"workers": out}, nil
}

type triggerTypeSummary struct {
	ID          string `json:"id"`
	Namespace   string `json:"namespace"`
	WorkerName  string `json:"worker_name"`
	Description string `json:"description"`
}

type registeredTriggerSummary struct {
	ID          string          `json:"id"`
	TriggerType string          `json:"trigger_type"`
	FunctionID  string          `json:"function_id"`
	WorkerName  string          `json:"worker_name"`
	Status      string          `json:"status"`
	Config      json.RawMessage `json:"config"`
}

func (e *Engine) fnWorkersInfo(_ context.Context, call *Call) (any, *protocol.ErrorBody) {
	var in struct {
		Name      string  `json:"name"`
		Namespace *string `json:"namespace"`
	}
	if errb := decodeInput(call.Data, &in); errb != nil {
		return nil, errb
	}
	if in.Name == "" {
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "name is required"}
	}
	byNS := map[string]*worker{}
	for _, w := range e.snapshotWorkers() {
		if w.closing.Load() {
			continue
		}
		if w.name() == in.Name {
			byNS[w.ns()] = w
		}
	}
	candidates := make([]string, 0, len(byNS))
	for ns := range byNS {
		candidates = append(candidates, ns)
	}
	slices.Sort(candidates)
	var w *worker
	switch {
	case in.Namespace != nil:
		w = byNS[*in.Namespace]
		if w == nil {
			msg := "Worker " + quote(in.Name) + " is not connected in namespace " + *in.Namespace + "."
			if len(candidates) > 0 {
				msg += " It is connected in namespace(s): " + strings.Join(candidates, ", ") + "."
			}
			return nil, &protocol.ErrorBody{Code: CodeNotFound, Message: msg}
		}
	case byNS[DefaultNamespace] != nil:
		w = byNS[DefaultNamespace]
	case len(candidates) == 1:
		w = byNS[candidates[0]]
	case len(candidates) > 1:
		return nil, &protocol.ErrorBody{Code: CodeNotFound, Message: "Worker " + quote(in.Name) +
			" is ambiguous: it is connected in namespace(s): " + strings.Join(candidates, ", ") + ". Pass namespace to select one."}
	default:
		return nil, &protocol.ErrorBody{Code: CodeNotFound, Message: "Worker " + quote(in.Name) + " is not connected."}
	}

	w.mu.Lock()
	pid := w.meta.PID
	w.mu.Unlock()
	detail := workerDetail{workerSummary: w.summary(), PID: pid, Internal: w.internal}

	fns := []functionSummary{}
	for _, f := range e.reg.snapshot() {
		if f.owner == w {
			fns = append(fns, summarize(f))
		}
	}
	slices.SortFunc(fns, func(a, b functionSummary) int { return strings.Compare(a.FunctionID, b.FunctionID) })

	types := []triggerTypeSummary{}
	trig := []registeredTriggerSummary{}
	e.triggers.mu.Lock()
	for _, tt := range e.triggers.types {
		if tt.provider == w {
			types = append(types, triggerTypeSummary{ID: tt.key.id, Namespace: tt.key.ns, WorkerName: in.Name, Description: tt.description})
		}
	}
	for _, b := range e.triggers.bindings {
		if b.originator != w {
			continue
		}
		status := "active"
		if b.bound == nil {
			status = "pending"
		}
		cfg := b.config
		if len(cfg) == 0 {
			cfg = json.RawMessage("null")
		}
		trig = append(trig, registeredTriggerSummary{ID: b.id, TriggerType: b.triggerType, FunctionID: b.functionID,
			WorkerName: in.Name, Status: status, Config: cfg})
	}
	e.triggers.mu.Unlock()
	slices.SortFunc(types, func(a, b triggerTypeSummary) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(trig, func(a, b registeredTriggerSummary) int { return strings.Compare(a.ID, b.ID) })

	return map[string]any{"worker": detail, "functions": fns, "trigger_types": types, "registered_triggers": trig}, nil
}

// ── engine::workers::register ─────────────────────────────────────────────

func (e *Engine) fnWorkersRegister(_ context.Context, call *Call) (any, *protocol.ErrorBody) {
	var in struct {
		CallerWorkerID string          `json:"_caller_worker_id"`
		Runtime        *string         `json:"runtime"`
		Version        *string         `json:"version"`
		Name           *string         `json:"name"`
		Description    *string         `json:"description"`
		OS             *string         `json:"os"`
		PID            *int            `json:"pid"`
		Isolation      *string         `json:"isolation"`
		Telemetry      json.RawMessage `json:"telemetry"`
		Namespace      *string         `json:"namespace"`
	}
	if errb := decodeInput(call.Data, &in); errb != nil {
		return nil, errb
	}
	if len(in.Telemetry) > maxTelemetryBytes {
		// Kept for the worker's life: bounded like what it registers.
		return nil, limitBody(fmt.Sprintf("telemetry is %d bytes, over %d: it describes the worker's SDK, keep it small", len(in.Telemetry), maxTelemetryBytes))
	}
	// The engine knows who is calling; the payload's id is trusted only from
	// in-process callers, which speak for a worker deliberately.
	id := call.CallerWorkerID
	if id == "" {
		id = in.CallerWorkerID
	}
	w := e.lookupWorker(id)
	if w == nil || w.closing.Load() {
		return nil, &protocol.ErrorBody{Code: CodeNotFound, Message: "worker " + quote(id) + " is not connected"}
	}
	if w.conn == nil {
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "in-process workers describe themselves when they attach"}
	}
	requested := DefaultNamespace
	if in.Namespace != nil {
		if errb := validNamespace(*in.Namespace); errb != nil {
			e.log.Warn("engine::workers::register refused", "worker_id", w.id, "code", errb.Code, "error", errb.Message)
			return nil, errb
		}
		requested = *in.Namespace
	}
	if p := w.principal; p != nil && p.session != nil && !p.admin && !p.session.MayDeclare(requested) {
		errb := &protocol.ErrorBody{Code: CodeForbidden, Message: "namespace '" + requested + "' not allowed for this session (permitted: " +
			strings.Join(p.session.DeclarableNamespaces(), ", ") + ")"}
		e.log.Warn("engine::workers::register refused", "worker_id", w.id, "code", errb.Code, "error", errb.Message)
		return nil, errb
	}

	// First writer wins: once fixed, the namespace stays.
	w.mu.Lock()
	ns := requested
	if w.phase == nsPending {
		if w.grace != nil {
			w.grace.Stop()
			w.grace = nil
		}
	} else {
		ns = w.namespace
	}
	w.mu.Unlock()
	if in.Namespace != nil && ns != requested {
		e.log.Warn("engine::workers::register: namespace already fixed; keeping it", "worker_id", w.id, "namespace", ns, "requested", requested)
	}

	name := ""
	if in.Name != nil {
		name = sanitizeText(*in.Name)
	}
	if name != "" {
		if errb := e.claimOrReject(w, ns, name); errb != nil {
			return nil, errb
		}
	}
	if actual := w.pinNamespace(ns); actual != ns && name != "" {
		// The grace timer fixed the namespace between our check and the pin.
		if errb := e.claimOrReject(w, actual, name); errb != nil {
			return nil, errb
		}
	}

	w.mu.Lock()
	if name != "" {
		w.meta.Name = name
	}
	setIf := func(dst *string, src *string) {
		if src != nil {
			*dst = sanitizeText(*src)
		}
	}
	setIf(&w.meta.Runtime, in.Runtime)
	setIf(&w.meta.Version, in.Version)
	setIf(&w.meta.Description, in.Description)
	setIf(&w.meta.OS, in.OS)
	setIf(&w.meta.Isolation, in.Isolation)
	if in.PID != nil {
		pid := *in.PID
		w.meta.PID = &pid
	}
	if len(in.Telemetry) > 0 {
		w.meta.Telemetry = in.Telemetry
	}
	w.mu.Unlock()
	return map[string]bool{"success": true}, nil
}

// nameConflictGrace is how long a registration waits for the connection
// holding its name to finish going away before it is refused.
const nameConflictGrace = 500 * time.Millisecond

// claimOrReject claims the name lease; on conflict the worker is told with a
// registrationrejected frame and its connection is closed: two live workers
// cannot share a name in a namespace.
func (e *Engine) claimOrReject(w *worker, ns, name string) *protocol.ErrorBody {
	holder := e.claimName(w, ns, name)
	if holder != nil {
		// A worker that closed its connection and dialled again at once
		// (a restarted adapter, a fleet host's reconnect) may register
		// before the engine has read its old connection's close: give
		// that connection a moment to go before refusing the name, so a
		// restart is not refused (a refused name ends a Go client for
		// good). A holder that stays is a real conflict.
		select {
		case <-holder.done:
		case <-w.ctx.Done():
		case <-time.After(nameConflictGrace):
		}
		holder = e.claimName(w, ns, name)
	}
	if holder == nil {
		return nil
	}
	e.log.Warn("worker name taken; closing connection", "worker_id", w.id, "namespace", ns, "name", name, "owner_worker_id", holder.id)
	e.reject(w, &protocol.RegistrationRejected{Code: protocol.CodeWorkerNamespaceConflict, Namespace: ns, WorkerName: name, OwnerWorkerID: holder.id})
	w.conn.shutdown(statusPolicyViolation, "worker name already in use")
	return &protocol.ErrorBody{Code: protocol.CodeWorkerNamespaceConflict,
		Message: "worker " + quote(name) + " is already connected in namespace " + ns + " (worker id " + holder.id + ")"}
}

// ── engine::channels::create ──────────────────────────────────────────────

// fnChannelsCreate creates one channel ({buffer_size}: {writer, reader}),
// or several in one call ({channels: [{buffer_size, content}, …]}:
// {channels: [{writer, reader}, …]}). A channel given content is created
// with it as its whole stream and its writer end already used and closed
// (channels.go, prefill): what a caller that would otherwise open the
// writer, write a small payload and close costs no socket.
func (e *Engine) fnChannelsCreate(ctx context.Context, call *Call) (any, *protocol.ErrorBody) {
	var in struct {
		BufferSize *int           `json:"buffer_size"`
		Channels   *[]channelSpec `json:"channels"`
	}
	if errb := decodeInput(call.Data, &in); errb != nil {
		return nil, errb
	}
	batch := in.Channels != nil
	specs := []channelSpec{{BufferSize: in.BufferSize}}
	if batch {
		specs = *in.Channels
		if len(specs) == 0 || len(specs) > MaxChannelBatch {
			return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: fmt.Sprintf("channels must name 1 to %d channels", MaxChannelBatch)}
		}
	}
	contents := make([][]byte, len(specs))
	for i, sp := range specs {
		if sp.BufferSize != nil && *sp.BufferSize < 1 {
			return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "buffer_size must be at least 1 (default 64, max 1024)"}
		}
		b, errb := sp.decodeContent()
		if errb != nil {
			return nil, errb
		}
		contents[i] = b
	}
	n := len(specs)
	if !call.CallerAdmin && e.channels.len()+n > MaxChannels {
		return nil, &protocol.ErrorBody{Code: CodeLimitExceeded, Message: fmt.Sprintf("the engine holds %d channels, its limit; finish or drop some first", MaxChannels)}
	}
	// Streams whose content the connection had inline (fs::read's body)
	// and never opened give way first.
	if !call.CallerAdmin && call.CallerWorkerID != "" && !e.channels.roomFor(call.CallerWorkerID, n) {
		return nil, &protocol.ErrorBody{Code: CodeLimitExceeded, Message: fmt.Sprintf("this connection holds %d channels, its limit; finish or drop some first", MaxChannelsPerConnection)}
	}
	// The answer, written as json.Marshal wrote it from maps of the refs
	// (keys sorted), by hand: with the http worker's streaming on, that
	// encoding was about an eighth of a request's allocations. Clients
	// match it byte for byte (client.CreateChannels).
	out := make([]byte, 0, 16+n*(2*refJSONLen+24))
	if batch {
		out = append(out, `{"channels":[`...)
	}
	made := make([]*channel, 0, n)
	for i, sp := range specs {
		size := 0
		if sp.BufferSize != nil {
			size = *sp.BufferSize
		}
		ch := e.channels.create(e, size, call.CallerWorkerID)
		made = append(made, ch)
		if contents[i] != nil {
			if err := ch.prefill(ctx, contents[i]); err != nil {
				for _, c := range made {
					e.channels.remove(c)
				}
				return nil, &protocol.ErrorBody{Code: CodeLimitExceeded, Message: "no room for the channel's content within the engine's channel budget: " + err.Error()}
			}
		}
		writer, reader := ch.refs()
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"reader":`...)
		out = appendChannelRef(out, reader)
		out = append(out, `,"writer":`...)
		out = appendChannelRef(out, writer)
		out = append(out, '}')
	}
	if batch {
		out = append(out, "]}"...)
	}
	return json.RawMessage(out), nil
}

// refJSONLen is about the length of one ref in JSON (two UUIDs and a
// direction), to size the answer once.
const refJSONLen = 120

// appendChannelRef writes r as json.Marshal does.
func appendChannelRef(b []byte, r protocol.StreamChannelRef) []byte {
	b = append(b, `{"channel_id":`...)
	b = appendString(b, r.ChannelID)
	b = append(b, `,"access_key":`...)
	b = appendString(b, r.AccessKey)
	b = append(b, `,"direction":`...)
	b = appendString(b, r.Direction)
	return append(b, '}')
}

// ── engine::channels::drop ────────────────────────────────────────────────

// fnChannelsDrop removes a channel at once ({channel_id, access_key}:
// {dropped}), or several ({channels: [{channel_id, access_key}, …]}:
// {dropped, count}, dropped true when any was). A channel whose ends were
// not both opened otherwise holds its slot (MaxChannelsPerConnection) until
// ChannelTTL: a streaming HTTP request answered without its channels
// (workers/http) drops them when it ends, many requests' in one call. The
// access key is the proof, as for opening an end; a wrong key and an
// unknown id answer alike.
func (e *Engine) fnChannelsDrop(_ context.Context, call *Call) (any, *protocol.ErrorBody) {
	type ref struct {
		ChannelID string `json:"channel_id"`
		AccessKey string `json:"access_key"`
	}
	var in struct {
		ref
		Channels *[]ref `json:"channels"`
	}
	if errb := decodeInput(call.Data, &in); errb != nil {
		return nil, errb
	}
	refs := []ref{in.ref}
	if in.Channels != nil {
		refs = *in.Channels
		if len(refs) == 0 || len(refs) > MaxChannelDropBatch {
			return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: fmt.Sprintf("channels must name 1 to %d channel refs", MaxChannelDropBatch)}
		}
	}
	for _, r := range refs {
		if r.ChannelID == "" || r.AccessKey == "" {
			return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "channel_id and access_key are required (a channel ref from engine::channels::create)"}
		}
	}
	count := 0
	for _, r := range refs {
		c := e.channels.get(r.ChannelID)
		if c == nil || !c.keyMatches(r.AccessKey) {
			continue
		}
		e.channels.remove(c)
		count++
	}
	if in.Channels != nil {
		return map[string]any{"dropped": count > 0, "count": count}, nil
	}
	return map[string]bool{"dropped": count > 0}, nil
}
