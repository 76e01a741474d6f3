package sandboxkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/procstats"
)

// Options configure a Manager.
type Options struct {
	// Name and Version are adapter::info's adapter and adapter_version.
	Name    string
	Version string
	// Logger receives the Manager's log; nil discards it.
	Logger hclog.Logger
	// ProviderConfigKeys are the configuration keys the provider owns.
	// The Manager hands their raw values to Provider.Configure; any key
	// that is neither the kit's nor listed here rejects the configuration.
	ProviderConfigKeys []string
}

// Timeouts the Manager applies to work it starts on its own.
const (
	// stopTimeout bounds a stop the Manager starts itself (reaper, a
	// sandbox that died, run's clean-up, shutdown of stragglers).
	stopTimeout = time.Minute
	// execGrace is how long past an exec's own timeout the Manager waits
	// for the provider to report it before giving up on it (S200).
	execGrace = 30 * time.Second
	// busyGrace is the reaper's leaked-slot guard: a sandbox with an exec
	// in flight is reaped once idle for idle_timeout + max_exec_timeout +
	// busyGrace.
	busyGrace = 60 * time.Second
	// tombstoneTTL and maxTombstones bound how long, and how many,
	// stopped sandboxes stay known: long enough that callers get S004
	// (stopped) rather than S002 (unknown) and see them in list.
	tombstoneTTL  = time.Hour
	maxTombstones = 1024
)

// Manager implements contract.Adapter on top of a Provider. It owns the
// adapter configuration, the catalog, the registry of sandboxes, the
// limits and error codes, sandbox::run, and the idle reaper.
type Manager struct {
	provider Provider
	opts     Options
	log      hclog.Logger
	// now is the clock; tests of the reaper replace it.
	now func() time.Time

	// confMu makes Configure calls take turns: a reload (reconfigure.go)
	// compares against the configuration the previous call applied.
	confMu sync.Mutex

	mu      sync.Mutex
	cfg     *Config
	catalog []contract.CatalogImage
	// providerKeys are the provider's keys as last applied, for telling
	// which changed when the configuration is reloaded.
	providerKeys map[string]json.RawMessage
	sandboxes    map[string]*entry
	booting      uint32
	closed       bool
	stopReaper   chan struct{}
	// wg counts the goroutines the Manager started: the reaper, one
	// watcher per sandbox, and stops it runs in the background.
	wg sync.WaitGroup
}

var _ contract.Adapter = (*Manager)(nil)

// New returns a Manager serving provider. It starts nothing until
// Configure; Shutdown stops everything it started.
func New(provider Provider, opts Options) *Manager {
	log := opts.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Manager{
		provider:  provider,
		opts:      opts,
		log:       log,
		now:       time.Now,
		sandboxes: map[string]*entry{},
	}
}

// entry is one sandbox the Manager knows, live or stopped.
type entry struct {
	id          string
	name        string
	image       string
	sb          Sandbox
	created     time.Time
	idleTimeout time.Duration
	// lastOp is the time of the last operation, in Unix nanoseconds;
	// atomic so a streaming fs::read can bump it without the lock.
	lastOp atomic.Int64

	// Guarded by Manager.mu.
	execs   uint32
	ops     uint32
	stopped bool
	// paused: sandbox::pause (or the reaper, with idle_action pause)
	// paused it; moving: a pause or resume is under way (pause.go).
	paused     bool
	moving     bool
	stoppedAt  time.Time
	stopReason string
	// released is closed when the Manager claims the stop, which ends
	// the sandbox's watcher.
	released chan struct{}
}

func (e *entry) touch(t time.Time) { e.lastOp.Store(t.UnixNano()) }

func (e *entry) lastActivity() time.Time {
	last := time.Unix(0, e.lastOp.Load())
	if a := e.sb.LastActivity(); a.After(last) {
		return a
	}
	return last
}

// Info serves adapter::info.
func (m *Manager) Info(ctx context.Context) (*contract.AdapterInfo, error) {
	facts := m.provider.Info(ctx)
	if facts == nil {
		facts = map[string]any{}
	}
	if c := m.capacity(); c != nil {
		facts["capacity"] = c
	}
	info := &contract.AdapterInfo{
		Adapter:        m.opts.Name,
		AdapterVersion: m.opts.Version,
		Contract:       contract.Current(),
		Facts:          facts,
	}
	if m.canPause() {
		info.Capabilities = append(info.Capabilities, contract.CapabilityPause)
	}
	// Every kit adapter takes Configure again while it runs: the kit's
	// keys reload live, a provider's only through Reconfigurer.
	info.Capabilities = append(info.Capabilities, contract.CapabilityReconfigure)
	return info, nil
}

