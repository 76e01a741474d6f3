// Package daemon is the Compose daemon: an ordinary worker named `compose`
// that serves compose::* in its namespace, loads projects (compose files),
// starts their containers (host processes, and sandbox adapters through the
// engine's plugin host) in dependency order, watches them, and stops them.
// With `--up` and an engine: section it also starts and owns the engine.
//
// Spec iii-0.26 §4 and §5; docs/compose.md is the user's view.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/engineproc"
	"github.com/iii-sandbox/iii/compose/packages"
	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/compose/vmworkers"
	"github.com/iii-sandbox/iii/internal/version"
	"github.com/iii-sandbox/iii/protocol"
)

// WorkerName is the daemon's worker name in its namespace.
const WorkerName = "compose"

// EnvURL is the engine address Compose attaches to without --engine.
const EnvURL = "III_URL"

// Supervision and shutdown timing.
const (
	supervisePoll   = 250 * time.Millisecond
	dialTimeout     = 15 * time.Second
	shutdownTimeout = 2 * time.Minute
)

// CodeInvalidArgument: a compose::* request field has the wrong type or
// value.
const CodeInvalidArgument = "INVALID_ARGUMENT"

// Options configure Run. Zero values take the process's own (cwd,
// environment, executable).
type Options struct {
	// Namespace is -n/--namespace ("" when not given): the daemon
	// namespace and the project namespace of every project it loads.
	Namespace string
	// EngineURL is --engine ("" when not given).
	EngineURL string
	// Up brings File up once the daemon serves (`--up`).
	Up bool
	// Frozen is --frozen (only with Up).
	Frozen bool
	// File is -f ("" = ./worker-compose.yaml).
	File string
	// Cwd is the daemon's working directory: relative file= arguments
	// resolve against it.
	Cwd string
	// LookupEnv reads Compose's environment (interpolation, III_URL, the
	// workers' baseline variables).
	LookupEnv func(string) (string, bool)
	// Executable is the iii binary, run as the reaper and the managed
	// engine.
	Executable string
	Logger     hclog.Logger
	// Out receives the --up progress lines.
	Out io.Writer
	// OnServe, when set, is told once the daemon serves (tests use it).
	OnServe func(Info)
	// Packages configure the registry, the package cache and download
	// progress (default: plain lines on Out).
	Packages PackageOptions
}

// Info describes a serving daemon.
type Info struct {
	Namespace string
	URL       string
	Managed   bool
	EnginePID int
	ReaperPID int
}

// Daemon is a running Compose daemon.
type Daemon struct {
	opts     Options
	log      hclog.Logger
	out      io.Writer
	ns       string // the daemon namespace
	nsForced bool   // -n given: every project runs in ns
	url      string // the engine address (III_URL for workers)
	cwd      string
	lookup   func(string) (string, bool)
	exe      string

	pk      *packageManager
	eng     engineCaller
	cl      *client.Client     // nil in unit tests
	reaper  *proc.Reaper       // nil in unit tests
	managed *engineproc.Engine // nil when attached to an engine run elsewhere
	// token is sent as `token` on engine::adapters::start, stop and
	// restart: the project token of the managed engine, or the
	// operator's III_ENGINE_TOKEN for an engine Compose attaches to.
	token string
	// tokenFromEnv: the attached engine's token came from
	// $III_ENGINE_TOKEN, not from the user's token file.
	tokenFromEnv bool

	mu       sync.Mutex
	projects map[string]*project

	// vmCreds are the engine credentials issued for VM workers.
	vmCreds vmworkers.Credentials
	credMu  sync.Mutex
	// providerCreds are the queue provider credentials, by
	// namespace/key (provider.go); credMu guards them.
	providerCreds map[string]string
	loaded        []string // load order
	stopping      bool

	stopReq  chan struct{}
	stopOnce sync.Once
	// superDone is closed when the supervisor goroutine has returned (nil
	// until it starts).
	superDone chan struct{}
	bg        sync.WaitGroup
	bgCtx     context.Context
	bgCancel  context.CancelFunc
}

