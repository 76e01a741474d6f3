package sandboxkit

import (
	"context"
	"encoding/json"
	"io"
	"time"

	"github.com/iii-sandbox/iii/contract"
)

// Provider is the back end of an adapter: what only it knows how to do.
// Everything the contract says about validation, limits, the catalog, the
// reaper, run and error codes lives in the Manager, so every adapter built
// on the kit behaves the same way.
type Provider interface {
	// Presets are the back end's built-in images, in catalog order. Their
	// Kind is set to preset by the kit. Names must be unique.
	Presets() []contract.CatalogImage
	// Configure receives the configuration keys the kit does not own:
	// those named in Options.ProviderConfigKeys that the host set, raw.
	// It is called once, before any Boot, even when the map is empty, so
	// the provider can apply its defaults. An error rejects the whole
	// configuration; its text is what the operator reads.
	Configure(ctx context.Context, providerKeys map[string]json.RawMessage) error
	// Info returns back-end facts for adapter::info (the isolation
	// model, the hypervisor chosen, ...).
	Info(ctx context.Context) map[string]any
	// Boot starts a sandbox. A *contract.Error keeps its code (S101,
	// S102, S300); any other error is reported as S300. A caller may be
	// watching: report the slow parts (an image pull, the VM starting)
	// with ReportProgress(ctx, ...). The kit fills in the image and
	// reports ready itself once Boot returns a sandbox.
	Boot(ctx context.Context, spec BootSpec) (Sandbox, error)
}

// KitConfigurer is an optional Provider extension, for a provider whose
// own keys refer to the kit's configuration (a warm pool names catalog
// images and boots them in the default shape): the Manager calls
// ConfigureKit with the parsed configuration and the catalog just before
// Configure. Neither may be modified.
type KitConfigurer interface {
	ConfigureKit(cfg *Config, catalog []contract.CatalogImage)
}

// BootSpec is one sandbox to start, with every default resolved.
type BootSpec struct {
	// ID is the sandbox's id, a UUID v4 the kit chose.
	ID string
	// Image is the catalog entry the caller named.
	Image contract.CatalogImage
	// AutoInstall is the adapter's auto_install setting: false means the
	// image must already be on the host (S101 if it is not).
	AutoInstall bool
	CPUs        uint32
	MemoryMB    uint32
	// Network asks for outbound networking.
	Network bool
	// Env is the boot environment, "K=V" entries; exec environments are
	// merged over it.
	Env []string
	// Name is the caller's label, for logs; it is not an identifier.
	Name string
	// ReaperTick is how often the kit's reaper asks each sandbox for its
	// LastActivity: a sandbox whose activity costs something to measure
	// (a round trip into a VM) needs to measure no more often.
	ReaperTick time.Duration
	// IdleTimeout is the sandbox's idle timeout (zero: none); the kit's
	// reaper applies it, a provider that keeps sandboxes across restarts
	// records it for Adopted.
	IdleTimeout time.Duration
}

// Sandbox is one running sandbox. The kit serialises nothing: operations
// may run concurrently (execs share the filesystem and process table, as
// the contract says), and Stop may be called while an Exec runs, in which
// case the Exec must end promptly.
type Sandbox interface {
	// Exec runs one process and waits for it. A process that outlives
	// spec.Timeout is killed with its whole process group and reported
	// with TimedOut set (the kit turns that into S200). A binary that is
	// missing or not executable is a normal result with exit code 127
	// or 126, not an error.
	Exec(ctx context.Context, spec ExecSpec) (ExecResult, error)

	// The filesystem operations take the contract's requests unchanged
	// and return S21x errors (sdk.FsError maps Go errors to them).
	FsLs(ctx context.Context, req *contract.FsLsRequest) (*contract.FsLsResponse, error)
	FsStat(ctx context.Context, req *contract.FsStatRequest) (*contract.FsEntry, error)
	FsMkdir(ctx context.Context, req *contract.FsMkdirRequest) (*contract.FsMkdirResponse, error)
	FsWrite(ctx context.Context, req *contract.FsWriteRequest, content io.Reader) (*contract.FsWriteResponse, error)
	FsRead(ctx context.Context, req *contract.FsReadRequest) (*contract.FsReadMeta, io.ReadCloser, error)
	FsRm(ctx context.Context, req *contract.FsRmRequest) (*contract.FsRmResponse, error)
	FsChmod(ctx context.Context, req *contract.FsChmodRequest) (*contract.FsChmodResponse, error)
	FsMv(ctx context.Context, req *contract.FsMvRequest) (*contract.FsMvResponse, error)
	FsGrep(ctx context.Context, req *contract.FsGrepRequest) (*contract.FsGrepResponse, error)
	FsSed(ctx context.Context, req *contract.FsSedRequest) (*contract.FsSedResponse, error)

	// Stop ends the sandbox and throws its writable state away. The kit
	// calls it exactly once per sandbox, also after Done fired. With wait
	// it returns only once the sandbox is gone; without, it may return
	// as soon as the end is under way.
	Stop(ctx context.Context, wait bool) error
	// Done is closed once the sandbox is gone, whether Stop ended it or it
	// died on its own (a VM crash, an OOM kill). A close the kit did not
	// cause marks the sandbox stopped.
	Done() <-chan struct{}
	// LastActivity is the last time the sandbox showed life the kit does
	// not see itself, such as relayed network payload (TCP data, UDP,
	// DNS; not keepalives or bare ACKs). Zero if none. The reaper counts
	// idleness from the later of this and the last operation. Only the
	// reaper calls it, once per live sandbox and tick (BootSpec.ReaperTick),
	// for all sandboxes at once; it may take a moment (a short round
	// trip), but must not block for long.
	LastActivity() time.Time
}

// ExecSpec is one process to run.
type ExecSpec struct {
	// Argv is the binary and its arguments; Argv[0] is looked up on the
	// sandbox's PATH when it has no slash.
	Argv []string
	// Env is merged over the boot environment ("K=V"; later wins).
	Env []string
	// Workdir is a sandbox path; empty means the image's default.
	Workdir string
	// Stdin is piped to the process; nil means an empty stdin.
	Stdin []byte
	// Timeout is the exec's deadline, already clamped to
	// max_exec_timeout_ms.
	Timeout time.Duration
}

// ExecResult is what one process did. Stdout and Stderr hold at most
// contract.ExecOutputCap bytes each (OutputBuffer does the capping); the
// flags say the process wrote more.
type ExecResult struct {
	Stdout          []byte
	Stderr          []byte
	StdoutTruncated bool
	StderrTruncated bool
	// ExitCode is nil when the process did not exit normally (killed by
	// a signal, or by the timeout).
	ExitCode *int
	TimedOut bool
}
