package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	"github.com/iii-sandbox/iii/compose/lockfile"
	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/protocol"
)

// Worker VMs: registry bundles (unless runtime: host) and path:// workers
// whose iii.worker.yaml sets runtime.base_image run in VMs that the sandbox
// adapter boots through <adapter>::worker::* in its namespace
// (docs/vm-workers.md). Compose keeps no process for them: the adapter
// owns the VM and its state directory, Compose owns the decision to start,
// watch and stop it.

const (
	// vmIDHashedPrefix is how much of a long vm_id is kept before "-" and
	// 8 hex digits of its hash: 39 + 1 + 8 = contract.MaxVMIDLen.
	vmIDHashedPrefix = contract.MaxVMIDLen - 9
	// vmLogTailLines is how much of worker::logs a start failure quotes:
	// the adapter's own notes (copy, install, exit) come with the output.
	vmLogTailLines = 10
	// vmCallTimeout bounds the quick worker::* calls (status, logs).
	vmCallTimeout = 30 * time.Second
	// vmStopMargin is added to stop_timeout for worker::stop: the adapter
	// also powers the VM off after the grace.
	vmStopMargin = 30 * time.Second
)

// vmRef is a container's worker VM: the adapter that runs it and its
// vm_id.
type vmRef struct {
	id      string
	adapter *adapterRef
	// adapterKey is the adapter's container in this project; "" when it
	// runs elsewhere (engine.sandbox.namespace names another namespace).
	adapterKey string
	hostDir    string
	// stateDir is <state_dir>/workers/<vm_id> as the adapter reported it
	// (guarded by the project's mu); "" until then.
	stateDir string
	// exit says how the VM's command ended, for WORKER_EXITED.
	exit string
}

// VMID is the vm_id of a project's VM container: <slug>-<namespace>-<key>,
// lower-cased, with anything outside [a-z0-9._-] turned into '-' and
// leading characters other than a letter or digit dropped; longer than 48
// characters, its first 39, '-' and the first 8 hex digits of the SHA-256
// of the whole. The slug is the project's (state.LocationSlug), so the id is
// stable across runs (the VM's disk is reused) and changes when the project
// directory moves or is renamed, or III_COMPOSE_STATE_DIR changes.
func VMID(composePath, ns, key string, getenv func(string) string) string {
	raw := strings.ToLower(state.LocationSlug(composePath, getenv) + "-" + ns + "-" + key)
	b := []byte(raw)
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '.' && c != '_' && c != '-' {
			b[i] = '-'
		}
	}
	id := strings.TrimLeft(string(b), "._-")
	if id == "" {
		id = "project"
	}
	if len(id) > contract.MaxVMIDLen {
		sum := sha256.Sum256([]byte(id))
		id = id[:vmIDHashedPrefix] + "-" + hex.EncodeToString(sum[:])[:8]
	}
	return id
}

// vmAdapterOf is the adapter that boots f's worker VMs and the namespace it
// runs in: the adapter engine.sandbox binds, else sandbox-libkrun; its
// namespace, else the project's.
func vmAdapterOf(f *composefile.File) (name, ns string) {
	name, ns = composefile.AdapterPackage, f.Namespace
	if e := f.Engine; e != nil && !e.Empty && e.Sandbox != nil {
		name = e.Sandbox.Adapter
		if e.Sandbox.Namespace != "" {
			ns = e.Sandbox.Namespace
		}
	}
	return name, ns
}

// adapterKeyIn is the container of f that is the package adapter name
// ("" when f declares none).
func adapterKeyIn(f *composefile.File, name string) string {
	for _, key := range f.Order {
		if f.Containers[key].IsAdapter(name) {
			return key
		}
	}
	return ""
}

// isVMContainer reports whether key runs in a VM: a path:// worker whose
// manifest sets runtime.base_image, or a bundle (from the lock, l may be
// nil) without runtime: host.
func isVMContainer(f *composefile.File, l *lockfile.Lock, key string) bool {
	c := f.Containers[key]
	if c == nil {
		return false
	}
	switch c.Source.Kind {
	case composefile.SourcePath:
		return baseImage(c.Source.Path) != ""
	case composefile.SourcePackage:
		e := l.EntryOf(key)
		return e != nil && e.Resolved.Type == registry.KindBundle && c.Runtime != "host"
	}
	return false
}