func (o *Options) defaults() error {
	if o.Cwd == "" {
		wd, err := os.Getwd()
		if err != nil {
			return compose.New(compose.CodeIOError, "cannot read the working directory: "+err.Error())
		}
		o.Cwd = wd
	}
	if o.LookupEnv == nil {
		o.LookupEnv = os.LookupEnv
	}
	if o.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return compose.New(compose.CodeIOError, "cannot find the iii executable: "+err.Error())
		}
		o.Executable = exe
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	return nil
}

func newDaemon(opts Options) *Daemon {
	d := &Daemon{
		opts: opts, log: opts.Logger, out: opts.Out, cwd: opts.Cwd, lookup: withoutEngineToken(opts.LookupEnv), exe: opts.Executable,
		projects: map[string]*project{}, stopReq: make(chan struct{}),
	}
	po := opts.Packages
	if po.Progress == nil {
		po.Progress = packages.Printer(opts.Out, false)
	}
	d.pk = newPackageManager(po, opts.LookupEnv, opts.Executable)
	d.vmCreds.Revoke = d.revokeCredential
	d.bgCtx, d.bgCancel = context.WithCancel(context.Background())
	return d
}

func (d *Daemon) getenv(k string) string {
	v, _ := d.lookup(k)
	return v
}

// Run serves until ctx ends (SIGINT/SIGTERM), compose::stop, or a fatal
// failure (the managed engine exited, the daemon's worker name was taken
// on a reconnect). Everything it started is stopped before it returns:
// projects, then the engine.
func Run(ctx context.Context, opts Options) (err error) {
	if opts.Frozen && !opts.Up {
		return compose.New(CodeInvalidArgument, "--frozen needs --up")
	}
	if opts.File != "" && !opts.Up {
		return compose.New(compose.CodeFileRequiresUp, fmt.Sprintf(
			"-f/--file %s is only valid with --up; a daemon without --up reads ./%s for its defaults and loads projects when compose::up names them", opts.File, composefile.FileName))
	}
	if err := opts.defaults(); err != nil {
		return err
	}
	d := newDaemon(opts)

	file, err := d.defaultsFile()
	if err != nil {
		return err
	}
	if err := d.resolveNamespace(file); err != nil {
		return err
	}
	managed, err := d.resolveEngine(file)
	if err != nil {
		return err
	}

	defer func() {
		if serr := d.shutdown(); serr != nil && err == nil {
			err = serr
		}
	}()
	reaperCtx, cancel := context.WithTimeout(ctx, dialTimeout)
	d.reaper, err = proc.StartReaper(reaperCtx, d.exe, d.stopGrace(file))
	cancel()
	if err != nil {
		return compose.New(compose.CodeSpawnFailed, "cannot start the Compose reaper: "+err.Error())
	}
	if managed {
		if err := d.startManaged(ctx, file); err != nil {
			return err
		}
	} else {
		// Read past d.lookup, which hides the variable from everything
		// else (interpolation, worker environments).
		d.token, _ = opts.LookupEnv(envEngineToken)
		d.tokenFromEnv = d.token != ""
		if d.token == "" {
			// The same user's engine token (~/.iii/engine-token), when
			// the engine is this user's on loopback.
			tok, err := client.TokenFromFile(d.url)
			if err != nil {
				return compose.New(compose.CodeEngineCallFailed, "cannot read the engine token: "+err.Error())
			}
			d.token = tok
		}
	}
	if err := d.connect(ctx); err != nil {
		return err
	}
	if err := d.register(); err != nil {
		return err
	}
	info := Info{Namespace: d.ns, URL: d.url, Managed: d.managed != nil, ReaperPID: d.reaper.Pid()}
	if d.managed != nil {
		info.EnginePID = d.managed.Pid()
	}
	d.log.Info("compose daemon serving", "namespace", d.ns, "engine", d.url, "managed", d.managed != nil)
	fmt.Fprintf(d.out, "compose: serving namespace %q on %s as worker %q\n", d.ns, d.url, WorkerName)

	d.superDone = make(chan struct{})
	go func() {
		defer close(d.superDone)
		d.supervise()
	}()
	if opts.Up {
		if err := d.upAtStart(ctx, file); err != nil {
			return err
		}
	}
	if opts.OnServe != nil {
		opts.OnServe(info)
	}
	return d.wait(ctx)
}

