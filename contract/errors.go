package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/iii-sandbox/iii/protocol"
)

// Code is a stable sandbox error code such as "S211". Callers branch on it,
// so a code never changes meaning once published.
type Code string

// Every S-code of contract 1.1. S301–S303 are the router's; S501 belongs to
// the sandbox-libkrun adapter but lives here so every code has one table row
// and one docs entry.
const (
	S001 Code = "S001"
	S002 Code = "S002"
	S003 Code = "S003"
	S004 Code = "S004"
	S005 Code = "S005"
	S006 Code = "S006"
	S100 Code = "S100"
	S101 Code = "S101"
	S102 Code = "S102"
	S200 Code = "S200"
	S210 Code = "S210"
	S211 Code = "S211"
	S212 Code = "S212"
	S213 Code = "S213"
	S214 Code = "S214"
	S215 Code = "S215"
	S216 Code = "S216"
	S217 Code = "S217"
	S218 Code = "S218"
	S219 Code = "S219"
	S300 Code = "S300"
	S301 Code = "S301"
	S302 Code = "S302"
	S303 Code = "S303"
	S400 Code = "S400"
	S501 Code = "S501"
)

// Error types, the wire object's "type" field.
const (
	TypeValidation = "validation"
	TypeConfig     = "config"
	TypeInternal   = "internal"
	TypeTransient  = "transient"
	TypeExecution  = "execution"
	TypeFilesystem = "filesystem"
	TypePlatform   = "platform"
)

// DocsBase is the 0.26 Sandboxes page; every S-code has an entry there whose
// anchor is the code in lower case. docs/sandbox-errors.md mirrors it.
const DocsBase = "https://iii.dev/docs/next/creating-workers/sandboxes"

// DocsURL is the docs_url of code.
func DocsURL(code Code) string { return DocsBase + "#" + strings.ToLower(string(code)) }

// mergeFixNote is the fix_note of any error that carries a request patch in
// fix, unless its code has a more specific note.
const mergeFixNote = "merge `fix` into the original request and resubmit"

// CodeInfo is one row of the S-code table.
type CodeInfo struct {
	Code      Code
	Type      string
	Retryable bool
	// Title is the short meaning: the default message, and the title of the
	// code's docs entry.
	Title string
	// FixNote is the fix_note when fix is null: why no machine fix exists
	// and what a person or agent should do instead.
	FixNote string
	// FixedNote is the fix_note when the error carries a fix (a patch to
	// merge into the original request). Empty: mergeFixNote.
	FixedNote string
}

