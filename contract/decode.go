package contract

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/iii-sandbox/iii/internal/jsonkind"
	"github.com/iii-sandbox/iii/protocol"
)

// Decoding rules shared by every adapter, so a request means the same thing
// whichever adapter serves it:
//
//   - The payload is a JSON object (null or empty counts as {}). Unknown
//     fields are ignored; a field set to null counts as absent.
//   - A field of the wrong JSON type is S001 (S210 for fs ops) with a
//     message that names the field. sandbox_id problems are always S001.
//   - Defaults from the spec tables are applied, so adapters see resolved
//     values.

// request holds one payload's top-level fields while they are decoded.
type request struct {
	op     string
	code   Code
	fields map[string]json.RawMessage
}

func newRequest(op string, raw json.RawMessage) (*request, *Error) {
	code := S001
	if IsFsOp(op) {
		code = S210
	}
	r := &request{op: op, code: code, fields: map[string]json.RawMessage{}}
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return r, nil
	}
	if trimmed[0] != '{' {
		return nil, r.fail("the request must be a JSON object, got %s", jsonkind.Of(trimmed))
	}
	if err := json.Unmarshal(trimmed, &r.fields); err != nil {
		return nil, r.fail("the request is not valid JSON: %v", err)
	}
	return r, nil
}

func (r *request) fail(format string, args ...any) *Error {
	return NewError(r.code, "invalid %s request: %s", r.function(), fmt.Sprintf(format, args...))
}

func (r *request) failCode(code Code, format string, args ...any) *Error {
	return NewError(code, "invalid %s request: %s", r.function(), fmt.Sprintf(format, args...))
}

// function names the function in messages: sandbox::<op> for the router's
// operations, the bare worker::<op> for the worker operations, which
// callers address through the adapter's own prefix.
func (r *request) function() string {
	if IsWorkerOp(r.op) {
		return r.op
	}
	return RouterPrefix + r.op
}

// get returns a field's raw value; null and absent are the same.
func (r *request) get(name string) (json.RawMessage, bool) {
	v, ok := r.fields[name]
	if !ok {
		return nil, false
	}
	v = bytes.TrimSpace(v)
	if string(v) == "null" {
		return nil, false
	}
	return v, true
}

func (r *request) typeErr(name, want string, raw []byte) *Error {
	return r.fail("field %q must be %s, got %s", name, want, jsonkind.Of(raw))
}

func (r *request) str(name string) (string, bool, *Error) {
	raw, ok := r.get(name)
	if !ok {
		return "", false, nil
	}
	var s string
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false, r.typeErr(name, "a string", raw)
	}
	return s, true, nil
}

// requiredStr returns a field that must be a non-empty string without NUL
// bytes (paths and names reach system calls, which stop at NUL).
func (r *request) requiredStr(name string) (string, *Error) {
	s, ok, e := r.str(name)
	if e != nil {
		return "", e
	}
	if !ok {
		return "", r.fail("field %q is required", name)
	}
	if s == "" {
		return "", r.fail("field %q must not be empty", name)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return "", r.fail("field %q must not contain NUL bytes", name)
	}
	return s, nil
}

func (r *request) boolean(name string, def bool) (bool, *Error) {
	raw, ok := r.get(name)
	if !ok {
		return def, nil
	}
	switch string(raw) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, r.typeErr(name, "a boolean", raw)
}

// unsigned reads a whole number that fits in bits; fractions, exponents and
// negative numbers are refused, as they would be silently changed.
func (r *request) unsigned(name string, bits int) (uint64, bool, *Error) {
	raw, ok := r.get(name)
	if !ok {
		return 0, false, nil
	}
	if raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9') {
		v, err := strconv.ParseUint(string(raw), 10, bits)
		if err == nil {
			return v, true, nil
		}
	}
	if jsonkind.Of(raw) == "a number" {
		return 0, false, r.fail("field %q must be a whole number from 0 to %d, got %s", name, uint64(1)<<bits-1, truncate(string(raw), 40))
	}
	return 0, false, r.typeErr(name, "a whole number", raw)
}

func (r *request) u32(name string) (*uint32, *Error) {
	v, ok, e := r.unsigned(name, 32)
	if e != nil || !ok {
		return nil, e
	}
	u := uint32(v)
	return &u, nil
}

func (r *request) u64(name string) (*uint64, *Error) {
	v, ok, e := r.unsigned(name, 64)
	if e != nil || !ok {
		return nil, e
	}
	return &v, nil
}

