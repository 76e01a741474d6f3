// Package server boots an engine from config.yaml and keeps it in step with
// the file.
//
// Start reads the file (creating it when missing), creates the engine,
// attaches the configuration worker, the plugin host (which runs sandbox
// adapters as go-plugin subprocesses, engine::adapters::*) and the
// iii-sandbox router (sandbox::*, bound by the sandbox: section), and
// starts the iii-worker-manager listeners. Serve then watches the file: a valid change reloads only what
// it affects (listeners are rebound one by one, the configuration worker
// moves to its new directory, the sandbox binding is swapped); an invalid
// change stops the engine, so it never runs with a configuration that
// differs from the file on disk (spec iii-0.26 §3.1).
package server

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/host/config"
	"github.com/iii-sandbox/iii/host/configuration"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/host/router"
	"github.com/iii-sandbox/iii/host/workermanager"
	"github.com/iii-sandbox/iii/internal/exepages"
	"github.com/iii-sandbox/iii/internal/idletrim"
)

// Options configure Run.
type Options struct {
	ConfigPath  string    // default "config.yaml"
	Interactive bool      // true when stdin is a terminal: ask before creating a missing file
	Stdin       io.Reader // answers to the creation prompt
	Stderr      io.Writer // the reason the engine stopped, for humans
	Logger      hclog.Logger
	Version     string
	// Finder is where the adapter the sandbox: section binds is looked
	// for (the plugin host's search order); the zero value searches the
	// engine's environment (LookupEnv).
	Finder pluginhost.Finder
	// AdapterByCompose is set for the engine `iii compose --up` starts
	// from an engine: section: Compose starts the adapter it binds, from
	// the locked package and with its layered configuration, so the
	// engine does not start it first.
	AdapterByCompose bool
	// LookupEnv is the engine's environment: ${VAR} in config.yaml,
	// III_ENGINE_TOKEN, III_NAMESPACE_GRACE_MS, III_ENGINE_CREDENTIALS_FILE
	// and HOME, under which ~/.iii holds the token and credentials files;
	// Finder's unset functions read III_PLUGIN_PATH and the home from it.
	// nil: the process's environment, and os.UserHomeDir for the home.
	// Tests give each engine its own, so that engines run side by side.
	LookupEnv func(string) (string, bool)

	// comebackDelay replaces bindingComebackDelay (zero: that); tests
	// shorten it so that waiting past it is cheap.
	comebackDelay time.Duration
}

const (
	// DefaultConfigPath is read when Options.ConfigPath is empty.
	DefaultConfigPath = "config.yaml"
	// GraceEnv overrides registration_namespace_grace_ms.
	GraceEnv = "III_NAMESPACE_GRACE_MS"
	// watchInterval is how often the file is checked. A change is applied
	// once two checks in a row see the same content, so an editor's
	// half-written save is never read.
	watchInterval = 500 * time.Millisecond
	// shutdownTimeout bounds the clean stop once the caller's context has
	// ended.
	shutdownTimeout = 10 * time.Second
	maxGraceMS      = 3_600_000
)

// Run serves until ctx ends (clean stop, nil error) or the configuration
// becomes invalid (the error says why).
func Run(ctx context.Context, opts Options) error {
	s, err := Start(ctx, opts)
	if err != nil {
		return err
	}
	// What start-up allocated and dropped (the parsed config, schemas,
	// the YAML tree) would otherwise stay resident until the runtime's
	// background scavenger returns it, minutes later if ever (about
	// 1.7 MiB), and so would the pages of the binary that only start-up
	// touched (package initialisers, parsing, schema compilation: about
	// 14 MiB of the idle engine's 18 MiB of file-backed pages; BENCHMARKS.md
	// P7). They stay in the page cache; what the engine uses again maps
	// back at a minor fault.
	s.trim("start-up")
	// And again each time the engine goes quiet after work: the pages and
	// heap the calls used stay resident otherwise (P7 after use).
	trimCtx, stopTrim := context.WithCancel(ctx)
	trimDone := make(chan struct{})
	go func() {
		defer close(trimDone)
		idletrim.Run(trimCtx, idletrim.DefaultPolicy(), idletrim.ProcessCPU, func() { s.trim("idle") })
	}()
	defer func() { stopTrim(); <-trimDone }()
	return s.Serve(ctx)
}

