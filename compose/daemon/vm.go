package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/lockfile"
	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/compose/vmworkers"
	"github.com/iii-sandbox/iii/contract"
)

// Worker VMs: registry bundles (unless runtime: host) and path:// workers
// whose iii.worker.yaml sets runtime.base_image run in VMs that the sandbox
// adapter boots through <adapter>::worker::* in its namespace
// (docs/vm-workers.md). Compose keeps no process for them: the adapter
// owns the VM and its state directory, Compose owns the decision to start,
// watch and stop it: this file plans, starts, waits for and stops them;
// compose/vmworkers names the VMs and makes the worker::* calls.

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
func (d *Daemon) vmRefFor(f *composefile.File, key string) *vmworkers.Ref {
	name, ns := vmworkers.AdapterOf(f)
	ref := &vmworkers.Ref{ID: vmworkers.VMID(f.Path, f.Namespace, key, d.getenv), Adapter: &vmworkers.Adapter{Name: name, NS: ns}}
	if k := vmworkers.AdapterKeyIn(f, name); k != "" {
		ref.AdapterKey = k
		ref.Adapter = adapterRefIn(f, f.Containers[k])
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
		if ref := p.d.vmRefFor(f, key); ref.AdapterKey != "" {
			edges[key] = []string{ref.AdapterKey}
		}
	}
	return f.WithImplicitStartAfter(edges)
}

// vmPlan is how one VM container starts.
type vmPlan struct {
	ref                    *vmworkers.Ref
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
	pl.ref.HostDir = dir
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
		if st, err := p.d.vms().Status(ctx, ref); err == nil && (st.State == contract.WorkerRunning || st.State == contract.WorkerStarting) {
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
		return vmworkers.CallFailed(key, ref, contract.OpWorkerStart, "could not give it an engine credential", err)
	}
	req := contract.WorkerStartRequest{
		VMID: ref.ID, Name: key, Namespace: p.ns, Image: pl.image, HostDir: pl.ref.HostDir,
		Workdir: pl.workdir, Install: pl.install, Command: pl.cmd, Env: env, Config: cfg,
		EngineURL: p.d.url, Exclude: pl.exclude, Include: pl.include, EngineCredential: cred,
	}
	_ = log.Write(proc.Stderr, []byte(fmt.Sprintf("[compose] starting %s in a VM: %s::worker::start vm_id %s, image %s, %s", key, ref.Adapter.Name, ref.ID, pl.image, pl.cmd)))
	if _, err := p.d.vms().Call(ctx, ref.Adapter, contract.OpWorkerStart, req, adapterStartTimeout); err != nil {
		return vmworkers.CallFailed(key, ref, contract.OpWorkerStart, "did not boot it", err)
	}
	p.mu.Lock()
	c.vm, c.owned = ref, true
	p.mu.Unlock()
	return p.settle(ctx, c, func() error { return p.waitReadyVM(ctx, c, ref, baseline, decl.StartupTimeout) })
}

// adapterReady checks that the adapter container that boots key's VM runs
// (it starts first: an implicit start_after).
func (p *project) adapterReady(key string, ref *vmworkers.Ref) error {
	if ref.AdapterKey == "" {
		return nil
	}
	p.mu.Lock()
	ac := p.cs[ref.AdapterKey]
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
		key, ref.Adapter.Name, ref.AdapterKey, why))
}

// recordVMRun notes in <state>/vm-workers.json which adapter version runs
// this VM and whether its directory holds the compose file (the next
// `iii compose --up` replaces the project token when an adapter before
// 0.3.1 did).
func (p *project) recordVMRun(ctx context.Context, key string, pl *vmPlan) {
	version := ""
	if pl.ref.AdapterKey != "" {
		p.mu.Lock()
		if pi := p.pkgs[pl.ref.AdapterKey]; pi != nil {
			version = pi.entry.Resolved.Version
		}
		p.mu.Unlock()
	}
	if version == "" {
		if st, found, err := adapterState(ctx, p.d.eng, pl.ref.Adapter); err == nil && found {
			version = st.AdapterVersion
		}
	}
	run := state.VMRun{Container: key, VMID: pl.ref.ID, Adapter: pl.ref.Adapter.Name, AdapterVersion: version,
		HostDir: pl.ref.HostDir, HoldsComposeFile: pl.holdsComposeFile, At: time.Now().UTC()}
	if err := p.store.RecordVMRun(run); err != nil {
		p.d.log.Error("cannot record the VM worker's run", "container", key, "error", err)
	}
}

