package contract

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"strings"
	"unicode/utf8"

	"github.com/iii-sandbox/iii/internal/sandboxfs"
	"github.com/iii-sandbox/iii/protocol"
)

// Request-level defaults (spec §7.2). The decoders apply them, so an
// adapter always sees a resolved value.
const (
	DefaultExecTimeoutMS    uint64 = 300_000
	DefaultDirMode          Mode   = 0o755
	DefaultFileMode         Mode   = 0o644
	DefaultGrepMaxMatches   uint64 = 10_000
	DefaultGrepMaxLineBytes uint64 = 4096
)

// Adapter-configuration defaults (spec §7.3). Absent create fields (cpus,
// memory_mb, idle_timeout_secs) fall back to the adapter's configured
// values, which default to these.
const (
	DefaultCPUs                        uint32 = 1
	DefaultMemoryMB                    uint32 = 512
	DefaultIdleTimeoutSecs             uint64 = 300
	DefaultMaxConcurrentSandboxes      uint32 = 32
	DefaultMaxConcurrentExecPerSandbox uint32 = 4
	DefaultMaxExecTimeoutMS            uint64 = 300_000
)

// Size limits that shape replies.
const (
	// ExecOutputCap is the per-stream cap on exec and run output;
	// stdout_truncated/stderr_truncated report that it was hit.
	ExecOutputCap = 1 << 20
	// InlineBodyLimit: fs::read inlines the file as "body" only when it
	// is smaller than this and valid UTF-8.
	InlineBodyLimit = 1 << 20
)

// Mode is a Unix permission value (the low twelve bits: permissions plus
// setuid, setgid and sticky). It travels in JSON as a "0644"-style octal
// string.
type Mode uint32

// maxMode is the largest mode the contract accepts: every permission bit
// plus setuid, setgid and sticky.
const maxMode = 0o7777

// String renders m as four or more octal digits with a leading zero, the
// way ls and chmod users read modes.
func (m Mode) String() string { return fmt.Sprintf("%04o", uint32(m)&maxMode) }

// MarshalJSON writes m as an octal string.
func (m Mode) MarshalJSON() ([]byte, error) { return json.Marshal(m.String()) }

// UnmarshalJSON reads an octal string.
func (m *Mode) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("mode must be an octal string such as \"0644\"")
	}
	v, err := ParseMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// ParseMode reads an octal mode string: "0644", "644", "0o644" or
// "4755". Values above 07777 are refused: the contract carries permission
// bits, not file types.
func ParseMode(s string) (Mode, error) {
	digits := s
	if strings.HasPrefix(digits, "0o") || strings.HasPrefix(digits, "0O") {
		digits = digits[2:]
	}
	if digits == "" || len(digits) > 6 {
		return 0, fmt.Errorf("mode %q is not an octal string such as \"0644\"", s)
	}
	var v uint32
	for _, c := range digits {
		if c < '0' || c > '7' {
			return 0, fmt.Errorf("mode %q is not an octal string such as \"0644\"", s)
		}
		v = v*8 + uint32(c-'0')
	}
	if v > maxMode {
		return 0, fmt.Errorf("mode %q is above 07777", s)
	}
	return Mode(v), nil
}

// ModeFromFileMode converts Go's fs.FileMode, whose setuid/setgid/sticky
// bits are not the Unix ones, into a contract Mode.
func ModeFromFileMode(fm fs.FileMode) Mode { return Mode(sandboxfs.UnixMode(fm)) }

// CreateRequest is sandbox::create. Nil CPUs, MemoryMB and IdleTimeoutSecs
// mean "the adapter's configured default".
type CreateRequest struct {
	Image           string   `json:"image"`
	CPUs            *uint32  `json:"cpus,omitempty"`
	MemoryMB        *uint32  `json:"memory_mb,omitempty"`
	Name            string   `json:"name,omitempty"`
	Network         bool     `json:"network"`
	IdleTimeoutSecs *uint64  `json:"idle_timeout_secs,omitempty"`
	Env             []string `json:"env"`
	// Progress is the write end of the channel the caller watches the
	// create in (see ProgressEvent); nil when it did not ask. The host
	// consumes it: adapters report through ReportProgress and never see
	// the channel.
	Progress *protocol.StreamChannelRef `json:"progress,omitempty"`
}