// positiveU64 reads a field that defaults to def and must not be zero.
func (r *request) positiveU64(name string, def uint64) (uint64, *Error) {
	v, e := r.u64(name)
	if e != nil {
		return 0, e
	}
	if v == nil {
		return def, nil
	}
	if *v == 0 {
		return 0, r.fail("field %q must be at least 1", name)
	}
	return *v, nil
}

func (r *request) strings(name string) ([]string, *Error) {
	raw, ok := r.get(name)
	if !ok {
		return nil, nil
	}
	var items []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, r.typeErr(name, "an array of strings", raw)
	}
	out := make([]string, 0, len(items))
	for i, it := range items {
		var s string
		it = bytes.TrimSpace(it)
		if len(it) == 0 || it[0] != '"' || json.Unmarshal(it, &s) != nil {
			return nil, r.fail("field %q must be an array of strings, but item %d is %s", name, i, jsonkind.Of(it))
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

func (r *request) sandboxID() (string, *Error) {
	raw, ok := r.get("sandbox_id")
	if !ok {
		return "", r.failCode(S001, "field \"sandbox_id\" is required: pass the id sandbox::create returned")
	}
	var s string
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", r.failCode(S001, "field \"sandbox_id\" must be a string, got %s", jsonkind.Of(raw))
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return "", r.failCode(S001, "sandbox_id is not a valid UUID: %q", truncate(s, 80))
	}
	// The canonical form, so "ABC…" and "{abc…}" name the same sandbox.
	return id.String(), nil
}

func (r *request) mode(name string, def Mode, required bool) (Mode, *Error) {
	raw, ok := r.get(name)
	if !ok {
		if required {
			return 0, r.fail("field %q is required (an octal string such as \"0644\")", name)
		}
		return def, nil
	}
	var s string
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return 0, r.fail("field %q must be an octal string such as \"0644\", got %s (quote it: a bare 644 is a decimal number)", name, jsonkind.Of(raw))
	}
	m, err := ParseMode(s)
	if err != nil {
		return 0, r.fail("field %q: %v", name, err)
	}
	return m, nil
}

func (r *request) base64(name string) ([]byte, bool, *Error) {
	s, ok, e := r.str(name)
	if e != nil || !ok {
		return nil, false, e
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		// Unpadded base64 is common from hand-written callers.
		var err2 error
		if b, err2 = base64.RawStdEncoding.DecodeString(s); err2 != nil {
			return nil, false, r.fail("field %q must be standard base64: %v", name, err)
		}
	}
	return b, true, nil
}

// envName matches the names a map-shaped env may use.
func validEnvName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		alpha := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_'
		if !alpha && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// env reads ["K=V", ...] or {K: V, ...} into "K=V" entries; map entries
// come out sorted by key, so equal maps give equal environments.
func (r *request) env() ([]string, *Error) {
	raw, ok := r.get("env")
	if !ok {
		return nil, nil
	}
	switch raw[0] {
	case '[':
		list, e := r.strings("env")
		if e != nil {
			return nil, e
		}
		for i, kv := range list {
			eq := strings.IndexByte(kv, '=')
			if eq <= 0 {
				return nil, r.fail("env item %d (%q) must have the form NAME=value", i, truncate(kv, 60))
			}
			if strings.IndexByte(kv, 0) >= 0 {
				return nil, r.fail("env item %d must not contain NUL bytes", i)
			}
		}
		return list, nil
	case '{':
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, r.typeErr("env", "an array of \"K=V\" strings or an object of strings", raw)
		}
		keys := make([]string, 0, len(m))
		var bad []string
		for k := range m {
			if !validEnvName(k) {
				bad = append(bad, strconv.Quote(truncate(k, 60)))
			}
			keys = append(keys, k)
		}
		if len(bad) > 0 {
			sort.Strings(bad)
			return nil, r.fail("env has invalid variable names %s: names must match [A-Za-z_][A-Za-z0-9_]*", strings.Join(bad, ", "))
		}
		sort.Strings(keys)
		out := make([]string, 0, len(keys))
		for _, k := range keys {
			v := bytes.TrimSpace(m[k])
			var s string
			if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil {
				return nil, r.fail("env.%s must be a string, got %s", k, jsonkind.Of(v))
			}
			if strings.IndexByte(s, 0) >= 0 {
				return nil, r.fail("env.%s must not contain NUL bytes", k)
			}
			out = append(out, k+"="+s)
		}
		if len(out) == 0 {
			return nil, nil
		}
		return out, nil
	}
	return nil, r.typeErr("env", "an array of \"K=V\" strings or an object of strings", raw)
}