// capacity is adapter::info's capacity fact, by which the sandbox router
// places creates over a fleet of hosts (docs/scale-out.md):
// {max_sandboxes, live_sandboxes, free_slots, memory_available_bytes};
// nil before the adapter is configured.
func (m *Manager) capacity() map[string]any {
	m.mu.Lock()
	cfg := m.cfg
	live := m.booting
	for _, e := range m.sandboxes {
		if !e.stopped {
			live++
		}
	}
	m.mu.Unlock()
	if cfg == nil {
		return nil
	}
	maxN, liveN := int64(cfg.MaxConcurrentSandboxes), int64(live)
	c := map[string]any{
		"max_sandboxes":  maxN,
		"live_sandboxes": liveN,
		"free_slots":     max(maxN-liveN, 0),
	}
	if mem, ok := procstats.MemAvailable(); ok {
		c["memory_available_bytes"] = mem
	}
	return c
}

// Configure parses and applies the adapter configuration (see
// ParseConfig), hands the provider its keys, and starts the reaper. Called
// again on a configured Manager it reloads the configuration: see
// reconfigure.go for what changes live and what answers
// contract.RestartRequired.
func (m *Manager) Configure(ctx context.Context, configJSON []byte) error {
	m.confMu.Lock()
	defer m.confMu.Unlock()
	presets := m.provider.Presets()
	if err := checkPresets(presets); err != nil {
		return err
	}
	cfg, providerKeys, err := ParseConfig(configJSON, presets, m.opts.ProviderConfigKeys)
	if err != nil {
		return err
	}
	m.mu.Lock()
	closed, configured := m.closed, m.cfg != nil
	m.mu.Unlock()
	switch {
	case closed:
		return errors.New("the adapter is shutting down")
	case configured:
		return m.reconfigure(ctx, cfg, providerKeys, presets)
	}

	if kc, ok := m.provider.(KitConfigurer); ok {
		kc.ConfigureKit(cfg, buildCatalog(presets, cfg.CustomImages))
	}
	if err := m.provider.Configure(ctx, providerKeys); err != nil {
		return fmt.Errorf("invalid sandbox adapter configuration: %w", err)
	}
	if cfg.IdleAction == IdlePause && !m.canPause() {
		return fmt.Errorf("invalid sandbox adapter configuration: %s is %q, but this adapter's sandboxes cannot be paused (it does not announce the %q capability); use %q", KeyIdleAction, IdlePause, contract.CapabilityPause, IdleStop)
	}
	m.adopt(ctx)

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.cfg != nil {
		return errors.New("the adapter was shut down or configured while it was being configured")
	}
	m.cfg = cfg
	m.catalog = buildCatalog(presets, cfg.CustomImages)
	m.providerKeys = providerKeys
	m.stopReaper = make(chan struct{})
	m.wg.Add(1)
	go m.reaper(cfg.ReaperTick, m.stopReaper)
	m.log.Info("configured", "images_allowed", strings.Join(cfg.ImageAllowlist, ","),
		"max_concurrent_sandboxes", cfg.MaxConcurrentSandboxes, "exec_slots", cfg.ExecSlots())
	return nil
}

// notConfigured is what operations get before Configure: the adapter is
// not ready, which callers retry like an adapter that is not running.
func (m *Manager) notConfigured() *contract.Error {
	return contract.NewError(contract.S301,
		"the sandbox adapter %q has not been configured yet (the engine configures it right after starting it); retry in a moment", m.opts.Name)
}

// CatalogList serves catalog::list.
func (m *Manager) CatalogList(context.Context, *contract.CatalogListRequest) (*contract.CatalogListResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg == nil {
		return nil, m.notConfigured()
	}
	return &contract.CatalogListResponse{Images: slices.Clone(m.catalog)}, nil
}

