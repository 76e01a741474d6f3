package contract

import (
	"encoding/json"
	"github.com/iii-sandbox/iii/internal/lazyre"
	"net/url"
	"path"
	"path/filepath"
	"strings"
)

// The worker decoders follow the sandbox decoders' rules (a JSON object,
// unknown fields ignored, null counts as absent, a wrong type is S001 naming
// the field) and add the worker's own checks.

// ForbiddenWorkerEnv is the environment name a worker::start request may
// never set: the engine token must not be readable inside a VM. (III_URL,
// III_ENGINE_URL, III_ISOLATION and III_CONFIG are the adapter's to set;
// values for them in env are replaced, not refused.)
const ForbiddenWorkerEnv = "III_ENGINE_TOKEN"

// workerNamespaceRE is a Compose namespace.
var workerNamespaceRE = lazyre.New(`^[a-z0-9_-]+$`)

func (r *request) vmID() (string, *Error) {
	id, e := r.requiredStr("vm_id")
	if e != nil {
		return "", e
	}
	if !ValidVMID(id) {
		return "", r.fail("vm_id %q is not path-safe: use 1 to %d of a-z 0-9 . _ -, starting with a letter or digit", truncate(id, 80), MaxVMIDLen)
	}
	return id, nil
}

// DecodeWorkerStartRequest decodes and validates worker::start.
func DecodeWorkerStartRequest(raw json.RawMessage) (*WorkerStartRequest, error) {
	return result(decodeWorkerStart(raw))
}

func decodeWorkerStart(raw json.RawMessage) (*WorkerStartRequest, *Error) {
	r, e := newRequest(OpWorkerStart, raw)
	if e != nil {
		return nil, e
	}
	var q WorkerStartRequest
	if q.VMID, e = r.vmID(); e != nil {
		return nil, e
	}
	if q.Name, e = r.requiredStr("name"); e != nil {
		return nil, e
	}
	if q.Namespace, _, e = r.str("namespace"); e != nil {
		return nil, e
	}
	if q.Namespace != "" && !workerNamespaceRE.MatchString(q.Namespace) {
		return nil, r.fail("namespace %q is not valid: use lower case letters, digits, _ and -", truncate(q.Namespace, 80))
	}
	if q.Image, e = r.requiredStr("image"); e != nil {
		return nil, e
	}
	if q.HostDir, e = r.requiredStr("host_dir"); e != nil {
		return nil, e
	}
	if !filepath.IsAbs(q.HostDir) {
		return nil, r.fail("host_dir %q must be an absolute host path", truncate(q.HostDir, 120))
	}
	q.HostDir = filepath.Clean(q.HostDir)
	if q.Workdir, e = r.workdir(); e != nil {
		return nil, e
	}
	if q.Install, _, e = r.str("install"); e != nil {
		return nil, e
	}
	if strings.IndexByte(q.Install, 0) >= 0 {
		return nil, r.fail("field \"install\" must not contain NUL bytes")
	}
	if q.Command, e = r.requiredStr("command"); e != nil {
		return nil, e
	}
	if strings.TrimSpace(q.Command) == "" {
		return nil, r.fail("field \"command\" is blank: pass the shell command that starts the worker")
	}
	if q.Env, e = r.env(); e != nil {
		return nil, e
	}
	for _, kv := range q.Env {
		if k, _, _ := strings.Cut(kv, "="); k == ForbiddenWorkerEnv {
			return nil, r.fail("env sets %s: the engine token authenticates Compose to the engine and must never be readable inside a VM; leave it out", k)
		}
	}
	if q.Config, e = r.workerConfig(); e != nil {
		return nil, e
	}
	if q.CPUs, e = r.u32("cpus"); e != nil {
		return nil, e
	}
	if q.CPUs != nil && *q.CPUs == 0 {
		return nil, r.fail("field \"cpus\" must be at least 1")
	}
	if q.MemoryMB, e = r.u32("memory_mb"); e != nil {
		return nil, e
	}
	if q.MemoryMB != nil && *q.MemoryMB == 0 {
		return nil, r.fail("field \"memory_mb\" must be at least 1")
	}
	if q.EngineURL, e = r.requiredStr("engine_url"); e != nil {
		return nil, e
	}
	if e = r.engineURL(q.EngineURL); e != nil {
		return nil, e
	}
	if q.Exclude, e = r.strings("exclude"); e != nil {
		return nil, e
	}
	for i, p := range q.Exclude {
		if !filepath.IsAbs(p) || strings.IndexByte(p, 0) >= 0 {
			return nil, r.fail("exclude[%d] %q must be an absolute host path", i, truncate(p, 120))
		}
		q.Exclude[i] = filepath.Clean(p)
	}
	if q.Include, e = r.strings("include"); e != nil {
		return nil, e
	}
	if len(q.Include) > MaxWorkerInclude {
		return nil, r.fail("include lists %d names; at most %d", len(q.Include), MaxWorkerInclude)
	}
	for i, n := range q.Include {
		if n == "" || n == "." || n == ".." || len(n) > 255 || strings.ContainsAny(n, "/\\\x00") {
			return nil, r.fail("include[%d] %q must be a plain name of an entry at the top of host_dir (such as node_modules)", i, truncate(n, 120))
		}
		if n == ".iii" {
			return nil, r.fail("include[%d] is .iii: Compose's state (the project token among it) never enters a VM", i)
		}
	}
	if q.Wait, e = r.boolean("wait", false); e != nil {
		return nil, e
	}
	if q.EngineCredential, _, e = r.str("engine_credential"); e != nil {
		return nil, e
	}
	if len(q.EngineCredential) > 256 || strings.ContainsAny(q.EngineCredential, " \t\r\n") {
		return nil, r.fail("field \"engine_credential\" must be a token of at most 256 characters without white space")
	}
	return &q, nil
}

