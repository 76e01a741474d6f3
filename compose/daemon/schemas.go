package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
)

// Function ids the daemon serves in its namespace.
const (
	fnUp       = "compose::up"
	fnDown     = "compose::down"
	fnRestart  = "compose::restart"
	fnUpdate   = "compose::update"
	fnAdd      = "compose::add"
	fnRemove   = "compose::remove"
	fnStatus   = "compose::status"
	fnLogs     = "compose::logs"
	fnList     = "compose::list"
	fnValidate = "compose::validate"
	fnStop     = "compose::stop"
	fnSchema   = "compose::schema"
	// FileSchemaID is the pseudo function id compose::schema answers with
	// the compose file's JSON Schema and an example.
	FileSchemaID = "worker-compose.yaml"
)

type functionDef struct {
	id, description   string
	request, response string
	timeoutMS         int
	idempotent        bool
	// privileged functions start, stop or change what runs on the host
	// (or read a file the caller names): the engine lets only callers
	// holding the engine token call them (docs/security.md).
	privileged bool
	handler    func(context.Context, *request) (any, error)
}

// The privilege of each compose::* function, as registered.
const (
	privileged = true
	openToAll  = false
)

// Schema fragments shared by the functions.
const (
	sFile      = `"file":{"type":"string","description":"The compose file; a relative path resolves against the daemon's working directory. Default: ./worker-compose.yaml there."}`
	sNamespace = `"namespace":{"type":"string","description":"Guard: the daemon namespace the caller expects (WRONG_DAEMON otherwise)."}`
	sError     = `{"type":"object","required":["code","message"],"properties":{"code":{"type":"string"},"message":{"type":"string"}}}`
	sState     = `{"type":"string","enum":["starting","ready","failed","stopped"]}`
	sOpResult  = `{"type":"object","required":["operation_id","status","changed","containers"],"properties":{` +
		`"operation_id":{"type":"string"},"status":{"type":"string","enum":["ok","failed"]},"changed":{"type":"boolean"},` +
		`"containers":{"type":"array","items":{"type":"object","required":["container","state","changed"],"properties":{` +
		`"container":{"type":"string"},"state":` + sState + `,"changed":{"type":"boolean"},"error":` + sError + `}}}}}`
	sCursor = `{"type":"object","required":["generation","offset"],"properties":{"generation":{"type":"integer","minimum":0},"offset":{"type":"integer","minimum":0}}}`
)

func obj(props ...string) string {
	return `{"type":"object","properties":{` + strings.Join(props, ",") + `}}`
}