// lookupImage resolves a catalog name that the allowlist permits (S100).
func (m *Manager) lookupImage(name string) (contract.CatalogImage, *contract.Error) {
	var img contract.CatalogImage
	found := false
	for _, c := range m.catalog {
		if c.Name == name {
			img, found = c, true
			break
		}
	}
	allowed := "none: image_allowlist is empty, which denies every image"
	if len(m.cfg.ImageAllowlist) > 0 {
		allowed = strings.Join(m.cfg.ImageAllowlist, ", ")
	}
	switch {
	case !found:
		return img, contract.NewError(contract.S100, "image %q is not in this adapter's catalog; allowed images: %s", truncate(name, 64), allowed)
	case !m.cfg.Allowed(name):
		return img, contract.NewError(contract.S100, "image %q is in the catalog but not on image_allowlist; allowed images: %s", name, allowed)
	}
	return img, nil
}

// Create serves create.
func (m *Manager) Create(ctx context.Context, req *contract.CreateRequest) (*contract.CreateResponse, error) {
	resp, e := m.create(ctx, req)
	if e != nil {
		return nil, e
	}
	return resp, nil
}

func (m *Manager) create(ctx context.Context, req *contract.CreateRequest) (*contract.CreateResponse, *contract.Error) {
	m.mu.Lock()
	if m.cfg == nil {
		m.mu.Unlock()
		return nil, m.notConfigured()
	}
	if m.closed {
		m.mu.Unlock()
		return nil, contract.NewError(contract.S300, "the sandbox adapter is shutting down")
	}
	cfg := m.cfg
	live := m.booting
	for _, e := range m.sandboxes {
		if !e.stopped {
			live++
		}
	}
	if live >= cfg.MaxConcurrentSandboxes {
		m.mu.Unlock()
		return nil, contract.NewError(contract.S400,
			"max_concurrent_sandboxes (%d) reached: %d sandboxes are running or booting; stop one with sandbox::stop, or raise the limit in the adapter's config_override",
			cfg.MaxConcurrentSandboxes, live)
	}
	img, ce := m.lookupImage(req.Image)
	if ce != nil {
		m.mu.Unlock()
		return nil, ce
	}
	cpus, mem := cfg.DefaultCPUs, cfg.DefaultMemoryMB
	if req.CPUs != nil {
		cpus = *req.CPUs
	}
	if req.MemoryMB != nil {
		mem = *req.MemoryMB
	}
	caps := cfg.PerImageCaps[img.Name]
	if caps.MaxCPUs > 0 && cpus > caps.MaxCPUs {
		m.mu.Unlock()
		return nil, contract.NewError(contract.S400, "cpus %d is above the cap for image %s (per_image_caps max_cpus %d)", cpus, img.Name, caps.MaxCPUs)
	}
	if caps.MaxMemoryMB > 0 && mem > caps.MaxMemoryMB {
		m.mu.Unlock()
		return nil, contract.NewError(contract.S400, "memory_mb %d is above the cap for image %s (per_image_caps max_memory_mb %d)", mem, img.Name, caps.MaxMemoryMB)
	}
	idle := cfg.DefaultIdleTimeoutSecs
	if req.IdleTimeoutSecs != nil {
		idle = *req.IdleTimeoutSecs
	}
	m.booting++
	m.mu.Unlock()

	spec := BootSpec{
		ID:          uuid.New().String(),
		Image:       img,
		AutoInstall: cfg.AutoInstall,
		CPUs:        cpus,
		MemoryMB:    mem,
		Network:     req.Network,
		Env:         slices.Clone(req.Env),
		Name:        req.Name,
		ReaperTick:  cfg.ReaperTick,
		IdleTimeout: durationOf(idle, time.Second),
	}
	ctx = withImage(ctx, img)
	sb, err := m.provider.Boot(ctx, spec)

	m.mu.Lock()
	m.booting--
	if err != nil {
		m.mu.Unlock()
		m.log.Warn("sandbox failed to boot", "image", img.Name, "error", err.Error())
		return nil, contract.AsError(err, contract.S300)
	}
	if sb == nil {
		m.mu.Unlock()
		return nil, contract.NewError(contract.S300, "the sandbox back end returned no sandbox for image %s", img.Name)
	}
	if m.closed {
		m.mu.Unlock()
		m.stopQuietly(sb, "the adapter shut down while it booted")
		return nil, contract.NewError(contract.S300, "the sandbox adapter is shutting down")
	}
	now := m.now()
	e := &entry{
		id:          spec.ID,
		name:        req.Name,
		image:       img.Name,
		sb:          sb,
		created:     now,
		idleTimeout: durationOf(idle, time.Second),
		released:    make(chan struct{}),
	}
	e.touch(now)
	m.sandboxes[e.id] = e
	m.wg.Add(1)
	m.mu.Unlock()
	go m.watch(e)
	m.log.Info("sandbox created", "sandbox_id", e.id, "image", img.Name, "name", req.Name, "cpus", cpus, "memory_mb", mem)
	ReportProgress(ctx, contract.ProgressEvent{Phase: contract.ProgressReady, SandboxID: e.id})
	return &contract.CreateResponse{SandboxID: e.id, Image: img.Name}, nil
}