// vmContainers lists f's VM containers in file order.
func vmContainers(f *composefile.File, l *lockfile.Lock) []string {
	var out []string
	for _, key := range f.Order {
		if isVMContainer(f, l, key) {
			out = append(out, key)
		}
	}
	return out
}

// vmRefFor is the worker VM of f's container key as the file says it
// would run (the host directory is filled in by the start).
func (d *Daemon) vmRefFor(f *composefile.File, key string) *vmRef {
	name, ns := vmAdapterOf(f)
	ref := &vmRef{id: VMID(f.Path, f.Namespace, key, d.getenv), adapter: &adapterRef{name: name, ns: ns}}
	if k := adapterKeyIn(f, name); k != "" {
		ref.adapterKey = k
		ref.adapter = adapterRefIn(f, f.Containers[k])
	}
	return ref
}

// lockOf is what the project knows of f's lock: the lock file, with the
// entries of the last preparation over it.
func (p *project) lockOf(f *composefile.File) *lockfile.Lock {
	l, err := lockfile.Read(lockfile.PathFor(f.Path))
	if err != nil || l == nil {
		l = lockfile.New()
	}
	p.mu.Lock()
	for k, pi := range p.pkgs {
		if pi != nil && f.Containers[k] != nil {
			l.Containers[k] = pi.entry
		}
	}
	p.mu.Unlock()
	return l
}

// augment gives f the implicit edges: every VM container starts after the
// adapter container that boots it.
func (p *project) augment(f *composefile.File) (*composefile.File, error) {
	l := p.lockOf(f)
	edges := map[string][]string{}
	for _, key := range vmContainers(f, l) {
		if ref := p.d.vmRefFor(f, key); ref.adapterKey != "" {
			edges[key] = []string{ref.adapterKey}
		}
	}
	return f.WithImplicitStartAfter(edges)
}

// vmPlan is how one VM container starts.
type vmPlan struct {
	ref                    *vmRef
	image, install, cmd    string
	workdir                string
	exclude, include       []string
	holdsComposeFile       bool
	hookDir                string
	bundle                 bool
	packageName, packageAt string
}

// planVM reads what a VM container runs: its manifest (the bundle's in the
// package cache, or the path:// worker's), the start command (scripts.run
// of the compose file, else the manifest's scripts.start), the install
// step and the image.
func (p *project) planVM(f *composefile.File, decl *composefile.Container, pi *pkgInfo) (*vmPlan, error) {
	key := decl.Key
	pl := &vmPlan{ref: p.d.vmRefFor(f, key)}
	dir := decl.Source.Path
	if pi != nil {
		dir, pl.bundle = pi.inst.Dir, true
		pl.packageName, pl.packageAt = pi.entry.Resolved.Name, pi.entry.Resolved.Version
	}
	m, err := loadManifest(key, dir)
	if err != nil {
		return nil, err
	}
	if m == nil && pl.bundle {
		return nil, compose.New(compose.CodeInvalidManifest, fmt.Sprintf("container %q: the bundle %s %s has no %s in %s", key, pl.packageName, pl.packageAt, ManifestFile, dir))
	}
	if pl.cmd, err = commandOf(key, dir, decl.Scripts.Run, m); err != nil {
		return nil, err
	}
	if pl.image, err = vmImage(key, dir, m); err != nil {
		return nil, err
	}
	if m != nil {
		pl.install = m.Scripts.Install
	}
	if pl.include, pl.exclude, err = copyPaths(key, dir, m); err != nil {
		return nil, err
	}
	pl.hookDir = dir
	if decl.WorkingDir != "" {
		if pl.bundle {
			p.d.log.Warn("working_dir is ignored for a bundle: it runs in its own directory", "container", key, "working_dir", decl.WorkingDir)
		} else {
			rel, err := filepath.Rel(dir, decl.WorkingDir)
			if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
				return nil, compose.New(compose.CodeSpawnFailed, fmt.Sprintf(
					"container %q runs in a VM, which sees only its worker directory %s (as /workspace), and working_dir %s is outside it; use a directory under it or leave working_dir out",
					key, dir, decl.WorkingDir))
			}
			if rel != "." {
				pl.workdir = filepath.ToSlash(rel)
			}
			pl.hookDir = decl.WorkingDir
		}
	}
	pl.ref.hostDir = dir
	pl.holdsComposeFile = pathUnder(f.Path, dir)
	// Compose's state (the project token among it) never enters a VM: the
	// adapter leaves every .iii out, and a state directory moved under
	// the worker with III_COMPOSE_STATE_DIR is left out here.
	for _, ex := range []string{p.d.stateRoot(p), p.d.pk.installer.Dir} {
		if ex != "" && pathUnder(ex, dir) && ex != dir {
			pl.exclude = append(pl.exclude, ex)
		}
	}
	return pl, nil
}