// regex checks a grep/sed pattern the way adapters compile it (RE2), so a
// bad pattern is S217 before any sandbox is touched.
func (r *request) regex(pattern string, ignoreCase bool) *Error {
	p := pattern
	if ignoreCase {
		p = "(?i)" + p
	}
	if _, err := regexp.Compile(p); err != nil {
		return r.failCode(S217, "pattern %q is not a valid RE2 regular expression: %v", truncate(pattern, 120), err)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// result converts an internal result into the public (value, error) pair
// without a typed-nil error.
func result[T any](v *T, e *Error) (*T, error) {
	if e != nil {
		return nil, e
	}
	return v, nil
}

// DecodeCreateRequest decodes and validates sandbox::create.
func DecodeCreateRequest(raw json.RawMessage) (*CreateRequest, error) {
	return result(decodeCreate(raw))
}

func decodeCreate(raw json.RawMessage) (*CreateRequest, *Error) {
	r, e := newRequest(OpCreate, raw)
	if e != nil {
		return nil, e
	}
	var q CreateRequest
	if q.Image, e = r.requiredStr("image"); e != nil {
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
	if q.Name, _, e = r.str("name"); e != nil {
		return nil, e
	}
	if q.Network, e = r.boolean("network", false); e != nil {
		return nil, e
	}
	if q.IdleTimeoutSecs, e = r.u64("idle_timeout_secs"); e != nil {
		return nil, e
	}
	if q.Env, e = r.env(); e != nil {
		return nil, e
	}
	if q.Progress, e = r.progress(); e != nil {
		return nil, e
	}
	return &q, nil
}

// DecodeExecRequest decodes and validates sandbox::exec, resolving its three
// command shapes into Argv:
//
//   - argv: [bin, ...] when non-empty; combining it with cmd or args is
//     ambiguous (S001);
//   - cmd with whitespace and no args: split like a shell would split words,
//     without any shell semantics; whitespace in cmd plus args is ambiguous;
//   - otherwise cmd + args.
func DecodeExecRequest(raw json.RawMessage) (*ExecRequest, error) {
	return result(decodeExec(raw))
}

func decodeExec(raw json.RawMessage) (*ExecRequest, *Error) {
	r, e := newRequest(OpExec, raw)
	if e != nil {
		return nil, e
	}
	var q ExecRequest
	if q.SandboxID, e = r.sandboxID(); e != nil {
		return nil, e
	}
	cmd, _, e := r.str("cmd")
	if e != nil {
		return nil, e
	}
	args, e := r.strings("args")
	if e != nil {
		return nil, e
	}
	argv, e := r.strings("argv")
	if e != nil {
		return nil, e
	}
	if q.Argv, e = r.resolveArgv(cmd, args, argv); e != nil {
		return nil, e
	}
	if q.Stdin, _, e = r.base64("stdin"); e != nil {
		return nil, e
	}
	if len(q.Stdin) == 0 {
		q.Stdin = nil
	}
	if q.Env, e = r.env(); e != nil {
		return nil, e
	}
	if q.TimeoutMS, e = r.positiveU64("timeout_ms", DefaultExecTimeoutMS); e != nil {
		return nil, e
	}
	if q.Workdir, _, e = r.str("workdir"); e != nil {
		return nil, e
	}
	if strings.IndexByte(q.Workdir, 0) >= 0 {
		return nil, r.fail("field \"workdir\" must not contain NUL bytes")
	}
	return &q, nil
}

func (r *request) resolveArgv(cmd string, args, argv []string) ([]string, *Error) {
	var out []string
	switch {
	case len(argv) > 0:
		if cmd != "" || len(args) > 0 {
			return nil, r.fail("argv cannot be combined with cmd or args; pick one shape: argv: [bin, ...], or cmd + args")
		}
		out = argv
	case strings.IndexFunc(cmd, isShellSpace) >= 0:
		if len(args) > 0 {
			return nil, r.fail("cmd contains whitespace and args is set, which is ambiguous: pass the binary alone in cmd with args, " +
				"leave args empty to have cmd split into words, or use argv")
		}
		words, err := Split(cmd)
		if err != nil {
			return nil, r.fail("cmd cannot be split into words (%v); use argv: [bin, ...] for arguments with quotes", err)
		}
		if len(words) == 0 {
			return nil, r.fail("cmd is blank: pass the binary to run in cmd or argv")
		}
		out = words
	default:
		if cmd == "" {
			return nil, r.fail("nothing to run: pass cmd (optionally with args) or argv: [bin, ...]")
		}
		out = append([]string{cmd}, args...)
	}
	if out[0] == "" {
		return nil, r.fail("the binary to run (argv[0]) must not be empty")
	}
	for i, a := range out {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, r.fail("argument %d must not contain NUL bytes", i)
		}
	}
	return out, nil
}

// DecodeRunRequest decodes and validates sandbox::run.
func DecodeRunRequest(raw json.RawMessage) (*RunRequest, error) {
	return result(decodeRun(raw))
}

func decodeRun(raw json.RawMessage) (*RunRequest, *Error) {
	r, e := newRequest(OpRun, raw)
	if e != nil {
		return nil, e
	}
	var q RunRequest
	if q.Image, e = r.requiredStr("image"); e != nil {
		return nil, e
	}
	var ok bool
	if q.Code, ok, e = r.str("code"); e != nil {
		return nil, e
	}
	if !ok {
		return nil, r.fail("field \"code\" is required")
	}
	if q.Lang, e = r.requiredStr("lang"); e != nil {
		return nil, e
	}
	if q.Files, e = r.runFiles(); e != nil {
		return nil, e
	}
	if q.Env, e = r.env(); e != nil {
		return nil, e
	}
	if q.Stdin, _, e = r.base64("stdin"); e != nil {
		return nil, e
	}
	if len(q.Stdin) == 0 {
		q.Stdin = nil
	}
	if q.TimeoutMS, e = r.positiveU64("timeout_ms", DefaultExecTimeoutMS); e != nil {
		return nil, e
	}
	if q.KeepSandbox, e = r.boolean("keep_sandbox", false); e != nil {
		return nil, e
	}
	if q.Progress, e = r.progress(); e != nil {
		return nil, e
	}
	return &q, nil
}

// progress reads create's and run's optional progress channel. Either end
// of the channel is accepted (both carry the same id and key): the host
// always takes the write end, and the caller reads the other. The result is
// the write end's ref.
func (r *request) progress() (*protocol.StreamChannelRef, *Error) {
	raw, ok := r.get(ProgressField)
	if !ok {
		return nil, nil
	}
	sub := &request{op: r.op, code: r.code}
	if raw[0] != '{' || json.Unmarshal(raw, &sub.fields) != nil {
		return nil, r.typeErr(ProgressField, "a channel ref object {channel_id, access_key, direction} (engine::channels::create)", raw)
	}
	var ref protocol.StreamChannelRef
	for _, f := range []struct {
		name string
		dst  *string
	}{{"channel_id", &ref.ChannelID}, {"access_key", &ref.AccessKey}, {"direction", &ref.Direction}} {
		s, ok, e := sub.str(f.name)
		if e != nil || !ok || s == "" {
			return nil, r.fail("progress must be a channel ref: progress.%s must be a non-empty string", f.name)
		}
		*f.dst = s
	}
	if ref.Direction != protocol.DirectionWrite && ref.Direction != protocol.DirectionRead {
		return nil, r.fail("progress.direction must be %q or %q, got %q", protocol.DirectionWrite, protocol.DirectionRead, truncate(ref.Direction, 20))
	}
	ref.Direction = protocol.DirectionWrite
	return &ref, nil
}

func (r *request) runFiles() ([]RunFile, *Error) {
	raw, ok := r.get("files")
	if !ok {
		return nil, nil
	}
	var items []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, r.typeErr("files", "an array of {path, content} objects", raw)
	}
	var out []RunFile
	for i, it := range items {
		sub := &request{op: r.op, code: r.code}
		it = bytes.TrimSpace(it)
		if len(it) == 0 || it[0] != '{' || json.Unmarshal(it, &sub.fields) != nil {
			return nil, r.fail("files[%d] must be an object {path, content}, got %s", i, jsonkind.Of(it))
		}
		path, e := sub.requiredStr("path")
		if e != nil {
			return nil, r.fail("files[%d]: %s", i, strings.TrimPrefix(e.Message, "invalid sandbox::run request: "))
		}
		content, ok, e := sub.str("content")
		if e != nil || !ok {
			return nil, r.fail("files[%d]: field \"content\" is required and must be a UTF-8 string", i)
		}
		out = append(out, RunFile{Path: path, Content: content})
	}
	return out, nil
}

// DecodeListRequest validates sandbox::list, which takes no fields.
func DecodeListRequest(raw json.RawMessage) (*ListRequest, error) {
	if _, e := newRequest(OpList, raw); e != nil {
		return nil, e
	}
	return &ListRequest{}, nil
}

// DecodeCatalogListRequest validates sandbox::catalog::list, which takes no
// fields.
func DecodeCatalogListRequest(raw json.RawMessage) (*CatalogListRequest, error) {
	if _, e := newRequest(OpCatalogList, raw); e != nil {
		return nil, e
	}
	return &CatalogListRequest{}, nil
}

// DecodeStopRequest decodes and validates sandbox::stop.
func DecodeStopRequest(raw json.RawMessage) (*StopRequest, error) {
	return result(decodeStop(raw))
}

func decodeStop(raw json.RawMessage) (*StopRequest, *Error) {
	r, e := newRequest(OpStop, raw)
	if e != nil {
		return nil, e
	}
	var q StopRequest
	if q.SandboxID, e = r.sandboxID(); e != nil {
		return nil, e
	}
	if q.Wait, e = r.boolean("wait", false); e != nil {
		return nil, e
	}
	return &q, nil
}

// fsPath starts an fs op: the sandbox id, then a required path.
func fsPath(op string, raw json.RawMessage) (*request, string, string, *Error) {
	r, e := newRequest(op, raw)
	if e != nil {
		return nil, "", "", e
	}
	id, e := r.sandboxID()
	if e != nil {
		return nil, "", "", e
	}
	path, e := r.requiredStr("path")
	if e != nil {
		return nil, "", "", e
	}
	return r, id, path, nil
}

// DecodeFsLsRequest decodes and validates sandbox::fs::ls.
func DecodeFsLsRequest(raw json.RawMessage) (*FsLsRequest, error) {
	_, id, path, e := fsPath(OpFsLs, raw)
	if e != nil {
		return nil, e
	}
	return &FsLsRequest{SandboxID: id, Path: path}, nil
}

// DecodeFsStatRequest decodes and validates sandbox::fs::stat.
func DecodeFsStatRequest(raw json.RawMessage) (*FsStatRequest, error) {
	_, id, path, e := fsPath(OpFsStat, raw)
	if e != nil {
		return nil, e
	}
	return &FsStatRequest{SandboxID: id, Path: path}, nil
}

// DecodeFsReadRequest decodes and validates sandbox::fs::read.
func DecodeFsReadRequest(raw json.RawMessage) (*FsReadRequest, error) {
	_, id, path, e := fsPath(OpFsRead, raw)
	if e != nil {
		return nil, e
	}
	return &FsReadRequest{SandboxID: id, Path: path}, nil
}

// DecodeFsMkdirRequest decodes and validates sandbox::fs::mkdir.
func DecodeFsMkdirRequest(raw json.RawMessage) (*FsMkdirRequest, error) {
	return result(decodeFsMkdir(raw))
}

func decodeFsMkdir(raw json.RawMessage) (*FsMkdirRequest, *Error) {
	r, id, path, e := fsPath(OpFsMkdir, raw)
	if e != nil {
		return nil, e
	}
	q := FsMkdirRequest{SandboxID: id, Path: path}
	if q.Mode, e = r.mode("mode", DefaultDirMode, false); e != nil {
		return nil, e
	}
	if q.Parents, e = r.boolean("parents", false); e != nil {
		return nil, e
	}
	return &q, nil
}

// DecodeFsWriteRequest decodes and validates sandbox::fs::write. Exactly one
// of content (UTF-8 text, or the read end of a channel as a
// StreamChannelRef object) and content_b64 is required.
func DecodeFsWriteRequest(raw json.RawMessage) (*FsWriteRequest, error) {
	return result(decodeFsWrite(raw))
}

func decodeFsWrite(raw json.RawMessage) (*FsWriteRequest, *Error) {
	r, id, path, e := fsPath(OpFsWrite, raw)
	if e != nil {
		return nil, e
	}
	q := FsWriteRequest{SandboxID: id, Path: path}
	if q.Mode, e = r.mode("mode", DefaultFileMode, false); e != nil {
		return nil, e
	}
	if q.Parents, e = r.boolean("parents", false); e != nil {
		return nil, e
	}
	content, hasContent := r.get("content")
	b64, hasB64, e := r.base64("content_b64")
	if e != nil {
		return nil, e
	}
	switch {
	case hasContent && hasB64:
		return nil, r.fail("pass exactly one of content and content_b64, not both")
	case !hasContent && !hasB64:
		return nil, r.fail("pass exactly one of content (UTF-8 text or a channel ref) and content_b64")
	case hasB64:
		q.Content.Inline = b64
	default:
		switch content[0] {
		case '"':
			var s string
			if err := json.Unmarshal(content, &s); err != nil {
				return nil, r.typeErr("content", "a string or a channel ref object", content)
			}
			q.Content.Inline = []byte(s)
		case '{':
			ref, e := r.channelRef(content)
			if e != nil {
				return nil, e
			}
			q.Content.Channel = ref
		default:
			return nil, r.typeErr("content", "a string or a channel ref object {channel_id, access_key, direction}", content)
		}
	}
	return &q, nil
}

// channelRef reads fs::write's streamed content. It must be the read end:
// the adapter's side reads what the caller writes.
func (r *request) channelRef(raw json.RawMessage) (*protocol.StreamChannelRef, *Error) {
	sub := &request{op: r.op, code: r.code}
	if err := json.Unmarshal(raw, &sub.fields); err != nil {
		return nil, r.typeErr("content", "a channel ref object {channel_id, access_key, direction}", raw)
	}
	var ref protocol.StreamChannelRef
	for _, f := range []struct {
		name string
		dst  *string
	}{{"channel_id", &ref.ChannelID}, {"access_key", &ref.AccessKey}, {"direction", &ref.Direction}} {
		s, ok, e := sub.str(f.name)
		if e != nil || !ok || s == "" {
			return nil, r.fail("content is an object but not a channel ref: content.%s must be a non-empty string", f.name)
		}
		*f.dst = s
	}
	if ref.Direction != protocol.DirectionRead {
		return nil, r.fail("content must be the read end of a channel (direction %q), got direction %q", protocol.DirectionRead, truncate(ref.Direction, 20))
	}
	return &ref, nil
}

// DecodeFsRmRequest decodes and validates sandbox::fs::rm.
func DecodeFsRmRequest(raw json.RawMessage) (*FsRmRequest, error) {
	return result(decodeFsRm(raw))
}

func decodeFsRm(raw json.RawMessage) (*FsRmRequest, *Error) {
	r, id, path, e := fsPath(OpFsRm, raw)
	if e != nil {
		return nil, e
	}
	q := FsRmRequest{SandboxID: id, Path: path}
	if q.Recursive, e = r.boolean("recursive", false); e != nil {
		return nil, e
	}
	return &q, nil
}

// DecodeFsChmodRequest decodes and validates sandbox::fs::chmod.
func DecodeFsChmodRequest(raw json.RawMessage) (*FsChmodRequest, error) {
	return result(decodeFsChmod(raw))
}

func decodeFsChmod(raw json.RawMessage) (*FsChmodRequest, *Error) {
	r, id, path, e := fsPath(OpFsChmod, raw)
	if e != nil {
		return nil, e
	}
	q := FsChmodRequest{SandboxID: id, Path: path}
	if q.Mode, e = r.mode("mode", 0, true); e != nil {
		return nil, e
	}
	if q.UID, e = r.u32("uid"); e != nil {
		return nil, e
	}
	if q.GID, e = r.u32("gid"); e != nil {
		return nil, e
	}
	if q.Recursive, e = r.boolean("recursive", false); e != nil {
		return nil, e
	}
	return &q, nil
}

// DecodeFsMvRequest decodes and validates sandbox::fs::mv.
func DecodeFsMvRequest(raw json.RawMessage) (*FsMvRequest, error) {
	return result(decodeFsMv(raw))
}

func decodeFsMv(raw json.RawMessage) (*FsMvRequest, *Error) {
	r, e := newRequest(OpFsMv, raw)
	if e != nil {
		return nil, e
	}
	var q FsMvRequest
	if q.SandboxID, e = r.sandboxID(); e != nil {
		return nil, e
	}
	if q.Src, e = r.requiredStr("src"); e != nil {
		return nil, e
	}
	if q.Dst, e = r.requiredStr("dst"); e != nil {
		return nil, e
	}
	if q.Overwrite, e = r.boolean("overwrite", false); e != nil {
		return nil, e
	}
	return &q, nil
}

// DecodeFsGrepRequest decodes and validates sandbox::fs::grep.
func DecodeFsGrepRequest(raw json.RawMessage) (*FsGrepRequest, error) {
	return result(decodeFsGrep(raw))
}

func decodeFsGrep(raw json.RawMessage) (*FsGrepRequest, *Error) {
	r, id, path, e := fsPath(OpFsGrep, raw)
	if e != nil {
		return nil, e
	}
	q := FsGrepRequest{SandboxID: id, Path: path}
	var ok bool
	if q.Pattern, ok, e = r.str("pattern"); e != nil {
		return nil, e
	}
	if !ok {
		return nil, r.fail("field \"pattern\" is required")
	}
	if q.Recursive, e = r.boolean("recursive", true); e != nil {
		return nil, e
	}
	if q.IgnoreCase, e = r.boolean("ignore_case", false); e != nil {
		return nil, e
	}
	if q.IncludeGlob, e = r.strings("include_glob"); e != nil {
		return nil, e
	}
	if q.ExcludeGlob, e = r.strings("exclude_glob"); e != nil {
		return nil, e
	}
	if q.MaxMatches, e = r.positiveU64("max_matches", DefaultGrepMaxMatches); e != nil {
		return nil, e
	}
	if q.MaxLineBytes, e = r.positiveU64("max_line_bytes", DefaultGrepMaxLineBytes); e != nil {
		return nil, e
	}
	if e = r.regex(q.Pattern, q.IgnoreCase); e != nil {
		return nil, e
	}
	return &q, nil
}

// DecodeFsSedRequest decodes and validates sandbox::fs::sed: exactly one of
// files (a non-empty list) and path; both or neither is S210.
func DecodeFsSedRequest(raw json.RawMessage) (*FsSedRequest, error) {
	return result(decodeFsSed(raw))
}

func decodeFsSed(raw json.RawMessage) (*FsSedRequest, *Error) {
	r, e := newRequest(OpFsSed, raw)
	if e != nil {
		return nil, e
	}
	var q FsSedRequest
	if q.SandboxID, e = r.sandboxID(); e != nil {
		return nil, e
	}
	if q.Files, e = r.strings("files"); e != nil {
		return nil, e
	}
	_, hasPath := r.get("path")
	switch {
	case len(q.Files) > 0 && hasPath:
		return nil, r.fail("pass exactly one of files and path, not both")
	case len(q.Files) == 0 && !hasPath:
		return nil, r.fail("pass exactly one of files (a list of paths) and path (a file or directory to walk)")
	case hasPath:
		if q.Path, e = r.requiredStr("path"); e != nil {
			return nil, e
		}
	}
	for i, f := range q.Files {
		if f == "" || strings.IndexByte(f, 0) >= 0 {
			return nil, r.fail("files[%d] must be a non-empty path without NUL bytes", i)
		}
	}
	if q.Recursive, e = r.boolean("recursive", true); e != nil {
		return nil, e
	}
	if q.IncludeGlob, e = r.strings("include_glob"); e != nil {
		return nil, e
	}
	if q.ExcludeGlob, e = r.strings("exclude_glob"); e != nil {
		return nil, e
	}
	if len(q.Files) > 0 && (len(q.IncludeGlob) > 0 || len(q.ExcludeGlob) > 0) {
		return nil, r.fail("include_glob and exclude_glob apply only with path, not with files")
	}
	if q.Pattern, e = r.requiredStr("pattern"); e != nil {
		return nil, e
	}
	var ok bool
	if q.Replacement, ok, e = r.str("replacement"); e != nil {
		return nil, e
	}
	if !ok {
		return nil, r.fail("field \"replacement\" is required (it may be an empty string)")
	}
	if q.Regex, e = r.boolean("regex", true); e != nil {
		return nil, e
	}
	if q.FirstOnly, e = r.boolean("first_only", false); e != nil {
		return nil, e
	}
	if q.IgnoreCase, e = r.boolean("ignore_case", false); e != nil {
		return nil, e
	}
	if q.Regex {
		if e = r.regex(q.Pattern, q.IgnoreCase); e != nil {
			return nil, e
		}
	}
	return &q, nil
}