// watch marks a sandbox that died on its own as stopped, and cleans it up.
func (m *Manager) watch(e *entry) {
	defer m.wg.Done()
	select {
	case <-e.sb.Done():
		if m.markStopped(e, "the sandbox exited on its own") {
			m.log.Warn("sandbox exited on its own", "sandbox_id", e.id)
			m.stopQuietly(e.sb, "it exited on its own")
		}
	case <-e.released:
	}
}

// stopQuietly stops sb on the Manager's own behalf, logging a failure.
func (m *Manager) stopQuietly(sb Sandbox, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := sb.Stop(ctx, false); err != nil {
		m.log.Warn("stopping a sandbox failed", "why", why, "error", err)
	}
}

// markStopped claims the stop of e. Only the caller that gets true goes on
// to stop the sandbox, so each sandbox is stopped exactly once.
func (m *Manager) markStopped(e *entry, reason string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.markStoppedLocked(e, reason)
}

func (m *Manager) markStoppedLocked(e *entry, reason string) bool {
	if e.stopped {
		return false
	}
	e.stopped = true
	e.stoppedAt = m.now()
	e.stopReason = reason
	close(e.released)
	m.pruneLocked(e.stoppedAt)
	return true
}

// pruneLocked forgets stopped sandboxes older than tombstoneTTL, and the
// oldest ones beyond maxTombstones.
func (m *Manager) pruneLocked(now time.Time) {
	var stopped []*entry
	for id, e := range m.sandboxes {
		if !e.stopped {
			continue
		}
		if now.Sub(e.stoppedAt) > tombstoneTTL {
			delete(m.sandboxes, id)
			continue
		}
		stopped = append(stopped, e)
	}
	if len(stopped) <= maxTombstones {
		return
	}
	sort.Slice(stopped, func(i, j int) bool { return stopped[i].stoppedAt.Before(stopped[j].stoppedAt) })
	for _, e := range stopped[:len(stopped)-maxTombstones] {
		delete(m.sandboxes, e.id)
	}
}

// acquire finds a live sandbox for an operation and counts the operation
// in flight: S002 unknown, S004 stopped, S003 at the exec cap.
func (m *Manager) acquire(id string, exec bool) (*entry, *contract.Error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg == nil {
		return nil, m.notConfigured()
	}
	e, ok := m.sandboxes[id]
	if !ok {
		return nil, contract.NewError(contract.S002, "sandbox %s not found: it was never created by this adapter, or was stopped long ago", id)
	}
	if e.stopped {
		return nil, stoppedError(e)
	}
	if e.paused || e.moving {
		op := contract.OpExec
		if !exec {
			op = "fs::*"
		}
		return nil, contract.SandboxPausedError(id, op)
	}
	if exec {
		if slots := m.cfg.ExecSlots(); e.execs >= slots {
			return nil, contract.NewError(contract.S003,
				"sandbox %s already runs %d exec(s), its max_concurrent_exec_per_sandbox limit; execs are not queued", id, e.execs)
		}
		e.execs++
	} else {
		e.ops++
	}
	e.touch(m.now())
	return e, nil
}

func (m *Manager) release(e *entry, exec bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if exec {
		e.execs--
	} else {
		e.ops--
	}
	e.touch(m.now())
}

func stoppedError(e *entry) *contract.Error {
	return contract.NewError(contract.S004, "sandbox %s is stopped (%s)", e.id, e.stopReason)
}

// opError reports a failed operation: the caller's context error as is;
// S004 when the sandbox was stopped while it ran, whatever the provider
// made of that (a killed process, or an S300 for the connection to its VM
// that closed); otherwise the provider's error with fallback as its code
// if it has none.
func (m *Manager) opError(ctx context.Context, e *entry, err error, fallback contract.Code) error {
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return err
	}
	m.mu.Lock()
	stopped := e.stopped
	m.mu.Unlock()
	if stopped {
		return stoppedError(e)
	}
	return contract.AsError(err, fallback)
}