// trim gives back what the engine no longer uses: freed heap and the
// binary's pages that what came before (start-up, the last calls)
// touched.
func (s *Server) trim(after string) {
	debug.FreeOSMemory()
	n, err := exepages.Release()
	if err != nil {
		s.log.Debug("could not release the binary's pages", "after", after, "error", err)
		return
	}
	s.log.Debug("released freed heap and the binary's pages", "after", after, "bytes", n)
}

// Server is a running engine assembled from config.yaml.
type Server struct {
	opts   Options
	path   string
	log    hclog.Logger
	lookup config.LookupFunc

	eng *engine.Engine
	wm  atomic.Pointer[workermanager.Manager]
	ph  *pluginhost.Host
	rt  *router.Router
	// trust is the router's rules on adapter names and sandbox host
	// credentials, installed into eng before anything else touches it.
	trust *router.Trust

	mu  sync.Mutex
	cfg *config.Config
	cw  *configuration.Worker
	// fileToken is the token of ~/.iii/engine-token once read (only when
	// neither III_ENGINE_TOKEN nor engine_token sets one).
	fileToken string
	// fileState is the hash of the content cfg was read from.
	fileState string

	sandbox atomic.Pointer[config.Sandbox]

	// stream is the iii-stream worker (stream.go).
	stream streamState

	// adapterMu orders the engine's starts and stops of the bound
	// adapter (at start and on reloads).
	adapterMu sync.Mutex
	// loaded is the binding whose adapter the engine started (nil: none);
	// missing is why the bound adapter could not be started ("" when it
	// was, or nothing is bound).
	loaded  *config.Sandbox
	missing atomic.Pointer[string]
	// comebacks are the pending returns of the bound adapter
	// (adapterStopped); closing ends them.
	comebacks sync.WaitGroup
	closing   chan struct{}

	closeOnce sync.Once
	closeErr  error
}

