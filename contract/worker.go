package contract

import (
	"context"
	"github.com/iii-sandbox/iii/internal/lazyre"
)

// Worker VMs (<adapter>::worker::*): the six functions through which
// Compose boots its VM workers (registry bundles, and path:// workers with
// runtime.base_image) in an adapter that announces CapabilityWorker. They
// are not part of the sandbox router: nothing is served as
// sandbox::worker::*, callers address the adapter directly.
// docs/vm-workers.md describes them for people.

// Worker operation names, as they follow "<adapter>::".
const (
	OpWorkerStart  = "worker::start"
	OpWorkerStop   = "worker::stop"
	OpWorkerStatus = "worker::status"
	OpWorkerList   = "worker::list"
	OpWorkerLogs   = "worker::logs"
	OpWorkerRemove = "worker::remove"
)

// CapabilityWorker is the adapter::info capability of an adapter that
// serves the worker::* functions. Hosts publish those functions only for
// adapters that announce it.
const CapabilityWorker = "worker"

// WorkerOps returns the six worker operations in their documented order.
func WorkerOps() []string {
	return []string{OpWorkerStart, OpWorkerStop, OpWorkerStatus, OpWorkerList, OpWorkerLogs, OpWorkerRemove}
}

// IsWorkerOp reports whether op is one of the worker operations.
func IsWorkerOp(op string) bool {
	switch op {
	case OpWorkerStart, OpWorkerStop, OpWorkerStatus, OpWorkerList, OpWorkerLogs, OpWorkerRemove:
		return true
	}
	return false
}

// WorkerAdapter is implemented by adapters that run worker VMs. Requests
// arrive decoded and validated (DecodeWorker*); failures should be *Error
// values (S001 invalid request, S002 unknown vm_id, S501 host directory
// outside the host roots, S101/S102 image, S300 boot, S400 limits).
type WorkerAdapter interface {
	WorkerStart(ctx context.Context, req *WorkerStartRequest) (*WorkerStartResponse, error)
	WorkerStop(ctx context.Context, req *WorkerStopRequest) (*WorkerStatus, error)
	WorkerStatus(ctx context.Context, req *WorkerStatusRequest) (*WorkerStatus, error)
	WorkerList(ctx context.Context, req *WorkerListRequest) (*WorkerListResponse, error)
	WorkerLogs(ctx context.Context, req *WorkerLogsRequest) (*WorkerLogsResponse, error)
	WorkerRemove(ctx context.Context, req *WorkerRemoveRequest) (*WorkerRemoveResponse, error)
}

// Worker states, as worker::status reports them.
const (
	// WorkerStarting: the VM boots, the workspace is copied or the
	// install command runs.
	WorkerStarting = "starting"
	// WorkerRunning: the command runs.
	WorkerRunning = "running"
	// WorkerExited: the command exited with status 0 on its own.
	WorkerExited = "exited"
	// WorkerFailed: the command exited with another status or was killed,
	// or the start failed (last_error says why).
	WorkerFailed = "failed"
	// WorkerStopped: worker::stop (or the adapter's shutdown) ended it,
	// or it has not run since the adapter started.
	WorkerStopped = "stopped"
)

// Limits of worker requests.
const (
	// MaxVMIDLen bounds vm_id: the VM's agent socket lives at
	// <state_dir>/workers/<vm_id>/exec.sock and unix socket paths are
	// short.
	MaxVMIDLen = 48
	// MaxWorkerInclude bounds worker::start's include.
	MaxWorkerInclude = 64
	// DefaultWorkerStopTimeoutMS is worker::stop's grace between SIGTERM
	// and SIGKILL, Compose's default stop_timeout.
	DefaultWorkerStopTimeoutMS uint64 = 10_000
	// MaxWorkerStopTimeoutMS bounds that grace.
	MaxWorkerStopTimeoutMS uint64 = 600_000
	// DefaultWorkerLogsTail and MaxWorkerLogsTail bound worker::logs.
	DefaultWorkerLogsTail uint64 = 100
	MaxWorkerLogsTail     uint64 = 1000
	// MaxWorkerConfigBytes bounds the config file published in the guest.
	MaxWorkerConfigBytes = 4 << 20
	// WorkerConfigDir is where the guest finds the published config file;
	// III_CONFIG names <WorkerConfigDir>/<file_name>.
	WorkerConfigDir = "/run/iii/config"
	// DefaultWorkerWorkdir is where the host directory is copied and the
	// command runs unless workdir says otherwise.
	DefaultWorkerWorkdir = "/workspace"
)

