package pluginhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/schema"
	"github.com/iii-sandbox/iii/host/engine"
)

// State is where an adapter is in its life, as engine::adapters::list
// reports it.
type State string

const (
	// StateStarting: launching, or relaunching after a crash.
	StateStarting State = "starting"
	// StateRunning: configured and published; calls reach it.
	StateRunning State = "running"
	// StateFailed: it could not start (or rejected its configuration);
	// calls get S301 with the reason. After a crash it is retried.
	StateFailed State = "failed"
	// StateStopped: stopped with engine::adapters::stop; not published.
	StateStopped State = "stopped"
	// StateIncompatible: it speaks another contract major; calls get S302.
	StateIncompatible State = "incompatible"
)

// exitPollInterval is how often a watcher looks at whether the adapter
// process has exited: cheap (a flag under a lock), and the bound on how
// long a crash goes unnoticed when no call is in flight.
const exitPollInterval = 100 * time.Millisecond

// pingFailuresAllowed is how many health checks in a row may fail before
// a live but unresponsive adapter is killed and relaunched.
const pingFailuresAllowed = 2

var (
	errStopped    = errors.New("the adapter was stopped")
	errHostClosed = errors.New("the engine is stopping")
)

// Status is one adapter as engine::adapters::list shows it.
type Status struct {
	Adapter        string                    `json:"adapter"`
	Namespace      string                    `json:"namespace"`
	State          State                     `json:"state"`
	PID            int                       `json:"pid,omitempty"`
	Path           string                    `json:"path"`
	Contract       *contract.ContractVersion `json:"contract,omitempty"`
	AdapterVersion string                    `json:"adapter_version,omitempty"`
	LastError      string                    `json:"last_error,omitempty"`
	Restarts       int                       `json:"restarts"`
	// StartedBy says who started it: OriginConfig for the adapter bound in
	// config.yaml, which the engine starts and stops itself, else
	// OriginCall (engine::adapters::start, Compose, the Go API).
	StartedBy string `json:"started_by,omitempty"`
}

type key struct{ adapter, ns string }

// managed is one adapter the host runs in one namespace, across its
// processes: the first launch, relaunches after crashes, restarts.
type managed struct {
	h   *Host
	key key
	log hclog.Logger

	mu       sync.Mutex
	status   Status
	pathArg  string // the path the caller gave; "" means discovery
	config   json.RawMessage
	worker   *engine.LocalWorker // the current publication, nil when stopped
	watching *supervision        // the supervisor of a running adapter
	current  *instance           // the running process, nil while none runs
	// handing is the planned replacement in progress (handover.go);
	// publishedIDs are the function ids the publication holds.
	handing      *handover
	publishedIDs []string
}

// supervision is the goroutine that watches an adapter and relaunches it.
type supervision struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (m *managed) snapshot() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.status
	if s.Contract != nil {
		c := *s.Contract
		s.Contract = &c
	}
	return s
}

func (m *managed) update(f func(s *Status)) {
	m.mu.Lock()
	f(&m.status)
	m.mu.Unlock()
}

func (m *managed) published() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.worker != nil
}

// diedError is S301 for a call whose adapter stopped or crashed under it.
func (m *managed) diedError(op string, cause error) *contract.Error {
	why := "it stopped"
	if cause != nil {
		why = cause.Error()
	}
	if errors.Is(cause, errStopped) || errors.Is(cause, errHostClosed) {
		return contract.NewError(contract.S301, "sandbox adapter %q in namespace %q stopped while serving %s (%s)", m.key.adapter, m.key.ns, op, why)
	}
	return contract.NewError(contract.S301, "sandbox adapter %q in namespace %q died while serving %s (%s); the engine is restarting it: retry",
		m.key.adapter, m.key.ns, op, why)
}

