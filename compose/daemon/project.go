package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/compose/vmworkers"
)

// maxConcurrentStarts bounds the starts of one wave.
const maxConcurrentStarts = 8

// Codes of failures that spec §5.11 does not name: a worker that exits
// after it was ready, and a worker stopped because a container it starts
// after did.
const (
	CodeWorkerExited     = state.CodeWorkerLost
	CodeDependencyFailed = "DEPENDENCY_FAILED"
)

// project is one loaded compose file (a project is its canonical compose
// file) in its namespace.
type project struct {
	d     *Daemon
	path  string
	ns    string
	store *state.Store

	// turn serialises operations (up, down, restart, add, remove) and
	// supervision; a channel so waiting respects contexts.
	turn chan struct{}

	mu   sync.Mutex // guards file, st, cs, pkgs and frozen
	file *composefile.File
	st   *state.State
	cs   map[string]*container
	// pkgs are the package containers' lock entries and cache entries,
	// from the last preparation.
	pkgs map[string]*pkgInfo
	// frozen: the project was brought up with --frozen, so its restarts
	// keep to the lock too.
	frozen bool
	// pkgMu serialises the preparations a start makes by itself.
	pkgMu sync.Mutex
	// inherited are the VM worker credentials an earlier Compose of the
	// project left in worker-credentials.json, by vm_id, not yet handed to a
	// start or revoked (credential.go).
	inherited map[string]string
}

// container is the runtime state of one container key.
type container struct {
	key     string
	state   string
	decl    *composefile.Container // the declaration it was started with
	proc    *proc.Process          // host worker
	adapter *vmworkers.Adapter     // adapter container
	vm      *vmworkers.Ref         // VM container (kept after a stop: its logs stay readable)
	// adapterPath is the binary the adapter was started from, and
	// adapterPID the process the plugin host ran it as when it came up
	// (0: not known): after an engine restart another pid means another
	// process, which Compose did not start (reviveAdapter).
	adapterPath string
	adapterPID  int
	owned       bool
	foreign     int // pid of a live process from a crashed run whose identity could not be checked
	log         *proc.Log
	env         []string // for post_run
	dir         string
	lastErr     *compose.Error
	startedAt   time.Time
	// reregisterBy is set after the engine connection came back: the
	// worker must show up in the engine again by then.
	reregisterBy time.Time
}

func (c *container) running() bool {
	return c.state == state.StatusReady || c.state == state.StatusStarting
}

// opResult is the result of up and down (spec §5.9).
type opResult struct {
	OperationID string            `json:"operation_id"`
	Status      string            `json:"status"`
	Changed     bool              `json:"changed"`
	Containers  []containerResult `json:"containers"`
}

type containerResult struct {
	Container string     `json:"container"`
	State     string     `json:"state"`
	Changed   bool       `json:"changed"`
	Error     *errorJSON `json:"error,omitempty"`
}

type errorJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func errJSON(e *compose.Error) *errorJSON {
	if e == nil {
		return nil
	}
	return &errorJSON{Code: e.Code, Message: e.Message}
}

// asComposeError gives any error a code.
func asComposeError(err error) *compose.Error {
	if err == nil {
		return nil
	}
	var ce *compose.Error
	if errors.As(err, &ce) {
		return ce
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return compose.New(compose.CodeEngineCallFailed, "the operation was interrupted: "+err.Error())
	}
	return compose.New(compose.CodeIOError, err.Error())
}

func newOp() *opResult {
	return &opResult{OperationID: uuid.NewString(), Status: "ok", Containers: []containerResult{}}
}

func (r *opResult) add(cr containerResult) {
	r.Containers = append(r.Containers, cr)
	if cr.Changed {
		r.Changed = true
	}
	if cr.State == state.StatusFailed && cr.Error != nil {
		r.Status = "failed"
	}
}