// stateRoot is where Compose keeps project state: $III_COMPOSE_STATE_DIR,
// else the project's own state directory.
func (d *Daemon) stateRoot(p *project) string {
	if v := d.getenv(state.EnvStateDir); v != "" {
		if abs, err := filepath.Abs(v); err == nil {
			return abs
		}
		return v
	}
	return p.store.Dir()
}

// pathUnder reports whether p is dir or lies under it.
func pathUnder(p, dir string) bool {
	p, dir = filepath.Clean(p), filepath.Clean(dir)
	if p == dir {
		return true
	}
	if dir == string(filepath.Separator) {
		return true
	}
	return strings.HasPrefix(p, dir+string(filepath.Separator))
}

// startVM boots a VM container through <adapter>::worker::start and waits
// until the worker registers in the project namespace (spec §5.10).
func (p *project) startVM(ctx context.Context, f *composefile.File, c *container, pi *pkgInfo) error {
	decl := c.decl
	key := c.key
	pl, err := p.planVM(f, decl, pi)
	if err != nil {
		return err
	}
	ref := pl.ref
	if err := p.adapterReady(key, ref); err != nil {
		return err
	}
	live, err := listWorkers(ctx, p.d.eng)
	if err != nil {
		return err
	}
	baseline := map[string]bool{}
	for _, w := range live {
		baseline[w.ID] = true
	}
	for _, w := range live {
		if w.name() != key || w.Namespace != p.ns {
			continue
		}
		// A worker of that name runs. When it is this very VM (the adapter
		// still runs it, e.g. after Compose was restarted), the start
		// below takes it over; otherwise the name is taken.
		if st, err := p.d.vmStatus(ctx, ref); err == nil && (st.State == contract.WorkerRunning || st.State == contract.WorkerStarting) {
			delete(baseline, w.ID)
			continue
		}
		return compose.New(compose.CodeContainerNameTaken, fmt.Sprintf(
			"container %q: a worker named %q already runs in namespace %q (engine worker %s) and this Compose did not start it; stop that worker or rename the container",
			key, key, p.ns, w.ID))
	}
	cfgPath, err := p.resolveConfig(ctx, decl, pi)
	if err != nil {
		return err
	}
	var cfg *contract.WorkerConfigFile
	if cfgPath != "" {
		data, err := os.ReadFile(cfgPath)
		if err != nil {
			return compose.New(compose.CodeIOError, fmt.Sprintf("container %q: read its configuration %s: %v", key, cfgPath, err))
		}
		cfg = &contract.WorkerConfigFile{FileName: filepath.Base(cfgPath), Content: string(data)}
	}
	reserved := map[string]string{
		envNamespace:        p.ns,
		envComposeNamespace: p.d.ns,
		envComposeFile:      f.Path,
		envComposeDir:       f.Dir,
		envWorkerName:       key,
	}
	if decl.ConfigName != "" {
		reserved[envConfigName] = decl.ConfigName
	}
	env, err := vmEnv(p.d.lookup, decl, reserved)
	if err != nil {
		return err
	}
	// Hooks run on the host, beside the VM: the host worker's
	// environment, with III_ISOLATION saying where the worker runs.
	hostReserved := map[string]string{envURL: p.d.url, envIsolation: "libkrun"}
	for k, v := range reserved {
		hostReserved[k] = v
	}
	if cfgPath != "" {
		hostReserved[envConfig] = cfgPath
	}
	hookEnv, err := workerEnv(p.d.lookup, decl, hostReserved)
	if err != nil {
		return err
	}
	log, err := p.prepare(c, hookEnv, pl.hookDir)
	if err != nil {
		return err
	}
	if err := preRun(ctx, c, pl.hookDir, hookEnv, f.StopTimeout, log); err != nil {
		return err
	}
	// The record goes first: once the copy has begun, the VM may have
	// read whatever its directory holds.
	p.recordVMRun(ctx, key, pl)
	cred, err := p.issueVMCredential(ctx, key, ref)
	if err != nil {
		return vmCallFailed(key, ref, contract.OpWorkerStart, "could not give it an engine credential", err)
	}
	req := contract.WorkerStartRequest{
		VMID: ref.id, Name: key, Namespace: p.ns, Image: pl.image, HostDir: pl.ref.hostDir,
		Workdir: pl.workdir, Install: pl.install, Command: pl.cmd, Env: env, Config: cfg,
		EngineURL: p.d.url, Exclude: pl.exclude, Include: pl.include, EngineCredential: cred,
	}
	_ = log.Write(proc.Stderr, []byte(fmt.Sprintf("[compose] starting %s in a VM: %s::worker::start vm_id %s, image %s, %s", key, ref.adapter.name, ref.id, pl.image, pl.cmd)))
	if _, err := p.d.vmCall(ctx, ref.adapter, contract.OpWorkerStart, req, adapterStartTimeout); err != nil {
		return vmCallFailed(key, ref, contract.OpWorkerStart, "did not boot it", err)
	}
	p.mu.Lock()
	c.vm, c.owned = ref, true
	p.mu.Unlock()
	return p.settle(ctx, c, func() error { return p.waitReadyVM(ctx, c, ref, baseline, decl.StartupTimeout) })
}

