package pluginhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/lazyre"
	"github.com/iii-sandbox/iii/internal/taskgroup"
	"github.com/iii-sandbox/iii/protocol"
)

// WorkerName is the plugin host's own (internal) worker in the default
// namespace, which serves engine::adapters::*.
const WorkerName = "iii-plugin-host"

// Error codes of the plugin host's functions and Go API.
const (
	// CodeInvalidRequest: the request to engine::adapters::* is malformed.
	CodeInvalidRequest = "ADAPTER_INVALID_REQUEST"
	// CodeNotFound: no binary for the adapter was found (the message
	// lists where the host looked), or the given path is not executable.
	CodeNotFound = "ADAPTER_NOT_FOUND"
	// CodeAlreadyStarted: start of an adapter the host already runs in
	// that namespace; use restart.
	CodeAlreadyStarted = "ADAPTER_ALREADY_STARTED"
	// CodeNotStarted: stop or restart of an adapter the host never
	// started in that namespace.
	CodeNotStarted = "ADAPTER_NOT_STARTED"
	// CodeStartFailed: the adapter did not start; the message says why.
	CodeStartFailed = "ADAPTER_START_FAILED"
	// CodeConfigRejected: the adapter refused its configuration.
	CodeConfigRejected = "ADAPTER_CONFIG_REJECTED"
	// CodeIncompatible: the adapter speaks another contract major.
	CodeIncompatible = "ADAPTER_INCOMPATIBLE"
	// CodeStopping: the engine is stopping.
	CodeStopping = "ENGINE_STOPPING"
	// CodeUnauthorized: the engine has an engine token and the call to
	// engine::adapters::start, stop or restart did not present it.
	CodeUnauthorized = "UNAUTHORIZED"
)

// Function ids the host registers in the default namespace.
const (
	FnStart   = "engine::adapters::start"
	FnStop    = "engine::adapters::stop"
	FnRestart = "engine::adapters::restart"
	FnList    = "engine::adapters::list"
)

// Defaults of Options.
const (
	DefaultPingInterval      = 2 * time.Second
	DefaultStartTimeout      = 60 * time.Second
	DefaultRestartBackoff    = 100 * time.Millisecond
	DefaultMaxRestartBackoff = 5 * time.Second
	DefaultHealthyAfter      = 30 * time.Second
)

// Options configure a Host. The zero value is usable.
type Options struct {
	Logger hclog.Logger // nil = null logger; adapters log into Named(<adapter>)
	Finder Finder       // where adapter binaries are looked for
	// PingInterval is how often a running adapter's health is checked
	// (and the timeout of one check).
	PingInterval time.Duration
	// StartTimeout bounds one launch: handshake, adapter::info and
	// Configure.
	StartTimeout time.Duration
	// RestartBackoff is the delay before the first relaunch after a
	// crash; it doubles after each failed relaunch up to
	// MaxRestartBackoff, and is reset once an adapter has run for
	// HealthyAfter.
	RestartBackoff    time.Duration
	MaxRestartBackoff time.Duration
	HealthyAfter      time.Duration
	// HandoverDrain bounds how long a planned replacement of an adapter
	// process waits for the old process's calls in flight (handover.go).
	// Default: DefaultHandoverDrain.
	HandoverDrain time.Duration
	// MaxChannels caps the engine channels one adapter (in one namespace,
	// across its processes) holds through its channel service: those of
	// replies in flight, and those of callers without a connection (a
	// caller's connection takes its channels over when the reply reaches
	// the engine); default engine.MaxChannelsPerAdapter.
	MaxChannels int
	// OnConfig, when set, is told every configuration an adapter is
	// (re)started with, before the launch. The server stores it in the
	// configuration worker as the in-memory entry <namespace>-<adapter>,
	// which is how Compose reads the current value back when it layers
	// config_override over it (so a bad value stays there until replaced).
	OnConfig func(adapter, namespace string, config json.RawMessage)
	// OnStopped, when set, is told of every adapter an explicit Stop
	// stopped, with who had started it (Status.StartedBy), after the host
	// is free again: the server then brings back the adapter config.yaml
	// binds when the one that took it over (Compose's) goes away.
	OnStopped func(adapter, namespace, startedBy string)
	// Token, when set, returns the engine token. engine::adapters::start,
	// stop and restart are privileged functions, so the engine itself lets
	// only callers holding the token reach them (Call.CallerAdmin); while
	// Token is not empty, a caller that is not admin must also send a
	// token field equal to it (UNAUTHORIZED otherwise), the older check
	// kept for engines that give socket workers no admin token. A
	// function, so a reloaded config.yaml takes effect at once. The Go API
	// (Start, Stop, Restart) is the engine's own and takes no token.
	Token func() string
	// Warnings, when set, returns what engine::adapters::list reports
	// beside the adapters as warnings: the router's, such as a host that
	// serves a fleet-bound adapter without --fleet.
	Warnings func() []string
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	set := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	set(&o.PingInterval, DefaultPingInterval)
	set(&o.StartTimeout, DefaultStartTimeout)
	set(&o.RestartBackoff, DefaultRestartBackoff)
	set(&o.MaxRestartBackoff, DefaultMaxRestartBackoff)
	set(&o.HealthyAfter, DefaultHealthyAfter)
	set(&o.HandoverDrain, DefaultHandoverDrain)
	o.MaxRestartBackoff = max(o.MaxRestartBackoff, o.RestartBackoff)
	if o.MaxChannels <= 0 {
		o.MaxChannels = engine.MaxChannelsPerAdapter
	}
}