// waitReadyVM polls the engine's worker list until the VM's worker
// registers in the project namespace, and worker::status for a VM whose
// command ended first (CHILD_EXITED_BEFORE_REGISTRATION, with the tail of
// worker::logs).
func (p *project) waitReadyVM(ctx context.Context, c *container, ref *vmworkers.Ref, baseline map[string]bool, timeout time.Duration) error {
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
		st, err := p.d.vms().Status(ctx, ref)
		switch {
		case err == nil:
			p.noteStateDir(ref, st)
			if vmworkers.Ended(st.State) {
				return compose.New(compose.CodeChildExitedBeforeRegistration, fmt.Sprintf(
					"container %q: its VM (vm_id %s) %s before it registered as worker %q in namespace %q%s",
					key, ref.ID, vmworkers.EndText(st), key, p.ns, p.d.vms().Tail(ctx, ref)))
			}
		case vmworkers.CodeOf(err) == string(contract.S301):
			return compose.New(compose.CodeSpawnFailed, fmt.Sprintf("container %q: the sandbox adapter %s stopped while its VM started: %s",
				key, ref.Adapter.Name, vmworkers.ErrorText(err)))
		}
		select {
		case <-ctx.Done():
			return compose.New(compose.CodeStartupTimeout, fmt.Sprintf("container %q: the start was interrupted (%v)", key, ctx.Err()))
		case <-deadline.C:
			return compose.New(compose.CodeStartupTimeout, fmt.Sprintf(
				"container %q did not register as worker %q in namespace %q within %s (startup_timeout); its VM (vm_id %s) boots, copies the worker and runs its install step first, so a first start can take a while: raise startup_timeout, or check that it connects to $III_URL and registers with $III_WORKER_NAME in $III_NAMESPACE%s",
				key, key, p.ns, timeout, ref.ID, p.d.vms().Tail(ctx, ref)))
		case <-tick.C:
		}
	}
}

// noteStateDir keeps the state directory the adapter reported.
func (p *project) noteStateDir(ref *vmworkers.Ref, st *contract.WorkerStatus) {
	if st.StateDir == "" {
		return
	}
	p.mu.Lock()
	ref.StateDir = st.StateDir
	p.mu.Unlock()
}

// stopVM stops a VM container's worker: SIGTERM, stop_timeout, SIGKILL,
// power off (worker::stop). Its state directory stays.
func (p *project) stopVM(ctx context.Context, c *container, ref *vmworkers.Ref, grace time.Duration) {
	ms := min(uint64(grace/time.Millisecond), contract.MaxWorkerStopTimeoutMS)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace+vmworkers.StopMargin)
	defer cancel()
	raw, err := p.d.vms().Call(sctx, ref.Adapter, contract.OpWorkerStop, contract.WorkerStopRequest{VMID: ref.ID, TimeoutMS: ms}, grace+vmworkers.StopMargin)
	p.forgetVMCredential(sctx, ref.ID)
	text := "stopped"
	if err != nil {
		if vmworkers.CodeOf(err) != string(contract.S002) {
			p.d.log.Error("cannot stop a worker VM", "container", c.key, "vm_id", ref.ID, "adapter", ref.Adapter.Name, "error", vmworkers.ErrorText(err))
		}
		text = "not stopped by its adapter: " + vmworkers.ErrorText(err)
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
		_ = l.Write(proc.Stderr, []byte(fmt.Sprintf("[compose] %s %s (vm_id %s)", c.key, text, ref.ID)))
	}
}

// vms calls the adapters that run the worker VMs through the daemon's
// engine connection.
func (d *Daemon) vms() vmworkers.Client { return vmworkers.Client{Eng: d.eng} }
