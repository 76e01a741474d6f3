package adapter

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/boot"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/catalog"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/consolelog"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/runner"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/workervm"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

// Name and Version identify the adapter. The 0.3 line implements sandbox
// contract 1.1 (the 0.2 line was contract 1.0); 0.3.1 is the first release
// that never exposes the project token to VM workers (the 0.26 upgrade
// guide), and what `compose::add worker=iii-sandbox` pins with '^0.3'.
const (
	Name    = "sandbox-libkrun"
	Version = "0.3.1"
)

// AgentName is the guest agent binary's file name for arch, as it is
// shipped beside the adapter (boot.AgentName).
func AgentName(arch string) string { return boot.AgentName(arch) }

// Options configure a Provider.
type Options struct {
	Log hclog.Logger
	// Executable is the adapter binary runners are started from; empty
	// means os.Executable().
	Executable string
	// Home is the user's home directory, for the defaults under ~/.iii;
	// empty means os.UserHomeDir().
	Home string
	// Steps replaces the boot pipeline (tests); nil means
	// DefaultBootSteps().
	Steps boot.BootSteps
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Provider is sandbox-libkrun's sandboxkit.Provider: it boots each sandbox
// as a microVM under its own runner process.
type Provider struct {
	log   hclog.Logger
	exe   string
	home  string
	steps boot.BootSteps
	now   func() time.Time

	// Set once by Configure. cfg's keys that need a restart to change
	// are the current ones; read those a reload changes from current().
	cfg   *config.Config
	store *images.Store
	// live is the configuration as last reloaded (reconfigure.go).
	live atomic.Pointer[config.Config]

	// bg ends with Shutdown; selection attempts run under it.
	bg       context.Context
	bgCancel context.CancelFunc

	mu sync.Mutex
	// The back-end selection: sel once it succeeded; selErr is the last
	// failure; selRun is closed when the attempt under way ends.
	sel    *boot.Selection
	selErr error
	selRun chan struct{}
	// sandboxes are the booted ones whose clean-up has not finished, for
	// Shutdown.
	sandboxes map[*sandbox]struct{}
	leftovers []runner.Leftover
	// adopted are the sandboxes Configure took over from an earlier
	// adapter process, until the kit collects them (adopt.go).
	adopted []sandboxkit.Adopted
	closed  bool
	// workers are the worker VMs (worker::*), set by Configure.
	workers *workervm.Set
	// kit and catalog are the kit's configuration (ConfigureKit), for
	// the warm pool; pool is nil without warm_pool.
	kit     *sandboxkit.Config
	catalog []contract.CatalogImage
	pool    *boot.WarmPool
	// templates is nil without snapshot_templates.
	templates *boot.Templates
}

var (
	_ sandboxkit.Provider      = (*Provider)(nil)
	_ sandboxkit.KitConfigurer = (*Provider)(nil)
	_ sandboxkit.Reconfigurer  = (*Provider)(nil)
)

// current is the configuration as last reloaded: where the keys a reload
// changes are read (reconfigure.go). Before Configure, and for a Provider
// a test built by hand, it is cfg.
func (p *Provider) current() *config.Config {
	if c := p.live.Load(); c != nil {
		return c
	}
	return p.cfg
}

// ConfigureKit implements sandboxkit.KitConfigurer: the warm pool checks
// its images against the catalog and the allowlist and boots them in the
// default shape.
func (p *Provider) ConfigureKit(cfg *sandboxkit.Config, catalog []contract.CatalogImage) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.kit, p.catalog = cfg, catalog
}

// NewProvider returns a Provider; it does nothing until Configure.
func NewProvider(opts Options) (*Provider, error) {
	p := &Provider{log: opts.Log, exe: opts.Executable, home: opts.Home, steps: opts.Steps, now: opts.Now, sandboxes: map[*sandbox]struct{}{}}
	if p.log == nil {
		p.log = hclog.NewNullLogger()
	}
	if p.exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find the adapter's own binary (runners are started from it): %w", err)
		}
		p.exe = exe
	}
	if p.home == "" {
		// No home is fine when state_dir and cache_dir are set.
		p.home, _ = os.UserHomeDir()
	}
	if p.steps == nil {
		p.steps = boot.DefaultBootSteps()
	}
	if p.now == nil {
		p.now = time.Now
	}
	p.bg, p.bgCancel = context.WithCancel(context.Background())
	return p, nil
}

// Presets implements sandboxkit.Provider: the catalog package's presets,
// so the list lives in one place.
func (p *Provider) Presets() []contract.CatalogImage {
	var out []contract.CatalogImage
	for _, e := range catalog.Presets() {
		out = append(out, contract.CatalogImage{Name: e.Name, OCIRef: e.OCIRef})
	}
	return out
}