// Host runs sandbox adapters as go-plugin subprocesses and publishes each
// in the engine as worker <adapter> in its namespace, with the functions
// <adapter>::<op> and <adapter>::adapter::info. Create it with New and
// stop it with Close before closing the engine.
type Host struct {
	eng  *engine.Engine
	opts Options
	log  hclog.Logger

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	tasks  taskgroup.Group

	// ops on entries (start, stop, restart, close) take turns; a channel
	// rather than a mutex so waiting for a turn respects contexts.
	turn chan struct{}

	mu      sync.Mutex
	entries map[key]*managed
	closed  bool
	worker  *engine.LocalWorker
}

// New attaches the plugin host to eng: its internal worker iii-plugin-host
// in the default namespace serves engine::adapters::start, stop, restart
// and list.
func New(eng *engine.Engine, opts Options) (*Host, error) {
	opts.defaults()
	ctx, cancel := context.WithCancel(context.Background())
	h := &Host{
		eng: eng, opts: opts, log: opts.Logger,
		ctx: ctx, cancel: cancel, turn: make(chan struct{}, 1),
		entries: map[key]*managed{},
	}
	w, err := eng.AttachLocalWorker(engine.LocalWorkerSpec{
		Name:        WorkerName,
		Namespace:   engine.DefaultNamespace,
		Description: "Runs sandbox adapters as go-plugin subprocesses: engine::adapters::*.",
		Runtime:     "engine",
		Isolation:   "in-process",
		Internal:    true,
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("attach the plugin host: %w", err)
	}
	for _, f := range h.functions() {
		if err := w.RegisterFunction(f.def, f.h); err != nil {
			w.Detach()
			cancel()
			return nil, fmt.Errorf("register %s: %w", f.def.ID, err)
		}
	}
	h.worker = w
	return h, nil
}

// StartRequest is what Start launches.
type StartRequest struct {
	Adapter   string
	Namespace string // "" means default
	// Path is the adapter binary; "" means discovery (see Finder.Find).
	Path string
	// Config is the adapter's configuration, a JSON object; nil means {}.
	Config json.RawMessage
	// Origin is who starts it (Status.StartedBy): OriginConfig for the
	// engine's own start of the adapter config.yaml binds; "" means
	// OriginCall.
	Origin string
}

// Who started an adapter (Status.StartedBy).
const (
	OriginConfig = "config.yaml"
	OriginCall   = "call"
)

var (
	namespaceRE = lazyre.New(`^[a-z0-9_-]+$`)
)

func errBody(code, format string, args ...any) *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: code, Message: fmt.Sprintf(format, args...)}
}