// downError is what calls get while the adapter does not run after a
// launch failed.
func (m *managed) downError(le *launchError) *contract.Error {
	if le.kind == failIncompatible && le.serr != nil {
		return le.serr
	}
	restart := fmt.Sprintf("`iii call engine::adapters::restart --json '{\"adapter\":\"%s\",\"namespace\":\"%s\",\"config\":{...}}'`",
		m.key.adapter, m.key.ns)
	fix := fmt.Sprintf("fix it and restart the adapter: %s (config replaces its configuration; leave it out to keep it), or `iii call compose::restart` when Compose runs it",
		restart)
	byConfig := m.snapshot().StartedBy == OriginConfig
	if byConfig {
		fix = "fix sandbox.config (or sandbox.adapter) in the engine's config.yaml: the engine starts the adapter again when the file changes"
	}
	if le.kind == failRejected {
		return m.rejectedError(le, byConfig, restart)
	}
	return contract.NewError(contract.S301, "sandbox adapter %q is bound in namespace %q but is not running: %s; %s", m.key.adapter, m.key.ns, le.reason, fix)
}

// rejectedError is what calls get while the adapter is down because it
// refused its configuration. A retry cannot help until an operator fixes
// that configuration, so it is not retryable and says which key to fix:
// sandbox.config in config.yaml, or the config it was started with. It
// points at nothing that answers S301 itself (sandbox::catalog::list does
// in this state).
func (m *managed) rejectedError(le *launchError, byConfig bool, restart string) *contract.Error {
	var fix string
	if byConfig {
		fix = "fix sandbox.config in the engine's config.yaml (the adapter's configuration: the reason names the key at fault); " +
			"the engine starts the adapter again when the file changes, and `iii call engine::adapters::list` shows its state and last_error"
	} else {
		fix = "fix the configuration it was started with (the reason names the key at fault): sandbox.config when config.yaml binds it, " +
			"the adapter's config_override in a worker-compose.yaml then `iii call compose::restart`, or the config of " + restart +
			"; `iii call engine::adapters::list` shows its state and last_error"
	}
	e := contract.NewError(contract.S301, "sandbox adapter %q in namespace %q is not running: %s. Retrying does not help: %s",
		m.key.adapter, m.key.ns, le.reason, fix)
	e.Type = contract.TypeConfig
	e.Retryable = false
	return e.WithFixNote("operator action, not retryable: " + fix)
}

// begin launches the adapter and, when it runs, supervises it. A failed
// first launch is not retried: the caller hears why at once, and the
// adapter is published in state failed (or incompatible) so sandbox calls
// get the reason too.
func (m *managed) begin(ctx context.Context, path string) (Status, error) {
	m.update(func(s *Status) {
		s.State, s.Path, s.PID, s.LastError, s.Contract, s.AdapterVersion = StateStarting, path, 0, "", nil, ""
	})
	m.mu.Lock()
	config := m.config
	m.mu.Unlock()
	in, le := m.h.launch(ctx, m, path, config)
	if le == nil {
		if err := m.publish(in, nil); err != nil {
			in.stop(errStopped)
			le = &launchError{kind: failStart, reason: err.Error()}
		}
	}
	if le != nil {
		m.fail(le)
		return m.snapshot(), le
	}
	m.running(in)
	m.supervise(in)
	return m.snapshot(), nil
}

// running records a published, configured instance.
func (m *managed) running(in *instance) {
	m.mu.Lock()
	m.current = in
	m.mu.Unlock()
	m.update(func(s *Status) {
		s.State, s.PID, s.LastError = StateRunning, in.pid, ""
		if in.info != nil {
			c := in.info.Contract
			s.Contract, s.AdapterVersion = &c, in.info.AdapterVersion
		}
	})
	m.log.Info("sandbox adapter running", "pid", in.pid, "path", m.snapshot().Path)
}

// fail records a launch that did not produce a running adapter and
// publishes the adapter so calls get the reason.
func (m *managed) fail(le *launchError) {
	state := StateFailed
	if le.kind == failIncompatible {
		state = StateIncompatible
	}
	m.update(func(s *Status) { s.State, s.PID, s.LastError = state, 0, le.reason })
	m.log.Error("sandbox adapter not running", "state", string(state), "reason", le.reason)
	if err := m.publish(nil, m.downError(le)); err != nil {
		m.log.Warn("cannot publish the adapter's failure", "error", err)
	}
}