// CreateResponse is sandbox::create's reply.
type CreateResponse struct {
	SandboxID string `json:"sandbox_id"`
	Image     string `json:"image"`
}

// ExecRequest is sandbox::exec after shape resolution: whichever of the
// three request shapes the caller used, Argv holds the binary and its
// arguments, so adapters never re-split a command. Marshalled back to JSON
// it uses the argv shape, which decodes to the same request.
type ExecRequest struct {
	SandboxID string   `json:"sandbox_id"`
	Argv      []string `json:"argv"`
	// Stdin is piped to the process; JSON carries it as base64.
	Stdin []byte `json:"stdin,omitempty"`
	// Env is "K=V" entries merged over the sandbox's boot environment;
	// a map in the request arrives here sorted by key.
	Env       []string `json:"env"`
	TimeoutMS uint64   `json:"timeout_ms"`
	// Workdir empty means the image's default working directory.
	Workdir string `json:"workdir,omitempty"`
}

// ExecResponse is sandbox::exec's reply (contract 1.1). ExitCode is nil
// (JSON null) when the process did not exit normally, e.g. killed by a
// signal. Success is exit_code == 0 && !timed_out.
type ExecResponse struct {
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	ExitCode        *int   `json:"exit_code"`
	TimedOut        bool   `json:"timed_out"`
	DurationMS      uint64 `json:"duration_ms"`
	Success         bool   `json:"success"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
}

// ExecSuccess is the contract's definition of an exec reply's success.
func ExecSuccess(exitCode *int, timedOut bool) bool {
	return exitCode != nil && *exitCode == 0 && !timedOut
}

// RunFile is a UTF-8 file sandbox::run writes before the code.
type RunFile struct {
	Path    string `json:"path"`
	Content string `json:"content"`
}

// RunRequest is sandbox::run.
type RunRequest struct {
	Image       string    `json:"image"`
	Code        string    `json:"code"`
	Lang        string    `json:"lang"`
	Files       []RunFile `json:"files"`
	Env         []string  `json:"env"`
	Stdin       []byte    `json:"stdin,omitempty"`
	TimeoutMS   uint64    `json:"timeout_ms"`
	KeepSandbox bool      `json:"keep_sandbox"`
	// Progress is as in CreateRequest: the sandbox's boot is reported.
	Progress *protocol.StreamChannelRef `json:"progress,omitempty"`
}

// RunResponse is sandbox::run's reply: exec's keys, plus sandbox_id only
// when the request kept the sandbox.
type RunResponse struct {
	ExecResponse
	SandboxID string `json:"sandbox_id,omitempty"`
}

// RunInterpreter maps sandbox::run's lang to the interpreter that runs the
// code and the file the code is written to. Any lang the contract does not
// name is taken as a literal interpreter path, run on /tmp/run.txt.
func RunInterpreter(lang string) (interpreter, file string) {
	switch lang {
	case "node", "js", "javascript":
		return "node", "/tmp/run.js"
	case "python", "py":
		return "python3", "/tmp/run.py"
	case "shell", "sh", "bash":
		return "/bin/sh", "/tmp/run.sh"
	}
	return lang, "/tmp/run.txt"
}

// ListRequest is sandbox::list; it has no fields.
type ListRequest struct{}

// ListEntry describes one live sandbox.
type ListEntry struct {
	SandboxID      string `json:"sandbox_id"`
	Name           string `json:"name,omitempty"`
	Image          string `json:"image"`
	AgeSecs        uint64 `json:"age_secs"`
	ExecInProgress bool   `json:"exec_in_progress"`
	ExecInFlight   uint32 `json:"exec_in_flight"`
	ExecSlotsFree  uint32 `json:"exec_slots_free"`
	Stopped        bool   `json:"stopped"`
	// Paused: sandbox::pause paused the sandbox (adapters with the
	// pause capability); exec and fs answer S005 until sandbox::resume.
	Paused bool `json:"paused,omitempty"`
	// HostName is the sandbox host that holds the sandbox, which the
	// router adds to every entry of sandbox::list when the binding is a
	// fleet (docs/scale-out.md). Adapters leave it empty.
	HostName string `json:"host_name,omitempty"`
}

// ListResponse is sandbox::list's reply: an object, never a bare array.
type ListResponse struct {
	Sandboxes []ListEntry `json:"sandboxes"`
}

// MarshalJSON writes an empty list as [] so the key is always an array.
func (r ListResponse) MarshalJSON() ([]byte, error) {
	type plain ListResponse
	if r.Sandboxes == nil {
		r.Sandboxes = []ListEntry{}
	}
	return EncodeJSON(plain(r))
}

// StopRequest is sandbox::stop. Wait blocks until the VM has exited.
type StopRequest struct {
	SandboxID string `json:"sandbox_id"`
	Wait      bool   `json:"wait"`
}

// StopResponse is sandbox::stop's reply.
type StopResponse struct {
	SandboxID string `json:"sandbox_id"`
	Stopped   bool   `json:"stopped"`
}

// CatalogListRequest is sandbox::catalog::list; it has no fields.
type CatalogListRequest struct{}

// Catalog image kinds.
const (
	KindPreset = "preset"
	KindCustom = "custom"
)

// CatalogImage is one image a sandbox may be created from.
type CatalogImage struct {
	Name   string `json:"name"`
	OCIRef string `json:"oci_ref"`
	Kind   string `json:"kind"`
}

// CatalogListResponse lists presets first, in their fixed order, then
// custom images sorted by name.
type CatalogListResponse struct {
	Images []CatalogImage `json:"images"`
}

// MarshalJSON writes an empty catalog as [].
func (r CatalogListResponse) MarshalJSON() ([]byte, error) {
	type plain CatalogListResponse
	if r.Images == nil {
		r.Images = []CatalogImage{}
	}
	return EncodeJSON(plain(r))
}

// FsEntry describes one path. Symlinks are not followed: IsSymlink reports
// the link itself. Mtime is in Unix seconds.
type FsEntry struct {
	Name      string `json:"name"`
	IsDir     bool   `json:"is_dir"`
	Size      uint64 `json:"size"`
	Mode      Mode   `json:"mode"`
	Mtime     int64  `json:"mtime"`
	IsSymlink bool   `json:"is_symlink"`
}

// FsLsRequest is sandbox::fs::ls.
type FsLsRequest struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path"`
}