// vmIDRE is what a vm_id may look like: a single path element of lower-case
// letters, digits, '.', '_' and '-', starting with a letter or digit (so
// never "." or ".."). Lower case only, so two ids never share one state
// directory on a case-insensitive filesystem.
var vmIDRE = lazyre.New(`^[a-z0-9][a-z0-9._-]*$`)

// ValidVMID reports whether id is a vm_id the contract accepts.
func ValidVMID(id string) bool { return len(id) <= MaxVMIDLen && vmIDRE.MatchString(id) }

// configFileRE is what a published config file may be called.
var configFileRE = lazyre.New(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

// WorkerConfigFile is the worker's resolved configuration, published in the
// guest at /run/iii/config/<FileName> (and named by III_CONFIG).
type WorkerConfigFile struct {
	FileName string `json:"file_name"`
	Content  string `json:"content"`
}

// WorkerStartRequest is worker::start. VMID is the caller's choice and
// names the worker's state directory; Env is "K=V" entries, map-shaped
// input sorted by key.
type WorkerStartRequest struct {
	VMID      string `json:"vm_id"`
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	// Image is a catalog name or any OCI reference.
	Image string `json:"image"`
	// HostDir is the host directory copied into the guest's /workspace;
	// it must lie under one of the adapter's host roots (S501).
	HostDir string `json:"host_dir"`
	// Workdir is where install and command run: an absolute guest path,
	// or a path relative to /workspace. Empty means /workspace.
	Workdir string `json:"workdir,omitempty"`
	// Install runs once per persistent disk (and again when it changes).
	Install   string            `json:"install,omitempty"`
	Command   string            `json:"command"`
	Env       []string          `json:"env"`
	Config    *WorkerConfigFile `json:"config,omitempty"`
	CPUs      *uint32           `json:"cpus,omitempty"`
	MemoryMB  *uint32           `json:"memory_mb,omitempty"`
	EngineURL string            `json:"engine_url"`
	// Exclude lists further host paths under HostDir that the copy leaves
	// out (for example a Compose state directory moved there with
	// III_COMPOSE_STATE_DIR).
	Exclude []string `json:"exclude,omitempty"`
	// Include names top-level entries of HostDir that the adapter's copy
	// would leave out by default (for sandbox-libkrun: node_modules, dist,
	// …) and copies all the same, e.g. vendored dependencies. Plain names,
	// never .iii; an adapter refuses a name it does not leave out (S001).
	Include []string `json:"include,omitempty"`
	// Wait makes the call return only once the command runs (or the
	// start failed, which is then the call's error).
	Wait bool `json:"wait,omitempty"`
	// EngineCredential is a credential the engine issued for this worker
	// (engine::credentials::issue: its project's namespace, never a
	// privileged function). The adapter presents it, from the host side,
	// on the worker's connection to engine_url; it never enters the VM,
	// and adapters must not put it in the guest's environment.
	EngineCredential string `json:"engine_credential,omitempty"`
}

// WorkerStartResponse is worker::start's reply. PID is the command's pid in
// the guest, once it runs.
type WorkerStartResponse struct {
	VMID  string `json:"vm_id"`
	State string `json:"state"`
	PID   *int   `json:"pid,omitempty"`
}

// WorkerStopRequest is worker::stop: SIGTERM, TimeoutMS of grace, SIGKILL,
// then the VM powers off. Its state directory stays.
type WorkerStopRequest struct {
	VMID      string `json:"vm_id"`
	TimeoutMS uint64 `json:"timeout_ms"`
}

// WorkerStatusRequest is worker::status.
type WorkerStatusRequest struct {
	VMID string `json:"vm_id"`
}

// WorkerStatus describes one worker VM (worker::status, an item of
// worker::list, worker::stop's reply).
type WorkerStatus struct {
	VMID      string `json:"vm_id"`
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	Image     string `json:"image,omitempty"`
	State     string `json:"state"`
	PID       *int   `json:"pid,omitempty"`
	ExitCode  *int   `json:"exit_code,omitempty"`
	// StartedAt is when the command last started, RFC 3339.
	StartedAt string `json:"started_at,omitempty"`
	// Restarts counts the starts after the first one since the state
	// directory was made.
	Restarts  uint64 `json:"restarts"`
	LastError string `json:"last_error,omitempty"`
	StateDir  string `json:"state_dir,omitempty"`
}

// WorkerListRequest is worker::list; it has no fields.
type WorkerListRequest struct{}

// WorkerListResponse lists every worker the adapter keeps state for, by
// vm_id.
type WorkerListResponse struct {
	Workers []WorkerStatus `json:"workers"`
}

// MarshalJSON writes an empty list as [].
func (r WorkerListResponse) MarshalJSON() ([]byte, error) {
	type plain WorkerListResponse
	if r.Workers == nil {
		r.Workers = []WorkerStatus{}
	}
	return EncodeJSON(plain(r))
}

// WorkerLogsRequest is worker::logs. Without Cursor the last Tail entries
// come back; with it, up to Tail entries after the one Cursor names.
type WorkerLogsRequest struct {
	VMID   string  `json:"vm_id"`
	Tail   uint64  `json:"tail"`
	Cursor *uint64 `json:"cursor,omitempty"`
}

// Log streams of worker::logs entries.
const (
	LogStdout = "stdout"
	LogStderr = "stderr"
	// LogSystem holds what the adapter says about the worker: boot,
	// install and exit.
	LogSystem = "system"
)

// WorkerLogEntry is one line the worker (or the adapter, on stream system)
// wrote. Seq grows by one per entry over the worker's whole life.
type WorkerLogEntry struct {
	Seq     uint64 `json:"seq"`
	Time    string `json:"time"`
	Stream  string `json:"stream"`
	Message string `json:"message"`
}

// WorkerLogsResponse is worker::logs's reply. Cursor is the seq of the last
// entry returned (the request's cursor when none was); Truncated says older
// entries exist that were not returned; More says newer entries follow this
// page (only with a cursor).
type WorkerLogsResponse struct {
	VMID      string           `json:"vm_id"`
	Entries   []WorkerLogEntry `json:"entries"`
	Cursor    uint64           `json:"cursor"`
	Truncated bool             `json:"truncated"`
	More      bool             `json:"more"`
}

// MarshalJSON writes no entries as [].
func (r WorkerLogsResponse) MarshalJSON() ([]byte, error) {
	type plain WorkerLogsResponse
	if r.Entries == nil {
		r.Entries = []WorkerLogEntry{}
	}
	return EncodeJSON(plain(r))
}

// WorkerRemoveRequest is worker::remove: stop the worker and delete its
// state directory.
type WorkerRemoveRequest struct {
	VMID string `json:"vm_id"`
}

// WorkerRemoveResponse is worker::remove's reply. Removed is false when
// there was nothing to remove.
type WorkerRemoveResponse struct {
	VMID     string `json:"vm_id"`
	Removed  bool   `json:"removed"`
	StateDir string `json:"state_dir"`
}

// UnknownWorker is S002 for a vm_id the adapter keeps no state for.
func UnknownWorker(vmID string) *Error {
	return NewError(S002, "no worker VM with vm_id %q: start it with worker::start first", vmID).
		WithFixNote("the vm_id is unknown to this adapter: worker::list shows the ones it keeps state for")
}