// adapterReady checks that the adapter container that boots key's VM runs
// (it starts first: an implicit start_after).
func (p *project) adapterReady(key string, ref *vmRef) error {
	if ref.adapterKey == "" {
		return nil
	}
	p.mu.Lock()
	ac := p.cs[ref.adapterKey]
	ready := ac != nil && ac.state == state.StatusReady
	var why string
	if ac != nil && ac.lastErr != nil {
		why = fmt.Sprintf(" (%s: %s)", ac.lastErr.Code, ac.lastErr.Message)
	}
	p.mu.Unlock()
	if ready {
		return nil
	}
	return compose.New(compose.CodeSpawnFailed, fmt.Sprintf(
		"container %q runs in a VM that the sandbox adapter %s (container %q) boots, and that adapter is not running%s; start it with `iii call compose::up`",
		key, ref.adapter.name, ref.adapterKey, why))
}

// recordVMRun notes in <state>/vm-workers.json which adapter version runs
// this VM and whether its directory holds the compose file (the next
// `iii compose --up` replaces the project token when an adapter before
// 0.3.1 did).
func (p *project) recordVMRun(ctx context.Context, key string, pl *vmPlan) {
	version := ""
	if pl.ref.adapterKey != "" {
		p.mu.Lock()
		if pi := p.pkgs[pl.ref.adapterKey]; pi != nil {
			version = pi.entry.Resolved.Version
		}
		p.mu.Unlock()
	}
	if version == "" {
		if st, found, err := adapterState(ctx, p.d.eng, pl.ref.adapter); err == nil && found {
			version = st.AdapterVersion
		}
	}
	run := state.VMRun{Container: key, VMID: pl.ref.id, Adapter: pl.ref.adapter.name, AdapterVersion: version,
		HostDir: pl.ref.hostDir, HoldsComposeFile: pl.holdsComposeFile, At: time.Now().UTC()}
	if err := p.store.RecordVMRun(run); err != nil {
		p.d.log.Error("cannot record the VM worker's run", "container", key, "error", err)
	}
}