// Configure implements sandboxkit.Provider: it parses the adapter's keys,
// opens the image cache, cleans what a crashed earlier run left in
// state_dir, and starts choosing the back end in the background (the
// first create waits for it).
func (p *Provider) Configure(ctx context.Context, keys map[string]json.RawMessage) error {
	cfg, err := config.ParseConfig(keys, p.home, config.HostGOOS())
	if err != nil {
		return err
	}
	store, err := images.Open(images.Options{Root: cfg.CacheDir, Mirrors: cfg.RegistryMirrors, Logger: p.log})
	if err != nil {
		// The store checks the mirror URLs; its message names the
		// mirror key it refused.
		key := config.KeyCacheDir
		if strings.HasPrefix(err.Error(), config.KeyRegistryMirrors) {
			key = config.KeyRegistryMirrors
		}
		return &config.ConfigError{Key: key, Reason: err.Error()}
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		_ = store.Close()
		return &config.ConfigError{Key: config.KeyStateDir, Reason: err.Error()}
	}
	var pool *boot.WarmPool
	if len(cfg.WarmPool) > 0 {
		p.mu.Lock()
		kit, catalog := p.kit, p.catalog
		p.mu.Unlock()
		err := config.Err(config.KeyWarmPool, "needs the kit's configuration (the catalog and the allowlist)")
		if kit != nil {
			err = config.CheckWarmPool(cfg.WarmPool, catalog, kit.Allowed)
		}
		if err != nil {
			_ = store.Close()
			return err
		}
		pool = boot.NewWarmPool(p.host(), cfg.WarmPool, kit, catalog)
	}
	// Adopt first: what an earlier adapter process left running or
	// paused is taken over; only the rest is a leftover to clean.
	adopted := p.adoptAll(ctx, cfg)
	leftovers := runner.CleanLeftovers(ctx, cfg.StateDir, p.log)
	templates := boot.NewTemplates(p.host(), cfg)
	templates.CleanLeftovers(ctx)
	workers := workervm.New(ctx, p.host(), p.KeepsSandboxes, cfg)

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg != nil || p.closed {
		_ = store.Close()
		return errors.New("the provider is already configured or shut down")
	}
	p.cfg, p.store, p.leftovers, p.workers, p.pool = cfg, store, leftovers, workers, pool
	p.live.Store(cfg)
	p.adopted = adopted
	p.templates = templates
	p.startSelectionLocked()
	if pool != nil {
		go pool.Run(p.bg)
	}
	return nil
}

// startSelectionLocked starts a selection attempt unless one is running.
func (p *Provider) startSelectionLocked() chan struct{} {
	if p.selRun != nil {
		return p.selRun
	}
	done := make(chan struct{})
	p.selRun = done
	go func() {
		start := p.now()
		sel, err := boot.Select(p.bg, p.host())
		p.mu.Lock()
		defer p.mu.Unlock()
		switch {
		case err != nil && p.bg.Err() != nil:
			p.selErr = contract.NewError(contract.S300, "the sandbox adapter is shutting down")
		case err != nil:
			p.selErr = err
			p.log.Error("no usable VM back end", "error", err.Error())
		default:
			p.sel, p.selErr = sel, nil
			p.log.Info("VM back end chosen", "hypervisor", sel.Backend, "accel", sel.Accel, "kernel", sel.Kernel.Path,
				"skipped", sel.Skipped, "probe_cached", sel.ProbeCached, "ms", p.now().Sub(start).Milliseconds())
		}
		p.selRun = nil
		close(done)
	}()
	return done
}

// selected waits for the back-end selection. A failed selection is tried
// again by the next caller: the operator may have installed what was
// missing.
func (p *Provider) selected(ctx context.Context) (*boot.Selection, error) {
	p.mu.Lock()
	if p.sel != nil {
		s := p.sel
		p.mu.Unlock()
		return s, nil
	}
	if p.closed {
		p.mu.Unlock()
		return nil, contract.NewError(contract.S300, "the sandbox adapter is shutting down")
	}
	done := p.startSelectionLocked()
	p.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sel != nil {
		return p.sel, nil
	}
	if p.selErr == nil {
		return nil, contract.NewError(contract.S300, "the sandbox adapter is shutting down")
	}
	return nil, contract.AsError(p.selErr, contract.S300)
}

// Info implements sandboxkit.Provider. It never waits: while the back end
// is being chosen, backend_state says so.
func (p *Provider) Info(context.Context) map[string]any {
	m := map[string]any{"isolation": "microvm"}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg == nil {
		m["backend_state"] = "unconfigured"
		return m
	}
	cur := p.current()
	m["state_dir"] = p.cfg.StateDir
	m["cache_dir"] = p.cfg.CacheDir
	m["hypervisor_config"] = p.cfg.Hypervisor
	m["accel_config"] = p.cfg.Accel
	m["boot_timeout_ms"] = cur.BootTimeout.Milliseconds()
	m["adopt_grace_ms"] = cur.AdoptGrace.Milliseconds()
	m["live_vms"] = len(p.sandboxes)
	m["host_roots"] = p.workers.Roots()
	m["network_allow_cidrs"] = append([]string{}, p.cfg.NetworkAllowCIDRs...)
	m["network_dns_servers"] = append([]string{}, cur.NetworkDNSServers...)
	m["console_log_max_kb"] = cmp.Or(cur.ConsoleLogMaxBytes, consolelog.DefaultMaxBytes) >> 10
	if p.pool != nil {
		m["warm_pool"] = p.pool.Info()
	} else {
		m["warm_pool"] = map[string]any{}
	}
	m["snapshot_templates"] = p.templates.Info()
	if len(p.leftovers) > 0 {
		m["leftovers_cleaned"] = len(p.leftovers)
	}
	switch {
	case p.sel != nil:
		m["backend_state"] = "ready"
		for k, v := range p.sel.Facts() {
			m[k] = v
		}
	case p.selRun != nil:
		m["backend_state"] = "selecting"
		if p.selErr != nil {
			m["backend_error"] = p.selErr.Error()
		}
	case p.selErr != nil:
		m["backend_state"] = "failed"
		m["backend_error"] = p.selErr.Error()
	}
	return m
}