// Start loads the config and brings the engine up. On error nothing is
// left running.
func Start(ctx context.Context, opts Options) (*Server, error) {
	s := &Server{opts: opts, path: opts.ConfigPath, log: opts.Logger, lookup: opts.LookupEnv, closing: make(chan struct{})}
	if s.lookup == nil {
		s.lookup = os.LookupEnv
	}
	if opts.LookupEnv != nil {
		if s.opts.Finder.Getenv == nil {
			s.opts.Finder.Getenv = func(k string) string { v, _ := opts.LookupEnv(k); return v }
		}
		if s.opts.Finder.HomeDir == nil {
			s.opts.Finder.HomeDir = s.home
		}
	}
	if s.path == "" {
		s.path = DefaultConfigPath
	}
	if s.log == nil {
		s.log = hclog.NewNullLogger()
	}
	if s.opts.Stderr == nil {
		s.opts.Stderr = io.Discard
	}
	created, err := config.EnsureFile(ctx, s.path, config.EnsureOptions{Interactive: opts.Interactive, In: opts.Stdin, Out: s.opts.Stderr})
	if err != nil {
		return nil, err
	}
	if created {
		s.log.Info("created a config file with no workers", "path", s.path)
	}
	data, err := config.ReadFile(s.path)
	if err != nil {
		return nil, err
	}
	cfg, err := config.ParseFile(s.path, data, s.lookup)
	if err != nil {
		return nil, err
	}
	grace, err := s.grace(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.ensureTokenFile(cfg); err != nil {
		return nil, err
	}
	s.cfg, s.fileState = cfg, stateOf(data, nil)
	s.eng = engine.New(engine.Options{Logger: s.log.Named("engine"), Version: opts.Version, NamespaceGrace: grace, AdminToken: s.engineToken})
	// The trust rules come first: the sandbox: binding and the persisted
	// sandbox host credentials below are judged by them.
	if s.trust, err = router.NewTrust(s.eng); err != nil {
		s.closeEngine()
		return nil, err
	}
	s.setSandbox(cfg.Sandbox)
	s.loadCredentials()
	s.syncHTTPFunctions(nil, cfg.HTTPFunctions)
	if s.cw, err = s.startConfiguration(ctx, cfg.Configuration); err != nil {
		s.closeEngine()
		return nil, err
	}
	// Both attach before any listener accepts a worker, so their names
	// and sandbox::* are the engine's from the first moment.
	if s.ph, err = pluginhost.New(s.eng, pluginhost.Options{Logger: s.log.Named("engine"), Finder: s.opts.Finder, OnConfig: s.storeAdapterConfig, OnStopped: s.adapterStopped, Token: s.engineToken,
		Warnings: s.bindingWarnings}); err != nil {
		s.abortStart()
		return nil, err
	}
	// Installed adapters' names are theirs before any worker connects
	// (docs/security.md, Adapter names).
	for _, a := range s.ph.Installed() {
		s.trust.Reserve(a)
	}
	if s.rt, err = router.New(s.eng, router.Options{
		Logger:        s.log.Named(router.WorkerName),
		ConfigBinding: s.sandboxBinding,
		Hosted:        s.ph.Hosted,
		EngineURL:     s.engineURL,
		NotInstalled:  s.notInstalled,
		Trust:         s.trust,
	}); err != nil {
		s.abortStart()
		return nil, err
	}
	// The bound adapter runs before any listener accepts a caller, so the
	// first sandbox::* call finds it.
	s.syncAdapter(ctx, cfg.Sandbox)
	if err := s.syncStream(ctx, cfg.Stream); err != nil {
		s.abortStart()
		return nil, err
	}
	s.stripSeededStreamBlock(ctx)
	wm := workermanager.New(s.eng, s.log.Named("iii-worker-manager"))
	s.wm.Store(wm)
	if err := wm.Apply(ctx, cfg.Listeners); err != nil {
		s.abortStart()
		return nil, err
	}
	s.log.Info("engine started", "config", s.path, "version", opts.Version)
	return s, nil
}

// grace is the namespace grace time: the engine's environment wins over
// the file.
func (s *Server) grace(cfg *config.Config) (time.Duration, error) {
	v, ok := s.lookup(GraceEnv)
	if !ok || v == "" {
		return cfg.NamespaceGrace, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 1 || ms > maxGraceMS {
		return 0, &config.Error{Code: config.CodeInvalidConfig, Message: fmt.Sprintf(
			"%s=%q is not a whole number of milliseconds from 1 to %d; fix or unset it (it overrides registration_namespace_grace_ms)", GraceEnv, v, maxGraceMS)}
	}
	return time.Duration(ms) * time.Millisecond, nil
}

func (s *Server) startConfiguration(ctx context.Context, c config.Configuration) (*configuration.Worker, error) {
	cw := configuration.New(configuration.Options{
		Logger:  s.log.Named("configuration"),
		Version: s.opts.Version,
		Lookup:  s.workerLookup,
		Store:   configuration.NewFSStore(configuration.FSOptions{Dir: c.Directory}),
		Name:    c.Name,
		TTL:     c.TTL,
	})
	if err := cw.Open(ctx); err != nil {
		return nil, err
	}
	if err := cw.Attach(s.eng); err != nil {
		cw.Close()
		return nil, err
	}
	return cw, nil
}

// Engine is the running engine (for in-process workers such as the
// sandbox router).
func (s *Server) Engine() *engine.Engine { return s.eng }

// PluginHost runs sandbox adapters as go-plugin subprocesses (the Go API
// behind engine::adapters::*).
func (s *Server) PluginHost() *pluginhost.Host { return s.ph }

// Router is the iii-sandbox router. It follows the sandbox: section across
// reloads; Router().Bind overrides the section (Compose binds the engines
// it manages this way).
func (s *Server) Router() *router.Router { return s.rt }

// sandboxBinding is the router's view of the sandbox: section.
func (s *Server) sandboxBinding() (router.Binding, bool) {
	b := s.sandbox.Load()
	if b == nil {
		return router.Binding{}, false
	}
	return router.Binding{Adapter: b.Adapter, Namespace: b.Namespace, Hosts: b.Hosts}, true
}

// engineURL is the worker address S301 hints print: the
// iii-worker-manager listener (else the first by name), with a wildcard
// host replaced by loopback.
func (s *Server) engineURL() string {
	wm := s.wm.Load()
	if wm == nil {
		return ""
	}
	addrs := wm.Addrs()
	addr, ok := addrs["iii-worker-manager"]
	if !ok {
		names := make([]string, 0, len(addrs))
		for n := range addrs {
			names = append(names, n)
		}
		if len(names) == 0 {
			return ""
		}
		slices.Sort(names)
		addr = addrs[names[0]]
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "ws://" + net.JoinHostPort(host, port)
}

// Configuration is the configuration worker (for SetInMemory and the Go
// API).
func (s *Server) Configuration() *configuration.Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cw
}

// Sandbox is the current top-level sandbox: binding, or nil when the file
// has none (sandbox::* then fails with S303). It follows reloads.
func (s *Server) Sandbox() *config.Sandbox {
	if b := s.sandbox.Load(); b != nil {
		c := *b
		return &c
	}
	return nil
}

func (s *Server) setSandbox(b *config.Sandbox) {
	if b == nil {
		s.sandbox.Store(nil)
		return
	}
	s.eng.SetHostHeartbeat(time.Duration(b.HostHeartbeatMS) * time.Millisecond)
	c := *b
	// The bound adapter's names are its own, running or not.
	s.trust.Reserve(c.Adapter)
	s.sandbox.Store(&c)
}

// Config is the configuration in force.
func (s *Server) Config() config.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return *s.cfg
}

// Addrs maps each listener to its bound address (host:port).
func (s *Server) Addrs() map[string]string { return s.wm.Load().Addrs() }

// Serve watches the config file until ctx ends (then it stops everything
// and returns nil) or the file becomes invalid (then it stops everything,
// writes the reason to Options.Stderr and returns it).
func (s *Server) Serve(ctx context.Context) error {
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	pending := ""
	for {
		select {
		case <-ctx.Done():
			return s.Close()
		case <-t.C:
		}
		data, readErr := os.ReadFile(s.path)
		state := stateOf(data, readErr)
		if state == s.currentState() {
			pending = ""
			continue
		}
		if state != pending {
			pending = state
			continue
		}
		pending = ""
		if err := s.reload(ctx, data, readErr, state); err != nil {
			return s.fail(err)
		}
	}
}

// stateOf identifies what a read of the file returned.
func stateOf(data []byte, err error) string {
	if err != nil {
		return "error:" + err.Error()
	}
	sum := sha256.Sum256(data)
	return string(sum[:])
}

func (s *Server) currentState() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fileState
}