// defaultsFile is the compose file that gives the daemon its defaults:
// the --up file, or ./worker-compose.yaml when it exists.
func (d *Daemon) defaultsFile() (*composefile.File, error) {
	path := d.opts.File
	if path == "" {
		path = composefile.FileName
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(d.cwd, path)
	}
	if !d.opts.Up {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
	} else if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if d.opts.File == "" {
			return nil, compose.New(compose.CodeNoComposeFile, fmt.Sprintf(
				"--up found no %s in %s; run it in the project directory or pass -f <file>", composefile.FileName, d.cwd))
		}
	}
	return composefile.Load(path, d.lookup)
}

// resolveNamespace applies spec §4: -n, else the file's namespace:, else
// default.
func (d *Daemon) resolveNamespace(f *composefile.File) error {
	switch {
	case d.opts.Namespace != "":
		if err := composefile.ValidNamespace(d.opts.Namespace); err != nil {
			return err
		}
		d.ns, d.nsForced = d.opts.Namespace, true
	case f != nil && f.NamespaceSet:
		d.ns = f.Namespace
	default:
		d.ns = composefile.DefaultNamespace
	}
	return nil
}

// resolveEngine picks the engine address and whether this invocation
// starts the engine: --up with a non-empty engine: section and no
// --engine. Otherwise --engine > $III_URL > the file's engine.url > the
// default.
func (d *Daemon) resolveEngine(f *composefile.File) (managed bool, err error) {
	owns := f != nil && f.Engine != nil && !f.Engine.Empty
	if d.opts.Up && owns {
		if d.opts.EngineURL != "" {
			return false, engineNeedsManagedStart(f, d.opts.EngineURL)
		}
		d.url = f.Engine.URL
		return true, nil
	}
	switch {
	case d.opts.EngineURL != "":
		d.url = d.opts.EngineURL
	case d.getenv(EnvURL) != "":
		d.url = d.getenv(EnvURL)
	case f != nil && f.Engine != nil && f.Engine.URL != "":
		d.url = f.Engine.URL
	default:
		d.url = composefile.DefaultEngineURL
	}
	return false, nil
}

func engineNeedsManagedStart(f *composefile.File, url string) error {
	return compose.New(compose.CodeEngineSectionRequiresManagedStart, fmt.Sprintf(
		"%s has an engine: section, which means Compose starts and owns the engine, but this daemon is attached to the engine at %s; "+
			"start it with `iii compose --up -f %s` and no --engine, or leave engine: empty to attach to whatever engine holds the address",
		f.Path, url, f.Path))
}

func (d *Daemon) stopGrace(f *composefile.File) time.Duration {
	if f != nil {
		return f.StopTimeout
	}
	return composefile.DefaultStopTimeout
}