func checkNames(adapter, ns string) (key, error) {
	if !contract.ValidAdapterName(adapter) {
		return key{}, errBody(CodeInvalidRequest, "adapter %q is not a worker name: 1 to 64 of a-z 0-9 _ -, starting with a letter or digit", clip(adapter, 80))
	}
	if ns == "" {
		ns = engine.DefaultNamespace
	}
	if !namespaceRE.MatchString(ns) {
		return key{}, errBody(protocol.CodeInvalidNamespace, "namespace %q is not valid: use lower case letters, digits, _ and -", clip(ns, 80))
	}
	return key{adapter, ns}, nil
}

// acquire waits for the host's turn.
func (h *Host) acquire(ctx context.Context) error {
	select {
	case h.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *Host) release() { <-h.turn }

// Start launches an adapter, configures it and publishes it. The adapter
// must not already be running or starting in that namespace (see
// Restart); one that stopped or failed is started afresh. When it does not
// come up, the error says why (ADAPTER_START_FAILED,
// ADAPTER_CONFIG_REJECTED, ADAPTER_INCOMPATIBLE) and the adapter stays
// listed and published in state failed or incompatible, so sandbox calls
// get the reason as S301 (S302) and Restart can retry it.
func (h *Host) Start(ctx context.Context, req StartRequest) (Status, error) {
	k, err := checkNames(req.Adapter, req.Namespace)
	if err != nil {
		return Status{}, err
	}
	config, err := normConfig(req.Config)
	if err != nil {
		return Status{}, err
	}
	if err := h.acquire(ctx); err != nil {
		return Status{}, err
	}
	defer h.release()
	h.mu.Lock()
	closed, m := h.closed, h.entries[k]
	h.mu.Unlock()
	if closed {
		return Status{}, errBody(CodeStopping, "the engine is stopping")
	}
	if m != nil {
		// An adapter that is not running (stopped, failed, incompatible)
		// may be started again, with a new path or configuration. So may
		// one the engine started for config.yaml's sandbox: section: an
		// explicit start (Compose's, with its layered configuration) takes
		// it over.
		cur := m.snapshot()
		if st := cur.State; (st == StateRunning || st == StateStarting) && (cur.StartedBy != OriginConfig || req.Origin == OriginConfig) {
			return cur, errBody(CodeAlreadyStarted, "sandbox adapter %q already runs in namespace %q (state %s); use %s to restart it",
				k.adapter, k.ns, st, FnRestart)
		}
		if cur.StartedBy == OriginConfig && cur.State != StateStopped {
			m.log.Info("an explicit start takes over the sandbox adapter config.yaml binds", "state", string(cur.State))
		}
		if cur.State == StateRunning {
			m.beginHandover(ctx)
			defer m.endHandover()
		}
		if err := m.halt(ctx); err != nil {
			return m.snapshot(), err
		}
	}
	path, err := h.opts.Finder.Find(k.adapter, req.Path)
	if err != nil {
		return Status{}, errBody(CodeNotFound, "%v", err)
	}
	if m == nil {
		m = &managed{h: h, key: k, log: h.log.Named(k.adapter), status: Status{Adapter: k.adapter, Namespace: k.ns, State: StateStopped}}
		h.mu.Lock()
		h.entries[k] = m
		h.mu.Unlock()
	}
	origin := req.Origin
	if origin == "" {
		origin = OriginCall
	}
	m.mu.Lock()
	m.pathArg, m.config, m.status.StartedBy = req.Path, config, origin
	m.mu.Unlock()
	h.announceConfig(k, config)
	return h.begin(ctx, m, path)
}

// announceConfig hands the configuration an adapter starts with to
// Options.OnConfig.
func (h *Host) announceConfig(k key, config json.RawMessage) {
	if h.opts.OnConfig != nil {
		h.opts.OnConfig(k.adapter, k.ns, config)
	}
}

// begin launches m with the host's context joined to the caller's.
func (h *Host) begin(ctx context.Context, m *managed, path string) (Status, error) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(h.ctx, cancel)
	defer stop()
	st, err := m.begin(lctx, path)
	if err == nil {
		return st, nil
	}
	var le *launchError
	if errors.As(err, &le) {
		switch le.kind {
		case failRejected:
			return st, errBody(CodeConfigRejected, "sandbox adapter %q in namespace %q: %s", m.key.adapter, m.key.ns, le.reason)
		case failIncompatible:
			return st, errBody(CodeIncompatible, "%s", le.reason)
		}
		return st, errBody(CodeStartFailed, "sandbox adapter %q in namespace %q: %s", m.key.adapter, m.key.ns, le.reason)
	}
	return st, err
}

