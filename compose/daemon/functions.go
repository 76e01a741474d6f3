package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/compose/vmworkers"
)

// stopReplyGrace is how long compose::stop's reply has to leave before the
// daemon starts stopping (and closes its connection).
const stopReplyGrace = 250 * time.Millisecond

// request is the union of every compose::* argument. Unknown fields are
// ignored: the engine adds _caller_worker_id, and newer callers may send
// more.
type request struct {
	File       *string                `json:"file"`
	Namespace  *string                `json:"namespace"`
	Container  *string                `json:"container"`
	Worker     json.RawMessage        `json:"worker"`
	Workers    json.RawMessage        `json:"workers"`
	Frozen     *bool                  `json:"frozen"`
	Tail       *int                   `json:"tail"`
	Cursors    map[string]proc.Cursor `json:"cursors"`
	Stream     *string                `json:"stream"`
	WaitMS     *int                   `json:"wait_ms"`
	FunctionID *string                `json:"function_id"`
}

// decodeRequest reads a compose::* payload; null or absent is {}.
func decodeRequest(fn string, data json.RawMessage) (*request, error) {
	var r request
	d := bytes.TrimSpace(data)
	if len(d) == 0 || bytes.Equal(d, []byte("null")) {
		return &r, nil
	}
	if d[0] != '{' {
		return nil, compose.New(CodeInvalidArgument, fmt.Sprintf("%s takes a JSON object of arguments, for example {\"file\":\"./worker-compose.yaml\"}", fn))
	}
	if err := json.Unmarshal(d, &r); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, compose.New(CodeInvalidArgument, fmt.Sprintf("%s: argument %s must be %s, not a JSON %s", fn, te.Field, jsonKind(te.Type.Kind().String()), te.Value))
		}
		return nil, compose.New(CodeInvalidArgument, fmt.Sprintf("%s: the arguments are not valid: %v", fn, err))
	}
	return &r, nil
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "int", "int64":
		return "an integer"
	case "map", "struct":
		return "an object"
	default:
		return "a " + goKind
	}
}

// stringArg decodes an argument that must be a string when present.
func stringArg(fn, name string, raw json.RawMessage) (string, bool, error) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(t, &s); err != nil {
		return "", false, compose.New(CodeInvalidArgument, fmt.Sprintf("%s: argument %s must be a string", fn, name))
	}
	return s, true, nil
}

// guard checks the optional namespace argument against the daemon's.
func (d *Daemon) guard(r *request) error {
	if r.Namespace != nil && *r.Namespace != d.ns {
		return compose.New(compose.CodeWrongDaemon, fmt.Sprintf(
			"this Compose daemon serves namespace %q, not %q; call the daemon of %q (iii call compose::... --namespace %s)",
			d.ns, *r.Namespace, *r.Namespace, *r.Namespace))
	}
	return nil
}

// filePath resolves the file argument against the daemon's working
// directory (not the caller's); absent means ./worker-compose.yaml there.
func (d *Daemon) filePath(r *request) (string, error) {
	if r.File == nil || strings.TrimSpace(*r.File) == "" {
		p := filepath.Join(d.cwd, composefile.FileName)
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			return "", compose.New(compose.CodeNoComposeFile, fmt.Sprintf(
				"no file given and the daemon's working directory %s has no %s; pass file=<path> (relative paths resolve against %s)",
				d.cwd, composefile.FileName, d.cwd))
		}
		return p, nil
	}
	p := *r.File
	if !filepath.IsAbs(p) {
		p = filepath.Join(d.cwd, p)
		if _, err := os.Stat(p); err != nil {
			return "", compose.New(compose.CodeComposeFileUnreadable, fmt.Sprintf(
				"cannot read %s: file=%q is resolved against the daemon's working directory %s, not the caller's (%v); pass an absolute path",
				p, *r.File, d.cwd, unwrapPathErr(err)))
		}
	}
	return p, nil
}