// waitReadyVM polls the engine's worker list until the VM's worker
// registers in the project namespace, and worker::status for a VM whose
// command ended first (CHILD_EXITED_BEFORE_REGISTRATION, with the tail of
// worker::logs).
func (p *project) waitReadyVM(ctx context.Context, c *container, ref *vmRef, baseline map[string]bool, timeout time.Duration) error {
	key := c.key
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for {
		if live, err := listWorkers(ctx, p.d.eng); err == nil {
			for _, w := range live {
				if baseline[w.ID] || w.name() != key {
					continue
				}
				if w.Namespace == p.ns {
					return nil
				}
				return compose.New(compose.CodeWorkerIgnoredNamespace, fmt.Sprintf(
					"container %q registered as worker %q in namespace %q instead of %q: the worker must register in $III_NAMESPACE (engine::workers::register with namespace, or the SDK's namespace option)",
					key, key, w.Namespace, p.ns))
			}
		}
		st, err := p.d.vmStatus(ctx, ref)
		switch {
		case err == nil:
			p.noteStateDir(ref, st)
			if ended(st.State) {
				return compose.New(compose.CodeChildExitedBeforeRegistration, fmt.Sprintf(
					"container %q: its VM (vm_id %s) %s before it registered as worker %q in namespace %q%s",
					key, ref.id, vmEndText(st), key, p.ns, p.vmTail(ctx, ref)))
			}
		case sandboxCodeOf(err) == string(contract.S301):
			return compose.New(compose.CodeSpawnFailed, fmt.Sprintf("container %q: the sandbox adapter %s stopped while its VM started: %s",
				key, ref.adapter.name, sandboxErrorText(err)))
		}
		select {
		case <-ctx.Done():
			return compose.New(compose.CodeStartupTimeout, fmt.Sprintf("container %q: the start was interrupted (%v)", key, ctx.Err()))
		case <-deadline.C:
			return compose.New(compose.CodeStartupTimeout, fmt.Sprintf(
				"container %q did not register as worker %q in namespace %q within %s (startup_timeout); its VM (vm_id %s) boots, copies the worker and runs its install step first, so a first start can take a while: raise startup_timeout, or check that it connects to $III_URL and registers with $III_WORKER_NAME in $III_NAMESPACE%s",
				key, key, p.ns, timeout, ref.id, p.vmTail(ctx, ref)))
		case <-tick.C:
		}
	}
}

// ended reports a worker::status state in which the command no longer runs.
func ended(s string) bool {
	return s == contract.WorkerExited || s == contract.WorkerFailed || s == contract.WorkerStopped
}

// vmEndText says how a worker VM's command ended.
func vmEndText(st *contract.WorkerStatus) string {
	var b strings.Builder
	switch st.State {
	case contract.WorkerExited:
		b.WriteString("exited")
	case contract.WorkerStopped:
		b.WriteString("was stopped by its adapter")
	default:
		b.WriteString("failed")
	}
	if st.ExitCode != nil {
		fmt.Fprintf(&b, " (status %d)", *st.ExitCode)
	}
	if st.LastError != "" {
		b.WriteString(": " + clip(st.LastError, 400))
	}
	return b.String()
}

// noteStateDir keeps the state directory the adapter reported.
func (p *project) noteStateDir(ref *vmRef, st *contract.WorkerStatus) {
	if st.StateDir == "" {
		return
	}
	p.mu.Lock()
	ref.stateDir = st.StateDir
	p.mu.Unlock()
}

// vmTail formats the last lines of worker::logs for a message.
func (p *project) vmTail(ctx context.Context, ref *vmRef) string {
	entries, _, _, err := p.d.vmLogs(ctx, ref, vmLogTailLines, nil, "")
	if err != nil || len(entries) == 0 {
		return ""
	}
	lines := make([]string, 0, len(entries))
	for _, e := range entries {
		lines = append(lines, clip(e.Message, 400))
	}
	return "; last output:\n  " + strings.Join(lines, "\n  ")
}

// stopVM stops a VM container's worker: SIGTERM, stop_timeout, SIGKILL,
// power off (worker::stop). Its state directory stays.
func (p *project) stopVM(ctx context.Context, c *container, ref *vmRef, grace time.Duration) {
	ms := min(uint64(grace/time.Millisecond), contract.MaxWorkerStopTimeoutMS)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace+vmStopMargin)
	defer cancel()
	raw, err := p.d.vmCall(sctx, ref.adapter, contract.OpWorkerStop, contract.WorkerStopRequest{VMID: ref.id, TimeoutMS: ms}, grace+vmStopMargin)
	p.forgetVMCredential(sctx, ref.id)
	text := "stopped"
	if err != nil {
		if sandboxCodeOf(err) != string(contract.S002) {
			p.d.log.Error("cannot stop a worker VM", "container", c.key, "vm_id", ref.id, "adapter", ref.adapter.name, "error", sandboxErrorText(err))
		}
		text = "not stopped by its adapter: " + sandboxErrorText(err)
	} else {
		var st contract.WorkerStatus
		if json.Unmarshal(raw, &st) == nil {
			p.noteStateDir(ref, &st)
			if st.ExitCode != nil {
				text = fmt.Sprintf("stopped (status %d)", *st.ExitCode)
			}
		}
	}
	if l := c.log; l != nil {
		_ = l.Write(proc.Stderr, []byte(fmt.Sprintf("[compose] %s %s (vm_id %s)", c.key, text, ref.id)))
	}
}