// connect dials the engine as worker `compose` in the daemon namespace. A
// daemon already serving the namespace holds the name:
// DAEMON_ALREADY_SERVING.
func (d *Daemon) connect(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	cl, err := client.Dial(dctx, d.url, client.Options{
		Name:        WorkerName,
		Namespace:   d.ns,
		Description: "iii Compose daemon: compose::* for the projects it runs",
		// The engine token: Compose registers compose::* (reserved ids,
		// privileged functions) and calls engine::adapters::* and the
		// adapter's worker::*, all of which need it.
		Token:               d.token,
		TokenSource:         d.tokenSource(),
		IgnoreEnv:           true,
		ConfirmRegistration: true,
		Logger:              d.log.Named("client"),
		Reconnect:           client.ReconnectPolicy{Initial: 200 * time.Millisecond, Max: 2 * time.Second},
		CallTimeout:         30 * time.Second,
	})
	if err != nil {
		if client.CodeOf(err) == protocol.CodeWorkerNamespaceConflict {
			return compose.New(compose.CodeDaemonAlreadyServing, fmt.Sprintf(
				"a Compose daemon already serves namespace %q on the engine at %s; use it (iii call compose::up --namespace %s ...), stop it, or start this one with another -n",
				d.ns, d.url, d.ns))
		}
		if errors.Is(err, context.Canceled) {
			return err
		}
		if client.CodeOf(err) == codeAuthError {
			return compose.New(compose.CodeEngineCallFailed, fmt.Sprintf(
				"the engine at %s refused Compose's engine token (%v); give Compose the token that engine uses (%s), or let it start its own engine (an engine: section)", d.url, err, envEngineToken))
		}
		return compose.New(compose.CodeEngineCallFailed, fmt.Sprintf("cannot connect to the engine at %s: %v", d.url, err))
	}
	d.cl, d.eng = cl, cl
	return nil
}

// wait serves until a reason to stop.
func (d *Daemon) wait(ctx context.Context) error {
	var engineDone <-chan struct{}
	if d.managed != nil {
		engineDone = d.managed.Done()
	}
	select {
	case <-ctx.Done():
		d.log.Info("stop requested by signal")
		return nil
	case <-d.stopReq:
		d.log.Info("stop requested by compose::stop")
		return nil
	case <-d.cl.Done():
		err := d.cl.Err()
		if client.CodeOf(err) == protocol.CodeWorkerNamespaceConflict {
			return compose.New(compose.CodeDaemonAlreadyServing, fmt.Sprintf(
				"while the engine connection was down, another Compose daemon took namespace %q; this one stops", d.ns))
		}
		if client.CodeOf(err) == codeAuthError {
			return compose.New(compose.CodeEngineCallFailed, fmt.Sprintf(
				"the engine at %s no longer accepts Compose's engine token (%v): it was restarted with another one; start Compose again with the token that engine uses (%s or ~/.iii/engine-token)", d.url, err, envEngineToken))
		}
		return compose.New(compose.CodeEngineCallFailed, fmt.Sprintf("lost the engine at %s: %v", d.url, err))
	case <-engineDone:
		return d.managed.ExitedError()
	}
}

// requestStop makes Run return (compose::stop).
func (d *Daemon) requestStop() {
	d.stopOnce.Do(func() { close(d.stopReq) })
}

// background runs fn (post_run hooks) so that shutdown waits for it.
func (d *Daemon) background(fn func(ctx context.Context)) {
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		fn(d.bgCtx)
	}()
}

func (d *Daemon) track(pid int, birth string) {
	if d.reaper != nil {
		if err := d.reaper.Track(pid, birth, proc.PhaseWorker); err != nil {
			d.log.Error("cannot tell the reaper about a worker", "pid", pid, "error", err)
		}
	}
}

func (d *Daemon) untrack(pid int) {
	if d.reaper != nil {
		_ = d.reaper.Untrack(pid)
	}
}

// shutdown stops every project (newest first), waits for post_run hooks,
// stops the managed engine, ends the reaper and closes the connection.
func (d *Daemon) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	d.mu.Lock()
	d.stopping = true
	order := slices.Clone(d.loaded)
	d.mu.Unlock()
	// The supervisor must not act on projects being taken down.
	d.requestStop()
	if d.superDone != nil {
		<-d.superDone
	}
	for i := len(order) - 1; i >= 0; i-- {
		d.mu.Lock()
		p := d.projects[order[i]]
		d.mu.Unlock()
		if p == nil {
			continue
		}
		if err := p.acquire(ctx); err == nil {
			p.down(ctx, p.currentFile(), nil)
			p.release()
		}
	}
	waited := make(chan struct{})
	go func() { d.bg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		d.bgCancel()
		<-waited
	}
	d.bgCancel()
	for i := len(order) - 1; i >= 0; i-- {
		d.mu.Lock()
		p := d.projects[order[i]]
		delete(d.projects, order[i])
		d.mu.Unlock()
		if p != nil {
			p.close(true)
		}
	}
	var errs []error
	if d.cl != nil {
		// The daemon leaves the engine before the engine stops, so nothing
		// it served is in flight when the listener goes.
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		_ = d.cl.Close(cctx)
		ccancel()
	}
	if d.managed != nil {
		errs = append(errs, d.managed.Stop(ctx))
	}
	if d.reaper != nil {
		errs = append(errs, d.reaper.Close(ctx))
	}
	return errors.Join(errs...)
}