func (d *Daemon) functionDefs() []functionDef {
	return []functionDef{
		{fnUp, "Bring a project up: every container (or one and its dependencies), in dependency order; a failure stops what this call started.",
			obj(sFile, sNamespace, `"container":{"type":"string","description":"Only this container and what it starts after."}`,
				`"frozen":{"type":"boolean","description":"Never edit the compose file or the lock."}`),
			sOpResult, 600000, true, privileged, d.fnUp},
		{fnDown, "Stop a project (or one container and everything that starts after it), dependents first.",
			obj(sFile, sNamespace, `"container":{"type":"string","description":"Only this container and its dependents."}`),
			sOpResult, 300000, true, privileged, d.fnDown},
		{fnRestart, "Restart one worker (only it), or without a worker: down, read the file again, up.",
			obj(sFile, sNamespace, `"worker":{"type":"string","description":"The container to restart; container is accepted as an alias."}`,
				`"container":{"type":"string","description":"Alias of worker."}`),
			sOpResult, 600000, false, privileged, d.fnRestart},
		{fnUpdate, "Resolve package:// workers again (no worker: every one to its registry's latest; the sandbox adapter to the contract range), download and verify them, update the file and the lock, and restart the project once if content changed.",
			obj(sFile, sNamespace, `"worker":{"type":"string","description":"name (resolve the selector in the file again) or name@selector (change it)"}`,
				`"workers":{"type":"array","items":{"type":"string"},"minItems":1,"description":"Several workers; takes precedence over worker."}`),
			`{"type":"object","required":["file","updated","added","removed","restarted"],"properties":{"file":{"type":"string"},` +
				`"updated":{"type":"array","items":{"type":"object","required":["container","from","to","detail","changed"],"properties":{` +
				`"container":{"type":"string"},"from":{"type":"string"},"to":{"type":"string"},"detail":{"type":"string"},"changed":{"type":"boolean"}}}},` +
				`"added":{"type":"array","items":{"type":"string"}},"removed":{"type":"array","items":{"type":"string"}},"restarted":{"type":"boolean"},` +
				`"down":` + sOpResult + `,"up":` + sOpResult + `}}`, 600000, false, privileged, d.fnUpdate},
		{fnAdd, "Add workers to the compose file (comments and quoting kept) and start them: path:// directories, registry packages (an unpinned one at its exact latest version, with its registry dependencies), and worker=iii-sandbox for the sandbox adapter.",
			obj(sFile, sNamespace, `"worker":{"type":"string","description":"A worker spec: ./dir, path://dir, name, name@selector, host/name[@selector], package://..., iii-sandbox."}`,
				`"workers":{"type":"array","minItems":1,"items":{"oneOf":[{"type":"string"},{"type":"object","required":["worker"]}]}}`),
			`{"type":"object","required":["file","added","changed","unchanged"],"properties":{"file":{"type":"string"},"added":{"type":"array","items":{"type":"string"}},` +
				`"changed":{"type":"array","items":{"type":"string"}},"unchanged":{"type":"array","items":{"type":"string"}},"edited":{"type":"boolean"},"up":` + sOpResult + `}}`,
			600000, true, privileged, d.fnAdd},
		{fnRemove, "Remove a worker from the compose file, stop it, and bring the rest up again (idempotent).",
			`{"type":"object","required":["worker"],"properties":{` + sFile + `,` + sNamespace + `,"worker":{"type":"string"}}}`,
			`{"type":"object","required":["file","removed"],"properties":{"file":{"type":"string"},"removed":{"type":"string"},"down":` + sOpResult + `,"up":` + sOpResult + `}}`,
			300000, true, privileged, d.fnRemove},
		{fnStatus, "The project's namespace, file, state directory, daemon pid, and each container's state, pid, ownership, log and last error.",
			obj(sFile, sNamespace),
			`{"type":"object","required":["namespace","file","state_dir","daemon_pid","containers"],"properties":{"namespace":{"type":"string"},"file":{"type":"string"},` +
				`"state_dir":{"type":"string"},"daemon_pid":{"type":"integer"},"containers":{"type":"array","items":{"type":"object","required":["container","state","pid","owned","log_path"],` +
				`"properties":{"container":{"type":"string"},"state":` + sState + `,"pid":{"type":["integer","null"]},"owned":{"type":"boolean"},"log_path":{"type":"string"},"last_error":` + sError + `}}}}}`,
			30000, true, openToAll, d.fnStatus},
		{fnLogs, "Read workers' logs: the newest lines, or what follows the given cursors (waiting up to wait_ms for more).",
			obj(sFile, sNamespace, `"worker":{"type":"string"}`, `"tail":{"type":"integer","minimum":0,"maximum":1000,"default":100}`,
				`"cursors":{"type":"object","additionalProperties":`+sCursor+`}`, `"stream":{"type":"string","enum":["stdout","stderr"]}`,
				`"wait_ms":{"type":"integer","minimum":0,"maximum":5000}`),
			`{"type":"object","required":["containers"],"properties":{"file":{"type":"string"},"namespace":{"type":"string"},"containers":{"type":"array","items":{"type":"object",` +
				`"required":["container","entries","cursor","truncated"],"properties":{"container":{"type":"string"},"log_path":{"type":"string"},"entries":{"type":"array","items":{"type":"object",` +
				`"required":["stream","message"],"properties":{"stream":{"type":"string","enum":["stdout","stderr"]},"message":{"type":"string"}}}},"cursor":` + sCursor + `,"truncated":{"type":"boolean"}}}}}}`,
			30000, true, openToAll, d.fnLogs},
		{fnList, "The daemon's name, namespace, pid and the projects it runs.",
			obj(sNamespace),
			`{"type":"object","required":["daemon","daemon_namespace","daemon_pid","projects"],"properties":{"daemon":{"type":"string"},"daemon_namespace":{"type":"string"},` +
				`"daemon_pid":{"type":"integer"},"projects":{"type":"array"}}}`,
			30000, true, openToAll, d.fnList},
		{fnValidate, "Read and check a compose file offline: its namespace, start order and the package workers left unresolved.",
			obj(sFile, sNamespace),
			`{"type":"object","required":["namespace","start_order","deferred_packages"],"properties":{"namespace":{"type":"string"},"start_order":{"type":"array","items":{"type":"string"}},` +
				`"deferred_packages":{"type":"array","items":{"type":"string"}}}}`,
			30000, true, privileged, d.fnValidate},
		{fnStop, "Stop the daemon: every project, then the engine it started. Returns before the daemon exits.",
			obj(sNamespace),
			`{"type":"object","required":["daemon","pid","stopping"],"properties":{"daemon":{"type":"string"},"namespace":{"type":"string"},"pid":{"type":"integer"},"stopping":{"type":"array","items":{"type":"string"}}}}`,
			30000, true, privileged, d.fnStop},
		{fnSchema, "The schemas of the compose::* functions, or of one; function_id=worker-compose.yaml gives the compose file's JSON Schema and an example.",
			obj(sNamespace, `"function_id":{"type":"string"}`),
			`{"type":"object"}`, 30000, true, openToAll, d.fnSchema},
	}
}

type schemaJSON struct {
	FunctionID       string          `json:"function_id"`
	Description      string          `json:"description"`
	Request          json.RawMessage `json:"request"`
	Response         json.RawMessage `json:"response"`
	DefaultTimeoutMS int             `json:"default_timeout_ms"`
	Idempotent       bool            `json:"idempotent"`
	// Privileged: only a caller holding the engine token may call it.
	Privileged bool `json:"privileged"`
}

func (d *Daemon) fnSchema(_ context.Context, r *request) (any, error) {
	fileSchema := schemaJSON{FunctionID: FileSchemaID, Description: "The worker-compose.yaml file: request is its JSON Schema, response a commented example.",
		Request: composefile.Schema(), DefaultTimeoutMS: 0, Idempotent: true}
	example, _ := json.Marshal(composefile.Example())
	fileSchema.Response = example
	all := []schemaJSON{}
	for _, fd := range d.functionDefs() {
		all = append(all, schemaJSON{fd.id, fd.description, json.RawMessage(fd.request), json.RawMessage(fd.response), fd.timeoutMS, fd.idempotent, fd.privileged})
	}
	if r.FunctionID == nil || *r.FunctionID == "" {
		return map[string]any{"functions": append(all, fileSchema)}, nil
	}
	if *r.FunctionID == FileSchemaID {
		return fileSchema, nil
	}
	for _, s := range all {
		if s.FunctionID == *r.FunctionID {
			return s, nil
		}
	}
	ids := []string{}
	for _, s := range all {
		ids = append(ids, s.FunctionID)
	}
	slices.Sort(ids)
	return nil, compose.New(CodeInvalidArgument, fmt.Sprintf("compose::schema knows no function %q; it knows %s and %s", *r.FunctionID, strings.Join(ids, ", "), FileSchemaID))
}