// Boot implements sandboxkit.Provider: it runs the boot pipeline.
func (p *Provider) Boot(ctx context.Context, spec sandboxkit.BootSpec) (sandboxkit.Sandbox, error) {
	p.mu.Lock()
	if p.cfg == nil || p.closed {
		p.mu.Unlock()
		return nil, contract.NewError(contract.S300, "the sandbox adapter is not configured or is shutting down")
	}
	pool := p.pool
	p.mu.Unlock()
	b := pool.ClaimFor(ctx, spec)
	if b == nil {
		var err error
		if b, err = boot.Cold(ctx, p.host(), spec); err != nil {
			return nil, err
		}
	}
	sb := newSandbox(p, b)
	sb.rec = sandboxRecord{
		Format: recordFormat, SandboxID: spec.ID, Name: spec.Name, Image: spec.Image.Name,
		Backend: b.Selection.Backend, Created: p.now().UTC(), IdleTimeout: spec.IdleTimeout.Milliseconds(),
		Network: spec.Network, Env: b.Env, Workdir: b.Workdir,
	}
	if err := sb.writeRecord(sb.rec); err != nil {
		// The sandbox works; it only cannot outlive this adapter.
		p.log.Warn("could not record the sandbox for the next adapter process", "sandbox_id", spec.ID, "error", err)
	}
	args := []any{"sandbox_id", spec.ID, "image", spec.Image.Name, "pooled", b.Pooled, "restored", b.Restored()}
	for _, st := range b.Timings {
		args = append(args, st.Step+"_ms", st.Duration.Milliseconds())
	}
	p.log.Info("sandbox VM ready", args...)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		b.Rollback()
		return nil, contract.NewError(contract.S300, "the sandbox adapter is shutting down")
	}
	p.sandboxes[sb] = struct{}{}
	p.mu.Unlock()
	return sb, nil
}

// forget drops a stopped sandbox.
func (p *Provider) forget(sb *sandbox) {
	p.mu.Lock()
	delete(p.sandboxes, sb)
	p.mu.Unlock()
}

// closing marks the provider as shutting down: no new boots, and stops
// skip the guest's graceful power-off (the host gives an adapter only a
// couple of seconds to exit before it kills it).
func (p *Provider) closing() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.bgCancel()
}

func (p *Provider) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Shutdown stops every sandbox and waits for each one's clean-up (also of
// those the kit already stopped without waiting), ends the back-end
// selection and closes the image cache.
func (p *Provider) Shutdown(ctx context.Context) error {
	p.closing()
	p.mu.Lock()
	var live []*sandbox
	for sb := range p.sandboxes {
		live = append(live, sb)
	}
	run := p.selRun
	workers := p.workers
	pool := p.pool
	templates := p.templates
	p.mu.Unlock()
	errs := make([]error, len(live)+2)
	var wg sync.WaitGroup
	if workers != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[len(live)] = workers.Shutdown(ctx)
		}()
	}
	if pool != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[len(live)+1] = pool.Shutdown(ctx)
		}()
	}
	for i, sb := range live {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = sb.Stop(ctx, true)
		}()
	}
	wg.Wait()
	errs = append(errs, templates.Wait(ctx))
	if run != nil {
		select {
		case <-run:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("waiting for the back-end selection to end: %w", ctx.Err()))
		}
	}
	if p.store != nil {
		_ = p.store.Close()
	}
	return errors.Join(errs...)
}

// Adapter is the complete sandbox-libkrun adapter: the kit's Manager over a
// Provider, and a Shutdown that stops both.
type Adapter struct {
	*sandboxkit.Manager
	provider *Provider
}

// New builds the adapter.
func New(opts Options) (*Adapter, error) {
	p, err := NewProvider(opts)
	if err != nil {
		return nil, err
	}
	m := sandboxkit.New(p, sandboxkit.Options{
		Name:               Name,
		Version:            Version,
		Logger:             opts.Log,
		ProviderConfigKeys: config.ConfigKeys(),
	})
	return &Adapter{Manager: m, provider: p}, nil
}

// Provider returns the adapter's provider.
func (a *Adapter) Provider() *Provider { return a.provider }

// Shutdown stops every sandbox and what the adapter started.
func (a *Adapter) Shutdown(ctx context.Context) error {
	a.provider.closing()
	return errors.Join(a.Manager.Shutdown(ctx), a.provider.Shutdown(ctx))
}