// supervise watches every project's running containers every 250 ms until
// the daemon stops.
func (d *Daemon) supervise() {
	t := time.NewTicker(supervisePoll)
	defer t.Stop()
	wasConnected := true
	lastID := ""
	if d.cl != nil {
		lastID = d.cl.WorkerID()
	}
	for {
		select {
		case <-d.bgCtx.Done():
			return
		case <-d.stopReq:
			return
		case <-t.C:
		}
		connected := d.cl == nil || d.cl.Connected()
		// Every connection gets a new worker id: an engine that stopped
		// and started between two ticks (a quick restart, or a tick late on
		// a loaded host) is seen by its id even when no tick saw the
		// connection down.
		id := ""
		if d.cl != nil {
			id = d.cl.WorkerID()
		}
		reconnected := connected && (!wasConnected || (lastID != "" && id != lastID))
		wasConnected = connected
		if connected {
			lastID = id
		}
		d.mu.Lock()
		if d.stopping {
			d.mu.Unlock()
			return
		}
		ps := make([]*project, 0, len(d.projects))
		for _, p := range d.projects {
			ps = append(ps, p)
		}
		d.mu.Unlock()
		for _, p := range ps {
			p.superviseTick(d.bgCtx, reconnected, connected)
		}
	}
}

// versionString is reported by compose::list.
func versionString() string { return version.Version }

// projectFor returns the loaded project of f, loading it (state dir,
// lock, crash recovery) when needed.
func (d *Daemon) projectFor(f *composefile.File) (*project, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopping {
		return nil, compose.New(compose.CodeEngineCallFailed, "the Compose daemon is stopping")
	}
	if p := d.projects[f.Path]; p != nil {
		if p.ns != f.Namespace {
			return nil, compose.New(compose.CodeInvalidNamespace, fmt.Sprintf(
				"%s now says namespace %q but its project runs in %q; bring it down first (compose::down), then up again", f.Path, f.Namespace, p.ns))
		}
		return p, nil
	}
	store, err := state.Open(state.DirFor(f.Path, f.Namespace, d.getenv), f.Path, f.Namespace)
	if err != nil {
		return nil, err
	}
	p := &project{d: d, path: f.Path, ns: f.Namespace, store: store, turn: make(chan struct{}, 1), file: f, cs: map[string]*container{}}
	if err := p.recover(f); err != nil {
		store.Close()
		return nil, err
	}
	if p.inherited, err = store.LoadWorkerCredentials(); err != nil {
		store.Close()
		return nil, err
	}
	d.projects[f.Path] = p
	d.loaded = append(d.loaded, f.Path)
	return p, nil
}

// loadedProject returns the project of a canonical path if it is loaded.
func (d *Daemon) loadedProject(path string) *project {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.projects[path]
}

// unload forgets a project that is fully down (its state directory is
// released for another Compose). The managed engine's project stays: it
// holds the engine's lock.
func (d *Daemon) unload(p *project) {
	if d.managed != nil && d.managed.Path() == p.path {
		return
	}
	d.mu.Lock()
	if d.projects[p.path] != p {
		d.mu.Unlock()
		return
	}
	delete(d.projects, p.path)
	d.loaded = slices.DeleteFunc(d.loaded, func(s string) bool { return s == p.path })
	d.mu.Unlock()
	p.close(true)
}