// FsLsResponse is sandbox::fs::ls's reply.
type FsLsResponse struct {
	Entries []FsEntry `json:"entries"`
}

// MarshalJSON writes an empty directory as [].
func (r FsLsResponse) MarshalJSON() ([]byte, error) {
	type plain FsLsResponse
	if r.Entries == nil {
		r.Entries = []FsEntry{}
	}
	return EncodeJSON(plain(r))
}

// FsStatRequest is sandbox::fs::stat; the reply is an FsEntry.
type FsStatRequest struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path"`
}

// FsMkdirRequest is sandbox::fs::mkdir.
type FsMkdirRequest struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path"`
	Mode      Mode   `json:"mode"`
	Parents   bool   `json:"parents"`
}

// FsMkdirResponse is sandbox::fs::mkdir's reply.
type FsMkdirResponse struct {
	Created bool `json:"created"`
}

// WriteContent is where fs::write's bytes come from: inline (the request's
// UTF-8 "content" or decoded "content_b64"), or a channel the caller
// streams into. The host resolves it into the io.Reader the adapter gets.
type WriteContent struct {
	Inline  []byte
	Channel *protocol.StreamChannelRef
}

// FsWriteRequest is sandbox::fs::write. Content never crosses to the
// adapter inside the request: the adapter receives it as a stream.
type FsWriteRequest struct {
	SandboxID string
	Path      string
	Mode      Mode
	Parents   bool
	Content   WriteContent
}