func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// loadFile reads and validates the file argument, in the namespace this
// daemon gives it.
func (d *Daemon) loadFile(r *request) (*composefile.File, error) {
	path, err := d.filePath(r)
	if err != nil {
		return nil, err
	}
	f, err := composefile.Load(path, d.lookup)
	if err != nil {
		return nil, err
	}
	d.applyNamespace(f)
	return f, nil
}

// canonical resolves the file argument to a project's identity without
// requiring the file to parse (down and status must work on a project
// whose file was broken since).
func (d *Daemon) canonical(r *request) (string, error) {
	path, err := d.filePath(r)
	if err != nil {
		return "", err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", compose.New(compose.CodeComposeFileUnreadable, err.Error())
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real, nil
	}
	return abs, nil
}

// containerArg reads container= (or worker=, its alias in restart).
func containerArg(fn string, r *request, alias bool) (string, error) {
	if r.Container != nil && *r.Container != "" {
		return *r.Container, nil
	}
	if alias {
		s, _, err := stringArg(fn, "worker", r.Worker)
		return s, err
	}
	return "", nil
}

func unknownContainer(f *composefile.File, key string) error {
	return compose.New(compose.CodeUnknownContainer, fmt.Sprintf("%s declares no container %q; it declares: %s", f.Path, key, strings.Join(f.Order, ", ")))
}

// ---- handlers --------------------------------------------------------------

func (d *Daemon) fnUp(ctx context.Context, r *request) (any, error) {
	f, err := d.loadFile(r)
	if err != nil {
		return nil, err
	}
	target, err := containerArg(fnUp, r, false)
	if err != nil {
		return nil, err
	}
	return d.up(ctx, f, target, r.Frozen != nil && *r.Frozen)
}

// up brings f (or one container and its dependencies) up.
func (d *Daemon) up(ctx context.Context, f *composefile.File, target string, frozen bool) (*opResult, error) {
	if err := d.checkEngineSection(f); err != nil {
		return nil, err
	}
	var targets []string
	if target != "" {
		if _, ok := f.Containers[target]; !ok {
			return nil, unknownContainer(f, target)
		}
		targets = []string{target}
	}
	p, err := d.projectFor(f)
	if err != nil {
		return nil, err
	}
	if err := p.acquire(ctx); err != nil {
		return nil, err
	}
	defer p.release()
	// Packages are resolved, locked and downloaded before anything
	// starts: a registry or digest failure starts nothing.
	prep, err := d.preparePackages(ctx, p, f, targets, frozen)
	if err != nil {
		return nil, err
	}
	return p.up(ctx, prep.file, targets)
}

func (d *Daemon) fnDown(ctx context.Context, r *request) (any, error) {
	target, err := containerArg(fnDown, r, false)
	if err != nil {
		return nil, err
	}
	path, err := d.canonical(r)
	if err != nil {
		return nil, err
	}
	p := d.loadedProject(path)
	f, ferr := d.loadFile(r)
	if p == nil {
		if ferr != nil {
			return nil, ferr
		}
		// Not loaded here: load it anyway, so what a crashed Compose left
		// running is adopted and stopped.
		if p, err = d.projectFor(f); err != nil {
			return nil, err
		}
	} else if ferr != nil {
		// The file broke since it was loaded: stop what runs by the
		// declarations it was started with.
		f = p.currentFile()
	}
	if target != "" {
		if _, ok := f.Containers[target]; !ok {
			p.mu.Lock()
			_, known := p.cs[target]
			p.mu.Unlock()
			if !known {
				return nil, unknownContainer(f, target)
			}
		}
	}
	if err := p.acquire(ctx); err != nil {
		return nil, err
	}
	var targets []string
	if target != "" {
		targets = []string{target}
	}
	res := p.down(ctx, f, targets)
	full := target == "" && !p.anyRunning()
	p.release()
	if full {
		d.unload(p)
	}
	return res, nil
}