// vmCall calls <adapter>::<op> in the adapter's namespace.
func (d *Daemon) vmCall(ctx context.Context, ref *adapterRef, op string, req any, timeout time.Duration) (json.RawMessage, error) {
	return d.eng.Call(ctx, ref.name+"::"+op, req, client.WithNamespace(ref.ns), callTimeout(timeout))
}

// vmStatus is worker::status of ref.
func (d *Daemon) vmStatus(ctx context.Context, ref *vmRef) (*contract.WorkerStatus, error) {
	raw, err := d.vmCall(ctx, ref.adapter, contract.OpWorkerStatus, contract.WorkerStatusRequest{VMID: ref.id}, vmCallTimeout)
	if err != nil {
		return nil, err
	}
	var st contract.WorkerStatus
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, fmt.Errorf("%s::%s returned an unexpected reply: %v", ref.adapter.name, contract.OpWorkerStatus, err)
	}
	return &st, nil
}

// vmLogs reads worker::logs of ref as compose::logs entries: the
// adapter's own notes (stream system) come as stderr lines prefixed with
// the adapter's name. A cursor is {generation: 0, offset: the seq of the
// last entry read}.
func (d *Daemon) vmLogs(ctx context.Context, ref *vmRef, tail int, cur *proc.Cursor, stream proc.Stream) ([]proc.Entry, proc.Cursor, bool, error) {
	req := contract.WorkerLogsRequest{VMID: ref.id, Tail: uint64(max(tail, 1))}
	if cur != nil {
		seq := uint64(max(cur.Offset, 0))
		req.Cursor, req.Tail = &seq, contract.MaxWorkerLogsTail
	}
	next := proc.Cursor{}
	if cur != nil {
		next = *cur
	}
	raw, err := d.vmCall(ctx, ref.adapter, contract.OpWorkerLogs, req, vmCallTimeout)
	if err != nil {
		return nil, next, false, err
	}
	var rep contract.WorkerLogsResponse
	if err := json.Unmarshal(raw, &rep); err != nil {
		return nil, next, false, fmt.Errorf("%s::%s returned an unexpected reply: %v", ref.adapter.name, contract.OpWorkerLogs, err)
	}
	entries := []proc.Entry{}
	if tail > 0 || cur != nil {
		for _, e := range rep.Entries {
			s, msg := proc.Stream(e.Stream), e.Message
			if e.Stream != contract.LogStdout && e.Stream != contract.LogStderr {
				s, msg = proc.Stderr, "["+ref.adapter.name+"] "+msg
			}
			if stream != "" && s != stream {
				continue
			}
			entries = append(entries, proc.Entry{Stream: s, Message: msg})
		}
	}
	return entries, proc.Cursor{Offset: int64(rep.Cursor)}, rep.Truncated, nil
}

// vmCallFailed is SPAWN_FAILED for a worker::* call the adapter refused,
// carrying its S-code and message (S501 names the host roots and how to
// restart the adapter).
func vmCallFailed(key string, ref *vmRef, op, what string, err error) error {
	return compose.New(compose.CodeSpawnFailed, fmt.Sprintf("container %q: %s::%s in namespace %q %s: %s",
		key, ref.adapter.name, op, ref.adapter.ns, what, sandboxErrorText(err)))
}

// sandboxCodeOf is the S-code of an adapter's error ("" for another error).
func sandboxCodeOf(err error) string {
	var eb *protocol.ErrorBody
	if !errors.As(err, &eb) {
		return ""
	}
	if se, ok := contract.FromErrorBody(eb); ok {
		return string(se.Code)
	}
	return eb.Code
}

// sandboxErrorText words an adapter's error as "S501: message".
func sandboxErrorText(err error) string {
	var eb *protocol.ErrorBody
	if errors.As(err, &eb) {
		if se, ok := contract.FromErrorBody(eb); ok {
			return string(se.Code) + ": " + se.Message
		}
		return eb.Code + ": " + eb.Message
	}
	return err.Error()
}