// reload applies a changed file, touching only what changed.
func (s *Server) reload(ctx context.Context, data []byte, readErr error, state string) error {
	if readErr != nil {
		if errors.Is(readErr, os.ErrNotExist) {
			return &config.Error{Code: config.CodeConfigNotFound, Message: fmt.Sprintf("%s was removed while the engine ran; restore it and start the engine again", s.path)}
		}
		return &config.Error{Code: config.CodeConfigUnreadable, Message: fmt.Sprintf("cannot read %s: %v", s.path, readErr)}
	}
	next, err := config.ParseFile(s.path, data, s.lookup)
	if err != nil {
		return err
	}
	if err := s.ensureTokenFile(next); err != nil {
		return err
	}
	s.mu.Lock()
	prev := s.cfg
	s.mu.Unlock()

	if !sameListeners(prev.Listeners, next.Listeners) {
		if err := s.wm.Load().Apply(ctx, next.Listeners); err != nil {
			return err
		}
	}
	if prev.Configuration != next.Configuration {
		if err := s.reloadConfiguration(ctx, prev.Configuration, next.Configuration); err != nil {
			return err
		}
	}
	if !sameSandbox(prev.Sandbox, next.Sandbox) {
		// The new adapter is up before the router points at it.
		s.syncAdapter(ctx, next.Sandbox)
		s.setSandbox(next.Sandbox)
		if next.Sandbox == nil {
			s.log.Info("sandbox binding removed; sandbox::* calls fail with S303")
		} else {
			s.log.Info("sandbox binding changed", "adapter", next.Sandbox.Adapter, "namespace", next.Sandbox.Namespace)
		}
	}
	if err := s.syncStream(ctx, next.Stream); err != nil {
		return err
	}
	s.syncHTTPFunctions(prev.HTTPFunctions, next.HTTPFunctions)
	if prev.NamespaceGrace != next.NamespaceGrace {
		if _, overridden := s.lookup(GraceEnv); !overridden {
			// The engine reads the grace time when it starts; changing it
			// needs a restart.
			s.log.Warn("registration_namespace_grace_ms changed; it takes effect when the engine restarts")
		}
	}
	s.mu.Lock()
	s.cfg, s.fileState = next, state
	s.mu.Unlock()
	s.log.Info("config reloaded", "path", s.path)
	return nil
}