func (d *Daemon) fnRestart(ctx context.Context, r *request) (any, error) {
	worker, err := containerArg(fnRestart, r, true)
	if err != nil {
		return nil, err
	}
	if worker == "" {
		return d.restartAll(ctx, r)
	}
	path, err := d.canonical(r)
	if err != nil {
		return nil, err
	}
	p := d.loadedProject(path)
	if p == nil {
		return nil, compose.New(compose.CodeUnknownProject, fmt.Sprintf(
			"%s is not running on this Compose daemon; bring it up first with compose::up", path))
	}
	if err := p.acquire(ctx); err != nil {
		return nil, err
	}
	defer p.release()
	f := p.currentFile()
	if _, ok := f.Containers[worker]; !ok {
		return nil, unknownContainer(f, worker)
	}
	return p.restartOne(ctx, f, worker), nil
}

// restartAll is restart without a worker: down, read the file again, up.
// The file is read and checked first, so a broken edit leaves the
// project running.
func (d *Daemon) restartAll(ctx context.Context, r *request) (any, error) {
	f, err := d.loadFile(r)
	if err != nil {
		return nil, err
	}
	if err := d.checkEngineSection(f); err != nil {
		return nil, err
	}
	if p := d.loadedProject(f.Path); p != nil {
		if p.ns != f.Namespace {
			if err := p.acquire(ctx); err != nil {
				return nil, err
			}
			p.down(ctx, p.currentFile(), nil)
			p.release()
			d.unload(p)
		} else {
			if err := p.acquire(ctx); err != nil {
				return nil, err
			}
			// The packages of the file as it reads now are ready before
			// anything stops: a failure leaves the project running.
			p.mu.Lock()
			frozen := p.frozen
			p.mu.Unlock()
			prep, err := d.preparePackages(ctx, p, f, nil, frozen)
			if err != nil {
				p.release()
				return nil, err
			}
			f = prep.file
			down := p.down(ctx, p.currentFile(), nil)
			res, err := p.up(ctx, f, nil)
			p.release()
			if err != nil {
				return nil, err
			}
			restarted := map[string]bool{}
			for _, c := range down.Containers {
				restarted[c.Container] = c.Changed
			}
			for i := range res.Containers {
				if restarted[res.Containers[i].Container] {
					res.Containers[i].Changed = true
					res.Changed = true
				}
			}
			return res, nil
		}
	}
	return d.up(ctx, f, "", false)
}

// restartOne stops and starts one container; its dependencies and
// dependents are left as they are. An adapter restarts through the
// plugin host (its sandboxes and worker VMs are adopted by the new
// process: restartAdapterWithVMs).
func (p *project) restartOne(ctx context.Context, f *composefile.File, key string) *opResult {
	res := newOp()
	c := p.get(key)
	decl := f.Containers[key]
	p.mu.Lock()
	wasRunning := c.running()
	isAdapter := c.adapter != nil
	p.mu.Unlock()
	var err error
	if isAdapter && wasRunning && p.isAdapter(f, decl) {
		return p.restartAdapterWithVMs(ctx, f, c, decl)
	}
	p.stopOne(ctx, c, nil)
	_, err = p.startOne(ctx, f, key)
	if err != nil {
		res.add(containerResult{Container: key, State: state.StatusFailed, Error: errJSON(asComposeError(err))})
		return res
	}
	res.add(containerResult{Container: key, State: c.state, Changed: true})
	return res
}