// acquire waits for the project's turn.
func (p *project) acquire(ctx context.Context) error {
	select {
	case p.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *project) tryAcquire() bool {
	select {
	case p.turn <- struct{}{}:
		return true
	default:
		return false
	}
}

func (p *project) release() { <-p.turn }

func (p *project) currentFile() *composefile.File {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.file
}

func (p *project) setFile(f *composefile.File) {
	p.mu.Lock()
	p.file = f
	p.mu.Unlock()
}

// get returns the container record of key, creating it.
func (p *project) get(key string) *container {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.cs[key]
	if c == nil {
		c = &container{key: key, state: state.StatusStopped}
		p.cs[key] = c
	}
	return c
}

// setState records a container's state and persists state.json.
func (p *project) setState(c *container, st string, lastErr *compose.Error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.state = st
	if lastErr != nil || st == state.StatusReady || st == state.StatusStarting {
		c.lastErr = lastErr
	}
	p.saveLocked()
}

// saveLocked writes state.json from the containers. p.mu must be held.
func (p *project) saveLocked() {
	st := state.NewState(p.path)
	st.DaemonPID = os.Getpid()
	for key, c := range p.cs {
		r := &state.Record{Status: c.state}
		if c.proc != nil && c.running() {
			r.PID, r.Birth = c.proc.Pid, c.proc.Birth
		}
		if !c.startedAt.IsZero() {
			t := c.startedAt.UTC()
			r.StartedAt = &t
		}
		if c.lastErr != nil {
			r.LastError = &state.ErrorRecord{Code: c.lastErr.Code, Message: c.lastErr.Message}
		}
		st.Containers[key] = r
	}
	p.st = st
	if err := p.store.Save(st); err != nil {
		p.d.log.Error("cannot save the project state", "file", p.path, "error", err)
	}
}

// logFor returns the container's rotating log, opening it once.
func (p *project) logFor(c *container) (*proc.Log, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.log != nil {
		return c.log, nil
	}
	l, err := proc.OpenLog(p.store.LogsDir(), c.key, proc.LogOptions{})
	if err != nil {
		return nil, compose.New(compose.CodeIOError, fmt.Sprintf("container %q: open its log in %s: %v", c.key, p.store.LogsDir(), err))
	}
	c.log = l
	return l, nil
}

// recover adopts what a Compose that did not shut down cleanly left in
// state.json.
func (p *project) recover(f *composefile.File) error {
	st, err := p.store.Load()
	if err != nil {
		return err
	}
	if st == nil {
		p.mu.Lock()
		p.saveLocked()
		p.mu.Unlock()
		return nil
	}
	outcomes := map[string]state.Recovered{}
	for _, r := range state.Recover(st, proc.Check) {
		outcomes[r.Container] = r
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, r := range st.Containers {
		c := &container{key: key, state: r.Status, decl: f.Containers[key]}
		if r.LastError != nil {
			c.lastErr = compose.New(r.LastError.Code, r.LastError.Message)
		}
		if r.StartedAt != nil {
			c.startedAt = *r.StartedAt
		}
		if rec, ok := outcomes[key]; ok {
			switch rec.Outcome {
			case state.Adopted:
				c.proc = proc.Adopt(rec.Record.PID, rec.Record.Birth)
				c.owned = true
				c.state = state.StatusReady
				p.d.track(c.proc.Pid, c.proc.Birth)
				p.d.log.Info("adopted a worker left running by an earlier Compose", "container", key, "pid", rec.Record.PID)
			case state.Unverified:
				c.state = state.StatusStopped
				c.foreign = rec.Record.PID
				p.d.log.Warn("a worker left by an earlier Compose is alive but cannot be verified; leaving it running", "container", key, "pid", rec.Record.PID)
			case state.Dead:
				c.state = state.StatusFailed
				c.lastErr = compose.New(CodeWorkerExited, fmt.Sprintf(
					"the worker (pid %d) ended while no Compose was watching it; start it again with compose::up", rec.Record.PID))
				p.d.log.Warn("a worker recorded by an earlier Compose is gone", "container", key, "pid", rec.Record.PID)
			}
		} else if c.state == state.StatusReady || c.state == state.StatusStarting {
			// A running record without a pid (an adapter container): the
			// engine knows whether it still runs; report it stopped.
			c.state = state.StatusStopped
		}
		p.cs[key] = c
	}
	p.saveLocked()
	return nil
}

// up starts targets (and their dependencies; everything when empty) in
// waves. A failure stops what this operation started, in reverse order.
func (p *project) up(ctx context.Context, f *composefile.File, targets []string) (*opResult, error) {
	// VM containers start after the adapter that boots them.
	f, err := p.augment(f)
	if err != nil {
		return nil, err
	}
	waves, err := f.StartWaves(targets...)
	if err != nil {
		return nil, err
	}
	p.setFile(f)
	res := newOp()
	results := map[string]containerResult{}
	var started []string
	var failed bool
	for _, wave := range waves {
		if failed {
			for _, key := range wave {
				results[key] = containerResult{Container: key, State: p.get(key).state}
			}
			continue
		}
		type outcome struct {
			key     string
			changed bool
			err     *compose.Error
		}
		outs := make([]outcome, len(wave))
		sem := make(chan struct{}, maxConcurrentStarts)
		var wg sync.WaitGroup
		for i, key := range wave {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				changed, err := p.startOne(ctx, f, key)
				outs[i] = outcome{key, changed, asComposeError(err)}
			}()
		}
		wg.Wait()
		for _, o := range outs {
			c := p.get(o.key)
			switch {
			case o.err != nil:
				failed = true
				results[o.key] = containerResult{Container: o.key, State: state.StatusFailed, Error: errJSON(o.err)}
			case o.changed:
				started = append(started, o.key)
				results[o.key] = containerResult{Container: o.key, State: c.state, Changed: true}
			default:
				results[o.key] = containerResult{Container: o.key, State: c.state}
			}
		}
	}
	if failed {
		// Roll back what this operation started, newest first; they are
		// reported stopped and unchanged.
		for i := len(started) - 1; i >= 0; i-- {
			key := started[i]
			p.stopOne(context.WithoutCancel(ctx), p.get(key), nil)
			results[key] = containerResult{Container: key, State: state.StatusStopped}
		}
	}
	for _, wave := range waves {
		for _, key := range wave {
			res.add(results[key])
		}
	}
	if failed {
		res.Status = "failed"
	}
	return res, nil
}

// startOne starts key unless it already runs. changed reports a start.
func (p *project) startOne(ctx context.Context, f *composefile.File, key string) (bool, error) {
	decl := f.Containers[key]
	c := p.get(key)
	p.mu.Lock()
	alive := c.running() && c.owned && !p.exitedLocked(c)
	p.mu.Unlock()
	if alive {
		return false, nil
	}
	if c.running() {
		// It died before supervision saw it: clean up first.
		p.stopOne(ctx, c, nil)
	}
	p.mu.Lock()
	c.decl = decl
	c.lastErr = nil
	c.startedAt = time.Now()
	p.mu.Unlock()
	var err error
	if decl.Source.Kind == composefile.SourcePackage {
		var pi *pkgInfo
		if pi, err = p.packageOf(ctx, f, key); err == nil {
			switch {
			case p.isAdapter(f, decl):
				err = p.startAdapter(ctx, f, c, pi)
			case pi.entry.Resolved.Type == registry.KindBundle && decl.Runtime != "host":
				err = p.startVM(ctx, f, c, pi)
			default:
				// Binaries, and bundles with runtime: host.
				err = p.startHost(ctx, f, c, pi)
			}
		}
	} else if baseImage(decl.Source.Path) != "" {
		err = p.startVM(ctx, f, c, nil)
	} else {
		err = p.startHost(ctx, f, c, nil)
	}
	if err != nil {
		ce := asComposeError(err)
		p.setState(c, state.StatusFailed, ce)
		return false, ce
	}
	return true, nil
}

// exitedLocked reports whether a running container's process has gone.
func (p *project) exitedLocked(c *container) bool {
	return c.proc != nil && c.proc.Exited()
}

// packageOf is what a package container runs: what the last preparation
// installed for it, or, when its declaration changed since (or none ran,
// as for a project adopted after a crash), a fresh preparation of it.
func (p *project) packageOf(ctx context.Context, f *composefile.File, key string) (*pkgInfo, error) {
	decl := f.Containers[key]
	p.mu.Lock()
	pi, frozen := p.pkgs[key], p.frozen
	p.mu.Unlock()
	if pi != nil && pi.entry.SameDeclaration(decl.Worker, decl.Version) {
		return pi, nil
	}
	p.pkgMu.Lock()
	defer p.pkgMu.Unlock()
	prep, err := p.d.pk.prepare(ctx, f, p.d.prepareOpts(frozen, []string{key}))
	if err != nil {
		return nil, err
	}
	p.setPackages(prep.pkgs, frozen)
	if pi = prep.pkgs[key]; pi == nil {
		return nil, compose.New(compose.CodePackageNotInstalled, fmt.Sprintf("container %q: its package was not installed", key))
	}
	return pi, nil
}

// setPackages records what the package containers run.
func (p *project) setPackages(pkgs map[string]*pkgInfo, frozen bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pkgs == nil {
		p.pkgs = map[string]*pkgInfo{}
	}
	for k, v := range pkgs {
		p.pkgs[k] = v
	}
	p.frozen = frozen
}

// down stops targets and everything that starts after them (every
// container when targets is empty), dependents first.
func (p *project) down(ctx context.Context, f *composefile.File, targets []string) *opResult {
	res := newOp()
	// VM containers stop before the adapter that runs them.
	if af, err := p.augment(f); err == nil {
		f = af
	}
	var order []string
	if len(targets) == 0 {
		order = p.fullStopOrder(f)
	} else {
		set := map[string]bool{}
		for _, t := range targets {
			set[t] = true
			for _, d := range f.Dependents(t) {
				set[d] = true
			}
		}
		all := startSequence(f)
		for i := len(all) - 1; i >= 0; i-- {
			if set[all[i]] {
				order = append(order, all[i])
			}
		}
	}
	for _, key := range order {
		c := p.get(key)
		changed := p.stopOne(ctx, c, nil)
		res.add(containerResult{Container: key, State: state.StatusStopped, Changed: changed})
	}
	return res
}

// fullStopOrder is every known container, reverse start order; containers
// no longer in the file come first.
func (p *project) fullStopOrder(f *composefile.File) []string {
	all := startSequence(f)
	p.mu.Lock()
	var extra []string
	for key := range p.cs {
		if _, ok := f.Containers[key]; !ok {
			extra = append(extra, key)
		}
	}
	p.mu.Unlock()
	slices.Sort(extra)
	order := extra
	for i := len(all) - 1; i >= 0; i-- {
		order = append(order, all[i])
	}
	return order
}

// startSequence is the order up starts containers in: wave after wave.
// Stops go the other way.
func startSequence(f *composefile.File) []string {
	waves, _ := f.StartWaves()
	var out []string
	for _, w := range waves {
		out = append(out, w...)
	}
	return out
}

// stopOne stops a container if it runs and records it stopped (or failed
// with lastErr). It reports whether anything was running.
func (p *project) stopOne(ctx context.Context, c *container, lastErr *compose.Error) bool {
	p.mu.Lock()
	wasRunning := c.running()
	pr, ad, vm, decl := c.proc, c.adapter, c.vm, c.decl
	p.mu.Unlock()
	f := p.currentFile()
	stopTimeout := f.StopTimeout
	switch {
	case pr != nil:
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout+30*time.Second)
		if err := pr.Stop(sctx, stopTimeout); err != nil {
			p.d.log.Error("cannot stop a worker", "container", c.key, "pid", pr.Pid, "error", err)
		}
		cancel()
		p.d.untrack(pr.Pid)
		p.revokeQueueProviderCredential(ctx, c.key)
		if l := c.log; l != nil {
			_ = l.Write(proc.Stderr, []byte(fmt.Sprintf("[compose] %s stopped (%s)", c.key, exitText(pr))))
		}
		if decl != nil && decl.Scripts.PostRun != "" {
			p.postRun(c, decl)
		}
	case ad != nil && wasRunning:
		if err := p.stopAdapter(ctx, ad); err != nil {
			p.d.log.Error("cannot stop a sandbox adapter", "container", c.key, "adapter", ad.Name, "error", err)
		}
	case vm != nil && wasRunning:
		p.stopVM(ctx, c, vm, stopTimeout)
		if decl != nil && decl.Scripts.PostRun != "" {
			p.postRun(c, decl)
		}
	}
	p.mu.Lock()
	c.proc, c.adapter = nil, nil
	c.reregisterBy = time.Time{}
	if lastErr != nil {
		c.state, c.lastErr = state.StatusFailed, lastErr
	} else {
		c.state = state.StatusStopped
	}
	p.saveLocked()
	p.mu.Unlock()
	return wasRunning
}