// workdir reads an absolute guest path, or a path relative to /workspace
// that stays below it.
func (r *request) workdir() (string, *Error) {
	w, _, e := r.str("workdir")
	if e != nil || w == "" {
		return "", e
	}
	if strings.IndexByte(w, 0) >= 0 {
		return "", r.fail("field \"workdir\" must not contain NUL bytes")
	}
	if strings.HasPrefix(w, "/") {
		return path.Clean(w), nil
	}
	clean := path.Clean(w)
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", r.fail("workdir %q leaves /workspace: use a path below it, or an absolute guest path", truncate(w, 120))
	}
	return path.Join(DefaultWorkerWorkdir, clean), nil
}

func (r *request) workerConfig() (*WorkerConfigFile, *Error) {
	raw, ok := r.get("config")
	if !ok {
		return nil, nil
	}
	sub := &request{op: r.op, code: r.code}
	if raw[0] != '{' || json.Unmarshal(raw, &sub.fields) != nil {
		return nil, r.typeErr("config", "an object {file_name, content}", raw)
	}
	name, e := sub.requiredStr("file_name")
	if e != nil {
		return nil, r.fail("config: %s", strings.TrimPrefix(e.Message, "invalid "+r.function()+" request: "))
	}
	if !configFileRE.MatchString(name) {
		return nil, r.fail("config.file_name %q must be a plain file name (letters, digits, . _ -; no directories)", truncate(name, 80))
	}
	content, ok, e := sub.str("content")
	if e != nil || !ok {
		return nil, r.fail("config.content is required and must be a string (the file's text)")
	}
	if len(content) > MaxWorkerConfigBytes {
		return nil, r.fail("config.content is %d bytes, more than %d", len(content), MaxWorkerConfigBytes)
	}
	return &WorkerConfigFile{FileName: name, Content: content}, nil
}

// engineURL checks that the worker can be told where the engine is.
func (r *request) engineURL(s string) *Error {
	u, err := url.Parse(s)
	if err != nil {
		return r.fail("engine_url %q is not a URL: %v", truncate(s, 120), err)
	}
	if u.Scheme != "ws" && u.Scheme != "wss" {
		return r.fail("engine_url %q must be a ws:// or wss:// URL such as ws://127.0.0.1:49134", truncate(s, 120))
	}
	if u.Hostname() == "" {
		return r.fail("engine_url %q names no host", truncate(s, 120))
	}
	return nil
}

// DecodeWorkerStopRequest decodes and validates worker::stop.
func DecodeWorkerStopRequest(raw json.RawMessage) (*WorkerStopRequest, error) {
	return result(decodeWorkerStop(raw))
}

func decodeWorkerStop(raw json.RawMessage) (*WorkerStopRequest, *Error) {
	r, e := newRequest(OpWorkerStop, raw)
	if e != nil {
		return nil, e
	}
	q := WorkerStopRequest{TimeoutMS: DefaultWorkerStopTimeoutMS}
	if q.VMID, e = r.vmID(); e != nil {
		return nil, e
	}
	t, e := r.u64("timeout_ms")
	if e != nil {
		return nil, e
	}
	if t != nil {
		if *t > MaxWorkerStopTimeoutMS {
			return nil, r.fail("timeout_ms %d is above %d", *t, MaxWorkerStopTimeoutMS)
		}
		q.TimeoutMS = *t
	}
	return &q, nil
}

// DecodeWorkerStatusRequest decodes and validates worker::status.
func DecodeWorkerStatusRequest(raw json.RawMessage) (*WorkerStatusRequest, error) {
	r, e := newRequest(OpWorkerStatus, raw)
	if e != nil {
		return nil, e
	}
	id, e := r.vmID()
	if e != nil {
		return nil, e
	}
	return &WorkerStatusRequest{VMID: id}, nil
}

// DecodeWorkerListRequest validates worker::list, which takes no fields.
func DecodeWorkerListRequest(raw json.RawMessage) (*WorkerListRequest, error) {
	if _, e := newRequest(OpWorkerList, raw); e != nil {
		return nil, e
	}
	return &WorkerListRequest{}, nil
}

// DecodeWorkerLogsRequest decodes and validates worker::logs.
func DecodeWorkerLogsRequest(raw json.RawMessage) (*WorkerLogsRequest, error) {
	return result(decodeWorkerLogs(raw))
}

func decodeWorkerLogs(raw json.RawMessage) (*WorkerLogsRequest, *Error) {
	r, e := newRequest(OpWorkerLogs, raw)
	if e != nil {
		return nil, e
	}
	var q WorkerLogsRequest
	if q.VMID, e = r.vmID(); e != nil {
		return nil, e
	}
	if q.Tail, e = r.positiveU64("tail", DefaultWorkerLogsTail); e != nil {
		return nil, e
	}
	if q.Tail > MaxWorkerLogsTail {
		return nil, r.fail("tail %d is above %d", q.Tail, MaxWorkerLogsTail)
	}
	if q.Cursor, e = r.u64("cursor"); e != nil {
		return nil, e
	}
	return &q, nil
}

// DecodeWorkerRemoveRequest decodes and validates worker::remove.
func DecodeWorkerRemoveRequest(raw json.RawMessage) (*WorkerRemoveRequest, error) {
	r, e := newRequest(OpWorkerRemove, raw)
	if e != nil {
		return nil, e
	}
	id, e := r.vmID()
	if e != nil {
		return nil, e
	}
	return &WorkerRemoveRequest{VMID: id}, nil
}