// restartAdapterWithVMs restarts a running adapter container through the
// plugin host, with a freshly merged configuration (new host roots among
// it) and, when the lock names another binary, from that one (an upgrade).
// The worker VMs it boots are not stopped: an adapter that keeps its
// sandboxes (sandbox-libkrun's adopt_grace_ms) detaches them at its stop
// and the new process adopts them, with their commands, disks and engine
// connections. A VM container whose VM did not come back (an adapter
// without a grace, or one that expired) is started again, keeping its disk.
func (p *project) restartAdapterWithVMs(ctx context.Context, f *composefile.File, c *container, decl *composefile.Container) *opResult {
	res := newOp()
	af, aerr := p.augment(f)
	if aerr != nil {
		af = f
	}
	var vms []string
	for _, k := range af.Dependents(c.key) {
		p.mu.Lock()
		dc := p.cs[k]
		running := dc != nil && dc.vm != nil && dc.running() && dc.vm.AdapterKey == c.key
		p.mu.Unlock()
		if running {
			vms = append(vms, k)
		}
	}
	p.mu.Lock()
	c.decl = decl
	p.mu.Unlock()
	if err := p.restartAdapter(ctx, f, c); err != nil {
		res.add(containerResult{Container: c.key, State: state.StatusFailed, Error: errJSON(asComposeError(err))})
		for _, k := range vms {
			reason := compose.New(CodeDependencyFailed, fmt.Sprintf(
				"container %q runs in a VM that %q boots, and that adapter did not come back from its restart; start the project again with compose::up", k, c.key))
			p.stopOne(ctx, p.get(k), reason)
			res.add(containerResult{Container: k, State: state.StatusFailed, Error: errJSON(reason)})
		}
		return res
	}
	res.add(containerResult{Container: c.key, State: c.state, Changed: true})
	for _, k := range vms {
		vc := p.get(k)
		p.mu.Lock()
		ref := vc.vm
		p.mu.Unlock()
		if ref != nil {
			if st, err := p.d.vms().Status(ctx, ref); err == nil && !vmworkers.Ended(st.State) {
				p.d.log.Info("a VM worker outlived its adapter's restart", "container", k, "vm_id", ref.ID, "state", st.State)
				res.add(containerResult{Container: k, State: vc.state})
				continue
			}
		}
		p.stopOne(ctx, vc, nil)
		if _, err := p.startOne(ctx, af, k); err != nil {
			res.add(containerResult{Container: k, State: state.StatusFailed, Error: errJSON(asComposeError(err))})
			continue
		}
		res.add(containerResult{Container: k, State: p.get(k).state, Changed: true})
	}
	return res
}

func (d *Daemon) fnStatus(ctx context.Context, r *request) (any, error) {
	f, err := d.loadFile(r)
	path := ""
	if err != nil {
		// A broken file still has a status if its project runs.
		if path, err = d.canonical(r); err != nil {
			return nil, err
		}
		p := d.loadedProject(path)
		if p == nil {
			_, lerr := d.loadFile(r)
			return nil, lerr
		}
		f = p.currentFile()
	}
	live, _ := listWorkers(ctx, d.eng)
	if p := d.loadedProject(f.Path); p != nil {
		out := p.status(f, live)
		p.adapterPIDs(ctx, &out)
		return out, nil
	}
	return d.statusUnloaded(f, live)
}

// statusUnloaded reports a project this daemon does not run: every
// container stopped, unless the engine shows a worker of that name (then
// ready, owned:false), with what an earlier run recorded.
func (d *Daemon) statusUnloaded(f *composefile.File, live []liveWorker) (any, error) {
	dir := state.DirFor(f.Path, f.Namespace, d.getenv)
	out := statusJSON{Namespace: f.Namespace, File: f.Path, StateDir: dir, DaemonPID: os.Getpid(), Containers: []containerStatus{}}
	var st *state.State
	if data, err := os.ReadFile(filepath.Join(dir, state.StateFile)); err == nil {
		st, _ = state.Decode(data, filepath.Join(dir, state.StateFile))
	}
	for _, key := range f.Order {
		cs := containerStatus{Container: key, State: state.StatusStopped, LogPath: logPath(filepath.Join(dir, state.LogsDir), key)}
		if st != nil {
			if rec := st.Containers[key]; rec != nil && rec.LastError != nil {
				cs.LastError = &errorJSON{Code: rec.LastError.Code, Message: rec.LastError.Message}
			}
		}
		for _, w := range live {
			if w.name() == key && w.Namespace == f.Namespace {
				cs.State = state.StatusReady
			}
		}
		out.Containers = append(out.Containers, cs)
	}
	return out, nil
}