// Stop stops an adapter and unpublishes it; it stays listed as stopped.
func (h *Host) Stop(ctx context.Context, adapter, namespace string) (Status, error) {
	k, err := checkNames(adapter, namespace)
	if err != nil {
		return Status{}, err
	}
	if err := h.acquire(ctx); err != nil {
		return Status{}, err
	}
	stoppedBy := ""
	defer func() {
		// After the release below (deferred later, run first): the
		// callback may start an adapter.
		if stoppedBy != "" && h.opts.OnStopped != nil {
			h.opts.OnStopped(k.adapter, k.ns, stoppedBy)
		}
	}()
	defer h.release()
	h.mu.Lock()
	m := h.entries[k]
	h.mu.Unlock()
	if m == nil {
		return Status{}, errBody(CodeNotStarted, "sandbox adapter %q was never started in namespace %q", k.adapter, k.ns)
	}
	before := m.snapshot()
	if err := m.halt(ctx); err != nil {
		return m.snapshot(), err
	}
	if before.State != StateStopped {
		stoppedBy = before.StartedBy
	}
	return m.snapshot(), nil
}

// RemoveIfStartedBy stops an adapter and drops it from the list, only
// while the entry's last start came from origin (Status.StartedBy): the
// engine removes the adapter config.yaml bound when the binding changes,
// without touching one that Compose or a user has started since. removed
// reports whether it did.
func (h *Host) RemoveIfStartedBy(ctx context.Context, adapter, namespace, origin string) (removed bool, err error) {
	k, err := checkNames(adapter, namespace)
	if err != nil {
		return false, err
	}
	if err := h.acquire(ctx); err != nil {
		return false, err
	}
	defer h.release()
	h.mu.Lock()
	m := h.entries[k]
	h.mu.Unlock()
	if m == nil || m.snapshot().StartedBy != origin {
		return false, nil
	}
	if err := m.halt(ctx); err != nil {
		return false, err
	}
	h.mu.Lock()
	if h.entries[k] == m {
		delete(h.entries, k)
	}
	h.mu.Unlock()
	return true, nil
}

// Restart stops an adapter (when it runs) and starts it again, with
// config when it is non-nil, else with its last configuration. The binary
// is looked up again, so an upgraded package is picked up. A running
// adapter that announces the reconfigure capability is first offered a
// changed config in place, and keeps its process when it takes it.
func (h *Host) Restart(ctx context.Context, adapter, namespace string, config json.RawMessage) (Status, error) {
	k, err := checkNames(adapter, namespace)
	if err != nil {
		return Status{}, err
	}
	var cfg json.RawMessage
	if config != nil {
		if cfg, err = normConfig(config); err != nil {
			return Status{}, err
		}
	}
	if err := h.acquire(ctx); err != nil {
		return Status{}, err
	}
	defer h.release()
	h.mu.Lock()
	closed, m := h.closed, h.entries[k]
	h.mu.Unlock()
	if closed {
		return Status{}, errBody(CodeStopping, "the engine is stopping")
	}
	if m == nil {
		return Status{}, errBody(CodeNotStarted, "sandbox adapter %q was never started in namespace %q; use %s", k.adapter, k.ns, FnStart)
	}
	// A changed configuration the running adapter can take live needs no
	// new process (reconfigure.go).
	if st, ok := h.tryReconfigure(ctx, m, cfg); ok {
		return st, nil
	}
	if m.snapshot().State == StateRunning {
		m.beginHandover(ctx)
		defer m.endHandover()
	}
	if err := m.halt(ctx); err != nil {
		return m.snapshot(), err
	}
	m.mu.Lock()
	if cfg != nil {
		// A new configuration is the caller's, no longer config.yaml's:
		// the engine leaves it alone when the binding changes.
		m.config, m.status.StartedBy = cfg, OriginCall
	}
	current := m.config
	pathArg := m.pathArg
	m.status.Restarts++
	m.mu.Unlock()
	h.announceConfig(k, current)
	path, err := h.opts.Finder.Find(k.adapter, pathArg)
	if err != nil {
		return m.snapshot(), errBody(CodeNotFound, "%v", err)
	}
	return h.begin(ctx, m, path)
}