// publish replaces the adapter's worker in the engine: one worker per
// process, so engine::workers::list shows the live PID. With in nil the
// functions answer down.
func (m *managed) publish(in *instance, down *contract.Error) error {
	spec := engine.LocalWorkerSpec{
		Name:        m.key.adapter,
		Namespace:   m.key.ns,
		Description: "Sandbox adapter run by the engine's plugin host.",
		Runtime:     "go-plugin",
	}
	if in != nil {
		spec.PID = in.pid
		if in.info != nil {
			spec.Version = in.info.AdapterVersion
			if iso, ok := in.info.Facts["isolation"].(string); ok {
				spec.Isolation = iso
			}
		}
	}
	m.mu.Lock()
	w := m.worker
	keep := w != nil && m.handing != nil
	m.mu.Unlock()
	if keep {
		// A hand-over keeps the publication: calls waiting on it go on to
		// the new process rather than ending with the old worker.
		w.SetProcess(spec.PID, spec.Version, spec.Isolation)
		err := m.register(w, in, down)
		if err == nil {
			return nil
		}
		m.log.Warn("cannot keep the adapter's publication across its replacement; publishing it afresh", "error", err)
	}
	m.unpublish()
	// The adapter's names are its own before it publishes them: a worker
	// squatting on them is evicted (docs/security.md, Adapter names).
	m.h.eng.ReserveName(m.key.adapter)
	w, err := m.h.eng.AttachLocalWorker(spec)
	if err != nil {
		return fmt.Errorf("publish sandbox adapter %q in namespace %q: %w", m.key.adapter, m.key.ns, err)
	}
	if err := m.register(w, in, down); err != nil {
		w.Detach()
		return err
	}
	m.mu.Lock()
	m.worker = w
	m.mu.Unlock()
	return nil
}

// register publishes the adapter's functions on w, served by in (nil:
// answered with down), and withdraws those an earlier process offered and
// this one does not.
func (m *managed) register(w *engine.LocalWorker, in *instance, down *contract.Error) error {
	ops := append(contract.Ops(), contract.OpAdapterInfo)
	// worker::* only where the adapter serves it; while the adapter is
	// down they are published too, so Compose gets S301 and the reason
	// rather than "no such function".
	if in == nil || (in.info != nil && in.info.HasCapability(contract.CapabilityWorker)) {
		ops = append(ops, contract.WorkerOps()...)
	}
	// sandbox::pause and sandbox::resume likewise; without them the
	// router answers S006.
	if in == nil || (in.info != nil && in.info.HasCapability(contract.CapabilityPause)) {
		ops = append(ops, contract.PauseOps()...)
	}
	ids := make([]string, 0, len(ops))
	for _, op := range ops {
		def := engine.FunctionDef{
			ID:             contract.AdapterFunctionID(m.key.adapter, op),
			Description:    schema.Description(op),
			RequestSchema:  schema.Request(op),
			ResponseSchema: schema.Response(op),
			// worker::* boots VMs from host directories and reports on them
			// (paths, logs): only the engine token's holder (Compose) calls
			// them. The operations on sandboxes are privileged too:
			// callers reach them through sandbox::*, whose router keeps
			// each principal to its own sandboxes (docs/security.md); a
			// direct call would see every caller's. adapter::info and
			// catalog::list show no sandbox and stay open.
			Privileged: op != contract.OpAdapterInfo && op != contract.OpCatalogList,
		}
		if err := w.RegisterFunction(def, m.handler(op, in, down)); err != nil {
			return fmt.Errorf("register %s in namespace %q: %w", def.ID, m.key.ns, err)
		}
		ids = append(ids, def.ID)
	}
	m.mu.Lock()
	before := m.publishedIDs
	m.publishedIDs = ids
	m.mu.Unlock()
	for _, id := range before {
		if !slices.Contains(ids, id) {
			w.UnregisterFunction(id)
		}
	}
	return nil
}

// unpublish detaches the adapter's worker; calls in flight to it end with
// invocation_stopped (the router turns that into S301).
func (m *managed) unpublish() {
	m.mu.Lock()
	w := m.worker
	m.worker, m.publishedIDs = nil, nil
	m.mu.Unlock()
	if w != nil {
		w.Detach()
	}
}

// supervise starts the goroutine that watches in and relaunches the
// adapter when it dies.
func (m *managed) supervise(in *instance) {
	ctx, cancel := context.WithCancel(m.h.ctx)
	sup := &supervision{cancel: cancel, done: make(chan struct{})}
	m.mu.Lock()
	m.watching = sup
	m.mu.Unlock()
	if !m.h.tasks.Add() {
		cancel()
		in.stop(errHostClosed)
		close(sup.done)
		return
	}
	go func() {
		defer m.h.tasks.Done()
		defer close(sup.done)
		m.superviseLoop(ctx, in)
	}()
}