func (d *Daemon) fnList(context.Context, *request) (any, error) {
	type projectJSON struct {
		Namespace  string            `json:"namespace"`
		File       string            `json:"file"`
		StateDir   string            `json:"state_dir"`
		Containers []containerResult `json:"containers"`
	}
	d.mu.Lock()
	order := append([]string(nil), d.loaded...)
	ps := make([]*project, 0, len(order))
	for _, path := range order {
		ps = append(ps, d.projects[path])
	}
	d.mu.Unlock()
	out := struct {
		Daemon          string        `json:"daemon"`
		DaemonNamespace string        `json:"daemon_namespace"`
		DaemonPID       int           `json:"daemon_pid"`
		Version         string        `json:"version"`
		Engine          string        `json:"engine"`
		ManagedEngine   bool          `json:"managed_engine"`
		Projects        []projectJSON `json:"projects"`
	}{WorkerName, d.ns, os.Getpid(), versionString(), d.url, d.managed != nil, []projectJSON{}}
	for _, p := range ps {
		pj := projectJSON{Namespace: p.ns, File: p.path, StateDir: p.store.Dir(), Containers: []containerResult{}}
		f := p.currentFile()
		p.mu.Lock()
		for _, key := range f.Order {
			st := state.StatusStopped
			if c := p.cs[key]; c != nil {
				st = c.state
			}
			pj.Containers = append(pj.Containers, containerResult{Container: key, State: st})
		}
		p.mu.Unlock()
		out.Projects = append(out.Projects, pj)
	}
	return out, nil
}

func (d *Daemon) fnValidate(_ context.Context, r *request) (any, error) {
	f, err := d.loadFile(r)
	if err != nil {
		return nil, err
	}
	order, err := f.StartOrder()
	if err != nil {
		return nil, err
	}
	deferred := []string{}
	for _, key := range order {
		if f.Containers[key].Source.Kind == composefile.SourcePackage {
			deferred = append(deferred, key)
		}
	}
	return map[string]any{"namespace": f.Namespace, "start_order": order, "deferred_packages": deferred}, nil
}

func (d *Daemon) fnStop(context.Context, *request) (any, error) {
	d.mu.Lock()
	files := append([]string{}, d.loaded...)
	d.mu.Unlock()
	// The reply goes out on the connection the stop closes: give it a
	// moment to leave first.
	time.AfterFunc(stopReplyGrace, d.requestStop)
	return map[string]any{"daemon": WorkerName, "namespace": d.ns, "pid": os.Getpid(), "stopping": files}, nil
}

// register serves every compose::* function in the daemon namespace.
func (d *Daemon) register() error {
	for _, fd := range d.functionDefs() {
		h := fd.handler
		id := fd.id
		def := client.FunctionDef{
			ID: id, Description: fd.description,
			RequestSchema: json.RawMessage(fd.request), ResponseSchema: json.RawMessage(fd.response),
		}
		if fd.privileged {
			def.Metadata = json.RawMessage(`{"privileged":true}`)
		}
		_, err := d.cl.RegisterFunction(def, func(ctx context.Context, inv *client.Invocation) (any, error) {
			r, err := decodeRequest(id, inv.Data)
			if err == nil {
				err = d.guard(r)
			}
			if err != nil {
				return nil, wireError(err)
			}
			out, err := h(ctx, r)
			if err != nil {
				return nil, wireError(err)
			}
			return out, nil
		})
		if err != nil {
			return compose.New(compose.CodeEngineCallFailed, fmt.Sprintf("register %s: %v", id, err))
		}
	}
	// The engine handles a connection's frames in order: once a call made
	// after the registrations is answered, compose::* is callable, and
	// whoever waits for the daemon (--up's caller, scripts) may call it.
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	if _, err := listWorkers(ctx, d.eng); err != nil {
		return err
	}
	// A refusal arrives before that answer: the ids are reserved to the
	// engine token's holder, so without the token nothing is served.
	for _, fd := range d.functionDefs() {
		if err := d.cl.RegistrationError(fd.id); err != nil {
			return compose.New(compose.CodeEngineCallFailed, fmt.Sprintf(
				"the engine at %s refused %s (%v): compose::* may be served only by a connection that holds the engine token; run Compose as the user who runs the engine (it reads ~/.iii/engine-token) or give it the engine's token in %s",
				d.url, fd.id, err, envEngineToken))
		}
	}
	return nil
}

// wireError is how a handler error travels: {code, message}.
func wireError(err error) error {
	return asComposeError(err).ErrorBody()
}