// Codes returns the S-code table in code order. The slice is built on each
// call so no caller can alter what another sees.
func Codes() []CodeInfo {
	return []CodeInfo{
		{S001, TypeValidation, false, "invalid request",
			"see message: it names the field and the shapes it accepts", ""},
		{S002, TypeValidation, false, "sandbox not found",
			"the sandbox id is unknown to this adapter: call sandbox::create first and use the sandbox_id it returns", ""},
		{S003, TypeValidation, false, "too many execs running in this sandbox",
			"wait for a running exec to finish, detach long-running processes (`nohup … &`), or stop the sandbox and create a new one", ""},
		{S004, TypeValidation, false, "sandbox already stopped",
			"the sandbox was stopped or reaped for idleness: call sandbox::create first", ""},
		{S005, TypeValidation, false, "sandbox is paused",
			"call sandbox::resume with the sandbox_id, then retry the operation", ""},
		{S006, TypeValidation, false, "operation not supported by the adapter",
			"the bound adapter does not announce the capability the operation needs in adapter::info: use another operation (sandbox::stop instead of sandbox::pause) or an adapter that has it", ""},
		{S100, TypeConfig, false, "image not in the catalog or not allowed",
			"set `image` to a name that sandbox::catalog::list returns, or add a custom_images entry and list it in image_allowlist in the adapter's config_override", ""},
		{S101, TypeInternal, false, "image root filesystem missing",
			"operator action: pre-pull the image on the host, or set auto_install: true in the adapter's config_override", ""},
		{S102, TypeTransient, true, "image auto-install failed",
			"transient: retry after a short delay", ""},
		{S200, TypeExecution, false, "exec timed out",
			"raise `timeout_ms` (up to the adapter's max_exec_timeout_ms) or split the work into smaller steps", ""},
		{S210, TypeFilesystem, false, "invalid filesystem request",
			"see message: it names the field; correct the request and resubmit", ""},
		{S211, TypeFilesystem, false, "path not found",
			"the path does not exist in the sandbox; check it with sandbox::fs::ls",
			"merge `fix` into the original request and resubmit: `parents: true` creates the missing parent directories"},
		{S212, TypeFilesystem, false, "wrong file type",
			"a file was found where a directory is needed, or the reverse; check the path with sandbox::fs::stat", ""},
		{S213, TypeFilesystem, false, "path already exists",
			"choose another path, remove the existing one first, or pass `overwrite: true` to sandbox::fs::mv", ""},
		{S214, TypeFilesystem, false, "directory not empty",
			"pass `recursive: true` to sandbox::fs::rm to remove the directory and its contents", ""},
		{S215, TypeFilesystem, false, "permission denied",
			"the sandbox user may not do this to the path; change its mode with sandbox::fs::chmod or use another path", ""},
		{S216, TypeFilesystem, false, "filesystem I/O error",
			"see message for the error the sandbox reported", ""},
		{S217, TypeFilesystem, false, "invalid regular expression",
			"`pattern` must be an RE2 regular expression: escape its metacharacters, or pass `regex: false` to sandbox::fs::sed for a literal match", ""},
		{S218, TypeTransient, true, "filesystem stream aborted",
			"transient: the stream channel closed mid-transfer; retry the operation", ""},
		{S219, TypeFilesystem, false, "filesystem operation not supported",
			"the adapter's guest agent does not implement this operation: upgrade the adapter", ""},
		{S300, TypePlatform, false, "sandbox VM failed to boot",
			"platform-level failure, not auto-recoverable: the message holds the VM's output and what the host is missing", ""},
		{S301, TypePlatform, true, "sandbox adapter not running",
			"start or install the adapter in the namespace the message names, then retry", ""},
		{S302, TypePlatform, false, "sandbox adapter speaks another contract major",
			"install an adapter release that implements this engine's sandbox contract major", ""},
		{S303, TypeConfig, false, "no sandbox adapter bound",
			"bind an adapter: add a top-level `sandbox:` section (adapter, namespace) to config.yaml, or start the engine with `iii compose --up`", ""},
		{S400, TypeConfig, false, "resource limit reached",
			"not auto-recoverable: stop sandboxes you no longer need, ask for fewer cpus or less memory, or raise the limit in the adapter's config_override", ""},
		{S501, TypeConfig, false, "host directory outside the adapter's host roots",
			"move the worker under the compose directory, or restart the adapter so it reads its host roots again (`iii call compose::restart worker=sandbox-libkrun`), then start the worker with `iii call compose::up`", ""},
	}
}

// LookupCode returns the table row of code.
func LookupCode(code Code) (CodeInfo, bool) {
	for _, c := range Codes() {
		if c.Code == code {
			return c, true
		}
	}
	return CodeInfo{}, false
}

// Error is a sandbox error: the JSON wire object every sandbox::* failure
// carries. Fix is a patch to merge into the original request (JSON null
// when nil); FixNote says how to apply it, or why there is none.
type Error struct {
	Type      string
	Code      Code
	Message   string
	DocsURL   string
	Retryable bool
	Fix       map[string]any
	FixNote   string
}

// Error puts the code first so logs stay greppable.
func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// NewError builds the error of code from the table. An empty format uses the
// code's title as the message. A code missing from the table still yields a
// usable error (type internal, not retryable) rather than a panic.
func NewError(code Code, format string, args ...any) *Error {
	info, ok := LookupCode(code)
	if !ok {
		info = CodeInfo{Code: code, Type: TypeInternal, Title: "sandbox error"}
	}
	msg := info.Title
	if format != "" {
		msg = fmt.Sprintf(format, args...)
	}
	return &Error{
		Type:      info.Type,
		Code:      code,
		Message:   msg,
		DocsURL:   DocsURL(code),
		Retryable: info.Retryable,
		FixNote:   info.FixNote,
	}
}