// MarshalJSON writes the request the way iii callers send it: a channel
// ref or UTF-8 text as "content", any other bytes as "content_b64".
func (r FsWriteRequest) MarshalJSON() ([]byte, error) {
	w := struct {
		SandboxID  string `json:"sandbox_id"`
		Path       string `json:"path"`
		Mode       Mode   `json:"mode"`
		Parents    bool   `json:"parents"`
		Content    any    `json:"content,omitempty"`
		ContentB64 []byte `json:"content_b64,omitempty"`
	}{SandboxID: r.SandboxID, Path: r.Path, Mode: r.Mode, Parents: r.Parents}
	switch {
	case r.Content.Channel != nil:
		w.Content = r.Content.Channel
	case utf8.Valid(r.Content.Inline):
		w.Content = string(r.Content.Inline)
	default:
		w.ContentB64 = r.Content.Inline
	}
	return EncodeJSON(w)
}

// FsWriteResponse is sandbox::fs::write's reply.
type FsWriteResponse struct {
	BytesWritten uint64 `json:"bytes_written"`
	Path         string `json:"path"`
}

// FsReadRequest is sandbox::fs::read.
type FsReadRequest struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path"`
}

// FsReadMeta is what an adapter reports about a file before its bytes.
type FsReadMeta struct {
	Size  uint64 `json:"size"`
	Mode  Mode   `json:"mode"`
	Mtime int64  `json:"mtime"`
}

// FsReadResponse is sandbox::fs::read's reply. Content is always the read
// end of a channel carrying the file; Body inlines it when it is small and
// valid UTF-8 (see InlineBody).
type FsReadResponse struct {
	Content protocol.StreamChannelRef `json:"content"`
	Body    *string                   `json:"body,omitempty"`
	Size    uint64                    `json:"size"`
	Mode    Mode                      `json:"mode"`
	Mtime   int64                     `json:"mtime"`
}

// InlineBody returns data as fs::read's body when the contract inlines it:
// smaller than InlineBodyLimit and valid UTF-8.
func InlineBody(data []byte) *string {
	if len(data) >= InlineBodyLimit || !utf8.Valid(data) {
		return nil
	}
	s := string(data)
	return &s
}

// FsRmRequest is sandbox::fs::rm.
type FsRmRequest struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
}

// FsRmResponse is sandbox::fs::rm's reply.
type FsRmResponse struct {
	Removed bool `json:"removed"`
}

// FsChmodRequest is sandbox::fs::chmod. Nil UID/GID leave the owner as is.
type FsChmodRequest struct {
	SandboxID string  `json:"sandbox_id"`
	Path      string  `json:"path"`
	Mode      Mode    `json:"mode"`
	UID       *uint32 `json:"uid,omitempty"`
	GID       *uint32 `json:"gid,omitempty"`
	Recursive bool    `json:"recursive"`
}

// FsChmodResponse is sandbox::fs::chmod's reply: how many paths changed.
type FsChmodResponse struct {
	Updated uint64 `json:"updated"`
}

// FsMvRequest is sandbox::fs::mv.
type FsMvRequest struct {
	SandboxID string `json:"sandbox_id"`
	Src       string `json:"src"`
	Dst       string `json:"dst"`
	Overwrite bool   `json:"overwrite"`
}

// FsMvResponse is sandbox::fs::mv's reply.
type FsMvResponse struct {
	Moved bool `json:"moved"`
}

// FsGrepRequest is sandbox::fs::grep. Pattern is RE2; the globs are
// gitignore-style and relative to Path.
type FsGrepRequest struct {
	SandboxID    string   `json:"sandbox_id"`
	Path         string   `json:"path"`
	Pattern      string   `json:"pattern"`
	Recursive    bool     `json:"recursive"`
	IgnoreCase   bool     `json:"ignore_case"`
	IncludeGlob  []string `json:"include_glob"`
	ExcludeGlob  []string `json:"exclude_glob"`
	MaxMatches   uint64   `json:"max_matches"`
	MaxLineBytes uint64   `json:"max_line_bytes"`
}

// GrepMatch is one matching line. Line is 1-based; Content is cut at
// max_line_bytes and then ends in "…".
type GrepMatch struct {
	Path    string `json:"path"`
	Line    uint64 `json:"line"`
	Content string `json:"content"`
}

// FsGrepResponse is sandbox::fs::grep's reply; Truncated reports that
// max_matches stopped the search.
type FsGrepResponse struct {
	Matches   []GrepMatch `json:"matches"`
	Truncated bool        `json:"truncated"`
}