func (m *managed) superviseLoop(ctx context.Context, in *instance) {
	o := m.h.opts
	backoff := o.RestartBackoff
	for {
		cause := m.watch(ctx, in)
		if ctx.Err() != nil {
			in.stop(stopCause(m.h.ctx))
			return
		}
		if time.Since(in.started) >= o.HealthyAfter {
			backoff = o.RestartBackoff
		}
		m.log.Warn("sandbox adapter died; relaunching", "pid", in.pid, "cause", cause, "backoff", backoff)
		// Calls in flight fail now with S301; the old publication keeps
		// answering S301 until the new process is published.
		in.stop(errors.New(cause))
		m.mu.Lock()
		m.current = nil
		m.mu.Unlock()
		m.update(func(s *Status) { s.State, s.PID, s.LastError = StateStarting, 0, cause })

		for {
			if !sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, o.MaxRestartBackoff)
			m.mu.Lock()
			config, path := m.config, m.status.Path
			m.status.Restarts++
			m.status.State = StateStarting
			m.mu.Unlock()
			next, le := m.h.launch(ctx, m, path, config)
			if le == nil {
				if err := m.publish(next, nil); err != nil {
					next.stop(errStopped)
					le = &launchError{kind: failStart, reason: err.Error()}
				}
			}
			if ctx.Err() != nil {
				if next != nil {
					next.stop(stopCause(m.h.ctx))
				}
				return
			}
			if le == nil {
				in = next
				m.running(in)
				break
			}
			if le.permanent() {
				m.fail(le)
				<-ctx.Done()
				return
			}
			m.update(func(s *Status) { s.State, s.LastError = StateFailed, le.reason })
			m.log.Warn("sandbox adapter relaunch failed; retrying", "reason", le.reason, "backoff", backoff)
		}
	}
}

// stopCause says why a supervisor stopped its adapter.
func stopCause(hostCtx context.Context) error {
	if hostCtx.Err() != nil {
		return errHostClosed
	}
	return errStopped
}

// watch returns why in died, or "" when ctx ended first: the process
// exited, or its health check failed pingFailuresAllowed times in a row.
func (m *managed) watch(ctx context.Context, in *instance) string {
	o := m.h.opts
	ping := time.NewTicker(o.PingInterval)
	defer ping.Stop()
	exit := time.NewTicker(exitPollInterval)
	defer exit.Stop()
	failures := 0
	check := func() string {
		if why, ok := in.exited(); ok {
			return why
		}
		if err := in.ping(ctx, o.PingInterval); err != nil {
			if ctx.Err() != nil {
				return ""
			}
			if why, ok := in.exited(); ok {
				return why
			}
			failures++
			m.log.Warn("sandbox adapter health check failed", "pid", in.pid, "error", err, "failures", failures)
			if failures >= pingFailuresAllowed {
				return fmt.Sprintf("the adapter stopped answering health checks (%v)", err)
			}
			return ""
		}
		failures = 0
		return ""
	}
	for {
		select {
		case <-ctx.Done():
			return ""
		case <-exit.C:
			if why, ok := in.exited(); ok {
				return why
			}
		case <-ping.C:
			if why := check(); why != "" {
				return why
			}
		case <-in.suspect:
			if why := check(); why != "" {
				return why
			}
		}
	}
}

// halt stops supervising and running the adapter and unpublishes it,
// unless a hand-over keeps the publication for the next process.
func (m *managed) halt(ctx context.Context) error {
	m.mu.Lock()
	sup := m.watching
	m.watching = nil
	m.mu.Unlock()
	if sup != nil {
		sup.cancel()
		select {
		case <-sup.done:
		case <-ctx.Done():
			return fmt.Errorf("stop sandbox adapter %q in namespace %q: %w", m.key.adapter, m.key.ns, ctx.Err())
		}
	}
	m.mu.Lock()
	m.current = nil
	keep := m.handing != nil
	m.mu.Unlock()
	if !keep {
		m.unpublish()
	}
	m.update(func(s *Status) { s.State, s.PID = StateStopped, 0 })
	return nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