func exitText(pr *proc.Process) string {
	if s := pr.ExitStatus(); s != "" {
		return s
	}
	return "adopted process ended"
}

// postRun runs scripts.post_run after a worker's exit, in the background;
// the daemon waits for these before it exits.
func (p *project) postRun(c *container, decl *composefile.Container) {
	l, _ := p.logFor(c)
	env, dir := c.env, c.dir
	if dir == "" {
		dir = decl.WorkingDir
		if dir == "" {
			dir = decl.Source.Path
		}
	}
	if env == nil {
		env = []string{"PATH=" + os.Getenv("PATH")}
	}
	p.d.background(func(ctx context.Context) {
		h := proc.Hook{Name: "post_run", Container: c.key, Command: decl.Scripts.PostRun, Dir: dir, Env: env,
			Timeout: composefile.DefaultPreRunTimeout, StopGrace: p.currentFile().StopTimeout, Log: l}
		if err := h.Run(ctx); err != nil {
			p.d.log.Warn("post_run failed", "container", c.key, "error", err)
		}
	})
}

// statusJSON is compose::status.
type statusJSON struct {
	Namespace  string            `json:"namespace"`
	File       string            `json:"file"`
	StateDir   string            `json:"state_dir"`
	DaemonPID  int               `json:"daemon_pid"`
	Containers []containerStatus `json:"containers"`
}