// Find looks the adapter's binary up the way Start does without a path
// (Options.Finder); the error is a *NotFoundError listing where it looked.
func (h *Host) Find(adapter string) (string, error) {
	return h.opts.Finder.Find(adapter, "")
}

// List returns every adapter the host has started, sorted by namespace
// and name.
func (h *Host) List() []Status {
	h.mu.Lock()
	all := make([]*managed, 0, len(h.entries))
	for _, m := range h.entries {
		all = append(all, m)
	}
	h.mu.Unlock()
	out := make([]Status, 0, len(all))
	for _, m := range all {
		out = append(out, m.snapshot())
	}
	slices.SortFunc(out, func(a, b Status) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Adapter, b.Adapter)
	})
	return out
}

// Lookup returns one adapter's status.
func (h *Host) Lookup(adapter, namespace string) (Status, bool) {
	if namespace == "" {
		namespace = engine.DefaultNamespace
	}
	h.mu.Lock()
	m := h.entries[key{adapter, namespace}]
	h.mu.Unlock()
	if m == nil {
		return Status{}, false
	}
	return m.snapshot(), true
}

// Hosted reports whether the host publishes adapter in namespace (in any
// state but stopped): its <adapter>::* functions are then the host's,
// which checks the contract major itself.
func (h *Host) Hosted(adapter, namespace string) bool {
	h.mu.Lock()
	m := h.entries[key{adapter, namespace}]
	h.mu.Unlock()
	return m != nil && m.published()
}

// Close stops every adapter (no adapter process outlives it), detaches the
// host's worker and waits for its goroutines. Call it before closing the
// engine.
func (h *Host) Close(ctx context.Context) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return h.waitTasks(ctx)
	}
	h.closed = true
	h.mu.Unlock()
	// Cancelling first aborts a launch in progress and tells every
	// supervisor to stop its adapter.
	h.cancel()
	if err := h.acquire(ctx); err != nil {
		return fmt.Errorf("close the plugin host: %w", err)
	}
	defer h.release()
	if h.worker != nil {
		h.worker.Detach()
	}
	h.mu.Lock()
	all := make([]*managed, 0, len(h.entries))
	for _, m := range h.entries {
		all = append(all, m)
	}
	h.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, len(all))
	for i, m := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.halt(ctx)
		}()
	}
	wg.Wait()
	h.tasks.Close()
	errs = append(errs, h.waitTasks(ctx))
	return errors.Join(errs...)
}

// normConfig checks an adapter configuration is a JSON object; null or
// absent is {}.
func normConfig(raw json.RawMessage) (json.RawMessage, error) {
	t := strings.TrimSpace(string(raw))
	if t == "" || t == "null" {
		return json.RawMessage("{}"), nil
	}
	if t[0] != '{' || !json.Valid([]byte(t)) {
		return nil, errBody(CodeInvalidRequest, "config must be a JSON object (the adapter's configuration), got %s", clip(t, 60))
	}
	return json.RawMessage(t), nil
}

func (h *Host) waitTasks(ctx context.Context) error {
	if err := h.tasks.Wait(ctx); err != nil {
		return fmt.Errorf("wait for the plugin host's goroutines: %w", err)
	}
	return nil
}