// WithFix returns a copy of e that carries fix, with the fix_note that tells
// callers to merge it into their request.
func (e *Error) WithFix(fix map[string]any) *Error {
	c := e.clone()
	c.Fix = maps.Clone(fix)
	c.FixNote = mergeFixNote
	if info, ok := LookupCode(e.Code); ok && info.FixedNote != "" {
		c.FixNote = info.FixedNote
	}
	return c
}

// WithFixNote returns a copy of e with its fix_note replaced.
func (e *Error) WithFixNote(note string) *Error {
	c := e.clone()
	c.FixNote = note
	return c
}

func (e *Error) clone() *Error {
	c := *e
	c.Fix = maps.Clone(e.Fix)
	return &c
}

// ParentsFix is S211's machine fix: resubmit with parents: true.
func ParentsFix() map[string]any { return map[string]any{"parents": true} }

// ParentNotFound is S211 for a write or mkdir whose parent directory is
// missing; it carries {"parents": true}.
func ParentNotFound(path string) *Error {
	return NewError(S211, "parent directory not found: %s", path).WithFix(ParentsFix())
}

// Run step names, as WrapRunStep reports them in fix.context.
const (
	RunStepCreate    = "create"
	RunStepWriteFile = "fs::write (sibling file)"
	RunStepWriteCode = "fs::write (code)"
	RunStepExec      = "exec"
)

// WrapRunStep reports a failed sandbox::run sub-step. The wire code, type
// and retryability stay the inner error's, so callers branch on the real
// cause; fix names the step, the sandbox (empty when none was created yet)
// and the inner code, so a caller that kept the sandbox can clean it up.
func WrapRunStep(step, sandboxID string, inner *Error) *Error {
	if inner == nil {
		inner = NewError(S300, "")
	}
	where := fmt.Sprintf("during sandbox::run step `%s`", step)
	msg := where + ": " + inner.Message
	if sandboxID != "" {
		msg = fmt.Sprintf("%s (sandbox_id=%s): %s", where, sandboxID, inner.Message)
	}
	note := "the run stopped at this step; `fix.inner_code` is the step's own code"
	if sandboxID != "" {
		note += "; if you passed keep_sandbox: true, stop `fix.sandbox_id` with sandbox::stop when done"
	}
	return &Error{
		Type:      inner.Type,
		Code:      inner.Code,
		Message:   msg,
		DocsURL:   inner.DocsURL,
		Retryable: inner.Retryable,
		Fix: map[string]any{
			"context":    where,
			"sandbox_id": sandboxID,
			"inner_code": string(inner.Code),
		},
		FixNote: note,
	}
}

// AdapterNotRunning is the router's S301: an adapter is bound but its worker
// is not connected. reason says why when known (for example the adapter
// rejected its configuration at start).
func AdapterNotRunning(adapter, namespace, reason string) *Error {
	msg := fmt.Sprintf("sandbox adapter %q is bound in namespace %q but is not running", adapter, namespace)
	if reason != "" {
		msg += ": " + reason
	}
	msg += fmt.Sprintf(". If a Compose project runs in namespace %q, add the adapter with `iii call compose::add worker=iii-sandbox`;"+
		" otherwise declare it (worker: package://%s) in a worker-compose.yaml and run `iii compose --up --namespace %s`",
		namespace, adapter, namespace)
	return NewError(S301, "%s", msg)
}

// NoAdapterBound is the router's S303.
func NoAdapterBound() *Error {
	return NewError(S303, "no sandbox adapter is bound to this engine: add a top-level `sandbox:` section to config.yaml"+
		" (sandbox: {adapter: sandbox-libkrun, namespace: default}) or start the engine with `iii compose --up`")
}