type containerStatus struct {
	Container string     `json:"container"`
	State     string     `json:"state"`
	PID       *int       `json:"pid"`
	Owned     bool       `json:"owned"`
	LogPath   string     `json:"log_path"`
	LastError *errorJSON `json:"last_error,omitempty"`
}

// status reports every container of the file (and any that still runs
// but left the file). live is the engine's worker list, to spot workers
// Compose did not start.
func (p *project) status(f *composefile.File, live []liveWorker) statusJSON {
	out := statusJSON{Namespace: p.ns, File: p.path, StateDir: p.store.Dir(), DaemonPID: os.Getpid(), Containers: []containerStatus{}}
	keys := append([]string(nil), f.Order...)
	p.mu.Lock()
	defer p.mu.Unlock()
	var extra []string
	for key := range p.cs {
		if _, ok := f.Containers[key]; !ok {
			extra = append(extra, key)
		}
	}
	slices.Sort(extra)
	keys = append(keys, extra...)
	for _, key := range keys {
		cs := containerStatus{Container: key, State: state.StatusStopped, LogPath: logPath(p.store.LogsDir(), key)}
		if c := p.cs[key]; c != nil {
			cs.State = c.state
			cs.Owned = c.owned && c.running()
			if c.proc != nil && c.running() {
				pid := c.proc.Pid
				cs.PID = &pid
			}
			if c.foreign > 0 && proc.Alive(c.foreign) {
				pid := c.foreign
				cs.PID, cs.State, cs.Owned = &pid, state.StatusReady, false
			}
			cs.LastError = errJSON(c.lastErr)
			switch {
			case c.adapter != nil:
				cs.LogPath = ""
			case c.vm != nil:
				// The adapter keeps a VM's log, beside its disk.
				cs.LogPath = ""
				if c.vm.StateDir != "" {
					cs.LogPath = filepath.Join(c.vm.StateDir, "worker.log")
				}
			}
		}
		if !cs.Owned && cs.State != state.StatusReady {
			for _, w := range live {
				if w.name() == key && w.Namespace == p.ns {
					cs.State = state.StatusReady
				}
			}
		}
		out.Containers = append(out.Containers, cs)
	}
	return out
}

func logPath(dir, key string) string { return strings.TrimSuffix(dir, "/") + "/" + key + ".log" }

// close releases the project's logs and state directory; clean removes
// state.json (nothing is left running to adopt).
func (p *project) close(clean bool) {
	p.mu.Lock()
	for _, c := range p.cs {
		if c.log != nil {
			_ = c.log.Close()
			c.log = nil
		}
	}
	p.mu.Unlock()
	if clean {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		p.revokeInherited(ctx)
		cancel()
		_ = p.store.Clear()
	}
	p.store.Close()
}

// anyRunning reports whether a container still runs.
func (p *project) anyRunning() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.cs {
		if c.running() {
			return true
		}
	}
	return false
}