func (s *Server) reloadConfiguration(ctx context.Context, prev, next config.Configuration) error {
	if prev.Name != next.Name {
		// The worker's name is its identity in the engine: replace it.
		// Owners register their schemas again when they reconnect.
		s.mu.Lock()
		old := s.cw
		s.mu.Unlock()
		old.Close()
		cw, err := s.startConfiguration(ctx, next)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.cw = cw
		s.mu.Unlock()
		// The stream worker's entry and its watch were the old worker's.
		s.streamConfigurationReplaced(ctx)
		return nil
	}
	if prev.TTL != next.TTL {
		s.Configuration().SetTTL(next.TTL)
	}
	if prev.Directory != next.Directory {
		s.mu.Lock()
		cw := s.cw
		s.mu.Unlock()
		return cw.SwapStore(ctx, configuration.NewFSStore(configuration.FSOptions{Dir: next.Directory}))
	}
	return nil
}

func sameListeners(a, b []config.Listener) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func sameSandbox(a, b *config.Sandbox) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// fail stops the engine because the file can no longer be applied.
func (s *Server) fail(reason error) error {
	fmt.Fprintf(s.opts.Stderr, "engine stopped: %s changed and cannot be applied, and the engine never runs with a configuration that differs from the file.\n%v\n", s.path, reason)
	s.log.Error("engine stopped: config change cannot be applied", "path", s.path, "error", reason)
	if err := s.Close(); err != nil {
		s.log.Error("stop", "error", err)
	}
	return fmt.Errorf("engine stopped: %w", reason)
}

// Close stops the listeners, every sandbox adapter (no adapter process
// outlives it), the router, the configuration worker and the engine.
// Serve calls it; call it directly only when Serve was never called.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.shutdown()
		if s.closeErr == nil {
			s.log.Info("engine stopped")
		}
	})
	return s.closeErr
}

// shutdown runs with its own bounded context: the caller's has usually
// ended already (that is why we stop), yet in-flight work deserves a
// moment to finish.
// abortStart undoes a start that failed part way. The start's error is
// what the caller hears; what the undoing met goes to the log.
func (s *Server) abortStart() {
	if err := s.shutdown(); err != nil {
		s.log.Warn("stopping what had started after the engine failed to start", "error", err)
	}
}

func (s *Server) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	close(s.closing)
	s.comebacks.Wait()
	var errs []error
	if wm := s.wm.Load(); wm != nil {
		errs = append(errs, wm.Close(ctx))
	}
	// Adapters stop before the engine: their calls in flight end with
	// S301, and the engine's close then finds nothing of theirs.
	if s.ph != nil {
		errs = append(errs, s.ph.Close(ctx))
	}
	if s.rt != nil {
		s.rt.Close()
	}
	errs = append(errs, s.closeStream(ctx))
	s.mu.Lock()
	cw := s.cw
	s.mu.Unlock()
	if cw != nil {
		cw.Close()
	}
	s.stopHTTPFunctions()
	errs = append(errs, s.closeEngineCtx(ctx))
	return errors.Join(errs...)
}

func (s *Server) closeEngine() {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	_ = s.closeEngineCtx(ctx)
}

func (s *Server) closeEngineCtx(ctx context.Context) error {
	if s.eng == nil {
		return nil
	}
	if err := s.eng.Close(ctx); err != nil && !errors.Is(err, engine.ErrClosed) {
		return fmt.Errorf("close engine: %w", err)
	}
	return nil
}

// storeAdapterConfig keeps the configuration an adapter starts with as the
// in-memory configuration entry <namespace>-<adapter>: configuration::get
// reads it, nothing writes it to disk, and configuration::set on it fails
// NOT_REGISTERED (the 0.26 upgrade guide). Compose layers config_override
// over this entry, so a removed key keeps its value.
func (s *Server) storeAdapterConfig(adapter, namespace string, config json.RawMessage) {
	s.mu.Lock()
	cw := s.cw
	s.mu.Unlock()
	if cw == nil {
		return
	}
	if len(config) == 0 {
		config = json.RawMessage(`{}`)
	}
	id := namespace + "-" + adapter
	if err := cw.SetInMemory(id, config); err != nil {
		s.log.Warn("keep the adapter configuration as a configuration entry", "id", id, "error", err)
	}
}