// MarshalJSON writes no matches as [].
func (r FsGrepResponse) MarshalJSON() ([]byte, error) {
	type plain FsGrepResponse
	if r.Matches == nil {
		r.Matches = []GrepMatch{}
	}
	return EncodeJSON(plain(r))
}

// FsSedRequest is sandbox::fs::sed: exactly one of Files and Path is set
// (the decoder enforces it). The globs apply in path mode only.
type FsSedRequest struct {
	SandboxID   string   `json:"sandbox_id"`
	Files       []string `json:"files,omitempty"`
	Path        string   `json:"path,omitempty"`
	Recursive   bool     `json:"recursive"`
	IncludeGlob []string `json:"include_glob"`
	ExcludeGlob []string `json:"exclude_glob"`
	Pattern     string   `json:"pattern"`
	Replacement string   `json:"replacement"`
	Regex       bool     `json:"regex"`
	FirstOnly   bool     `json:"first_only"`
	IgnoreCase  bool     `json:"ignore_case"`
}

// SedResult is the outcome for one file; Error is set when Success is false.
type SedResult struct {
	Path         string `json:"path"`
	Replacements uint64 `json:"replacements"`
	Success      bool   `json:"success"`
	Error        string `json:"error,omitempty"`
}

// FsSedResponse is sandbox::fs::sed's reply.
type FsSedResponse struct {
	Results           []SedResult `json:"results"`
	TotalReplacements uint64      `json:"total_replacements"`
}

// MarshalJSON writes no results as [].
func (r FsSedResponse) MarshalJSON() ([]byte, error) {
	type plain FsSedResponse
	if r.Results == nil {
		r.Results = []SedResult{}
	}
	return EncodeJSON(plain(r))
}

// AdapterInfo is <adapter>::adapter::info. Facts are back-end facts (the
// hypervisor chosen, the accelerator, ...) that appear as extra top-level
// keys; a fact named like a fixed key is dropped, the fixed key wins.
type AdapterInfo struct {
	Adapter        string
	AdapterVersion string
	Contract       ContractVersion
	// Capabilities lists optional function sets the adapter serves
	// beyond the contract's sixteen operations (CapabilityWorker); the
	// key is left out when there are none.
	Capabilities []string
	Facts        map[string]any
}

// HasCapability reports whether the adapter announces capability c.
func (a *AdapterInfo) HasCapability(c string) bool {
	for _, have := range a.Capabilities {
		if have == c {
			return true
		}
	}
	return false
}

// reservedInfoKeys are adapter::info's fixed keys.
func isReservedInfoKey(k string) bool {
	return k == "adapter" || k == "adapter_version" || k == "contract" || k == "capabilities"
}

// MarshalJSON writes the fixed keys and the facts as one flat object.
func (a AdapterInfo) MarshalJSON() ([]byte, error) {
	out := make(map[string]any, len(a.Facts)+3)
	for k, v := range a.Facts {
		if !isReservedInfoKey(k) {
			out[k] = v
		}
	}
	out["adapter"] = a.Adapter
	out["adapter_version"] = a.AdapterVersion
	out["contract"] = a.Contract
	if len(a.Capabilities) > 0 {
		out["capabilities"] = a.Capabilities
	}
	return EncodeJSON(out)
}

// UnmarshalJSON splits the flat object into the fixed keys and the facts.
func (a *AdapterInfo) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	var out AdapterInfo
	for k, v := range raw {
		var err error
		switch k {
		case "adapter":
			err = json.Unmarshal(v, &out.Adapter)
		case "adapter_version":
			err = json.Unmarshal(v, &out.AdapterVersion)
		case "contract":
			err = json.Unmarshal(v, &out.Contract)
		case "capabilities":
			err = json.Unmarshal(v, &out.Capabilities)
		default:
			var f any
			err = json.Unmarshal(v, &f)
			if out.Facts == nil {
				out.Facts = map[string]any{}
			}
			out.Facts[k] = f
		}
		if err != nil {
			return fmt.Errorf("adapter::info key %q: %w", k, err)
		}
	}
	*a = out
	return nil
}

// EncodeJSON marshals a reply the way the contract's JSON is written:
// without HTML escaping, so output such as "a && b" reads as it was.
func EncodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}