// List serves list: every sandbox the Manager knows, live ones and
// recently stopped ones (stopped: true), oldest first.
func (m *Manager) List(context.Context, *contract.ListRequest) (*contract.ListResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg == nil {
		return nil, m.notConfigured()
	}
	now := m.now()
	m.pruneLocked(now)
	entries := make([]*entry, 0, len(m.sandboxes))
	for _, e := range m.sandboxes {
		entries = append(entries, e)
	}
	sort.Slice(entries, func(i, j int) bool {
		if !entries[i].created.Equal(entries[j].created) {
			return entries[i].created.Before(entries[j].created)
		}
		return entries[i].id < entries[j].id
	})
	out := &contract.ListResponse{Sandboxes: make([]contract.ListEntry, 0, len(entries))}
	slots := m.cfg.ExecSlots()
	for _, e := range entries {
		le := contract.ListEntry{
			SandboxID:      e.id,
			Name:           e.name,
			Image:          e.image,
			AgeSecs:        uint64(max(now.Sub(e.created), 0) / time.Second),
			ExecInProgress: e.execs > 0,
			ExecInFlight:   e.execs,
			Stopped:        e.stopped,
			Paused:         e.paused && !e.stopped,
		}
		if !e.stopped && !le.Paused && e.execs < slots {
			le.ExecSlotsFree = slots - e.execs
		}
		out.Sandboxes = append(out.Sandboxes, le)
	}
	return out, nil
}

// Stop serves stop: S002 unknown, S004 already stopped; with wait it
// returns once the provider reports the sandbox gone.
func (m *Manager) Stop(ctx context.Context, req *contract.StopRequest) (*contract.StopResponse, error) {
	m.mu.Lock()
	if m.cfg == nil {
		m.mu.Unlock()
		return nil, m.notConfigured()
	}
	e, ok := m.sandboxes[req.SandboxID]
	if !ok {
		m.mu.Unlock()
		return nil, contract.NewError(contract.S002, "sandbox %s not found: it was never created by this adapter, or was stopped long ago", req.SandboxID)
	}
	if !m.markStoppedLocked(e, "stopped by sandbox::stop") {
		m.mu.Unlock()
		return nil, stoppedError(e)
	}
	m.mu.Unlock()
	if err := m.stopSandbox(ctx, e, req.Wait); err != nil {
		return nil, err
	}
	m.log.Info("sandbox stopped", "sandbox_id", e.id, "wait", req.Wait)
	return &contract.StopResponse{SandboxID: e.id, Stopped: true}, nil
}

// stopSandbox stops a sandbox whose stop the caller has claimed.
func (m *Manager) stopSandbox(ctx context.Context, e *entry, wait bool) error {
	if err := e.sb.Stop(ctx, wait); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return contract.AsError(err, contract.S300)
	}
	if !wait {
		return nil
	}
	select {
	case <-e.sb.Done():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown stops every live sandbox and everything the Manager started.
// Sandboxes stop in parallel; Shutdown returns when all are stopped or ctx
// ends. It may be called more than once.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	if !m.closed {
		m.closed = true
		if m.stopReaper != nil {
			close(m.stopReaper)
		}
	}
	keep := m.keepsSandboxes()
	var victims []*entry
	for _, e := range m.sandboxes {
		if m.markStoppedLocked(e, "the adapter shut down") {
			victims = append(victims, e)
		}
	}
	m.mu.Unlock()

	errs := make([]error, len(victims))
	var stops sync.WaitGroup
	var detached atomic.Int32
	for i, e := range victims {
		stops.Add(1)
		go func() {
			defer stops.Done()
			if d, ok := e.sb.(Detachable); ok && keep {
				// The next adapter process adopts it (adopt.go).
				err := d.Detach(ctx, time.Unix(0, e.lastOp.Load()))
				if err == nil {
					detached.Add(1)
					return
				}
				m.log.Warn("could not detach a sandbox; stopping it", "sandbox_id", e.id, "error", err)
			}
			if err := e.sb.Stop(ctx, true); err != nil {
				errs[i] = fmt.Errorf("stop sandbox %s: %w", e.id, err)
			}
		}()
	}
	stops.Wait()
	if n := int(detached.Load()); n > 0 {
		m.log.Info("left every sandbox running for the next adapter process", "count", n)
	}
	if n := len(victims) - int(detached.Load()); n > 0 {
		m.log.Info("stopped every sandbox for shutdown", "count", n)
	}

	done := make(chan struct{})
	go func() {
		m.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("waiting for the adapter's background work: %w", ctx.Err()))
	}
	return errors.Join(errs...)
}