// HostRootRefused is sandbox-libkrun's S501: dir lies outside the host roots
// the adapter read when it started.
func HostRootRefused(dir string, roots []string) *Error {
	return NewError(S501, "host directory %s is outside the adapter's host roots [%s]; the adapter reads its roots only when it starts:"+
		" restart it with `iii call compose::restart worker=sandbox-libkrun`, then start the worker with `iii call compose::up`"+
		" (see %s)", dir, strings.Join(roots, ", "), DocsURL(S501))
}

// AsError returns err as a sandbox error: itself when it is (or wraps) an
// *Error, else a new error of fallback whose message is err's text, so
// every failure a caller sees carries a stable code.
func AsError(err error, fallback Code) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return NewError(fallback, "%s", err.Error())
}

// IsCode reports whether err is (or wraps) a sandbox error of code.
func IsCode(err error, code Code) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// wireError is the JSON wire object, field order as users see it.
type wireError struct {
	Type      string         `json:"type"`
	Code      Code           `json:"code"`
	Message   string         `json:"message"`
	DocsURL   string         `json:"docs_url"`
	Retryable bool           `json:"retryable"`
	Fix       map[string]any `json:"fix"`
	FixNote   *string        `json:"fix_note"`
}

// MarshalJSON writes the wire object.
func (e *Error) MarshalJSON() ([]byte, error) {
	w := wireError{Type: e.Type, Code: e.Code, Message: e.Message, DocsURL: e.DocsURL, Retryable: e.Retryable, Fix: e.Fix}
	if e.FixNote != "" {
		w.FixNote = &e.FixNote
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// Messages quote commands like `nohup … &`; escaping & and < would
	// only make them harder to read.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(w); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// UnmarshalJSON reads a wire object; it accepts a null fix_note, which
// upstream adapters send when they have no note.
func (e *Error) UnmarshalJSON(data []byte) error {
	var w wireError
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	*e = Error{Type: w.Type, Code: w.Code, Message: w.Message, DocsURL: w.DocsURL, Retryable: w.Retryable, Fix: w.Fix}
	if w.FixNote != nil {
		e.FixNote = *w.FixNote
	}
	return nil
}

// ToWire is the JSON wire object, the invocation error's message.
func (e *Error) ToWire() []byte {
	b, err := e.MarshalJSON()
	if err != nil {
		// Only a fix value JSON cannot encode (a channel, a NaN) gets
		// here; drop the fix rather than lose the error.
		c := e.clone()
		c.Fix = nil
		b, _ = c.MarshalJSON()
	}
	return b
}

// ErrorBody is how the error reaches callers: the invocation error's code
// is the S-code and its message is the wire JSON.
func (e *Error) ErrorBody() *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: string(e.Code), Message: string(e.ToWire())}
}

// isSandboxCode reports whether s has the shape of an S-code: "S" and
// three digits. Adapters may add codes of their own (S501), so the shape,
// not the table, decides.
func isSandboxCode(s string) bool {
	if len(s) != 4 || s[0] != 'S' {
		return false
	}
	for _, c := range s[1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// ParseWire reads a sandbox error out of an invocation error message. It
// tolerates a prefix such as "handler error: " (upstream SDKs add one) and
// trailing text, by decoding the first JSON value from the first '{'. It
// reports false when the message holds no sandbox error object.
func ParseWire(message string) (*Error, bool) {
	i := strings.IndexByte(message, '{')
	if i < 0 {
		return nil, false
	}
	dec := json.NewDecoder(strings.NewReader(message[i:]))
	var e Error
	if err := dec.Decode(&e); err != nil {
		return nil, false
	}
	if !isSandboxCode(string(e.Code)) {
		return nil, false
	}
	return &e, true
}

// FromErrorBody reads the sandbox error of an invocation error body.
func FromErrorBody(b *protocol.ErrorBody) (*Error, bool) {
	if b == nil {
		return nil, false
	}
	return ParseWire(b.Message)
}
