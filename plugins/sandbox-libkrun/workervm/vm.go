package workervm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentclient"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/boot"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/runner"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

// Names of the worker boot steps that follow the sandbox pipeline.
const (
	StepCopyWorkspace = "copy-workspace"
	StepPublishConfig = "publish-config"
	StepInstall       = "install"
	StepStartWorker   = "start-worker"
)

// Names and places inside a worker's state directory and guest.
const (
	diskName = "disk.ext4"
	// installMarker records, on the persistent disk, the inputs of the
	// install step that last succeeded (install.go).
	installMarker = "/var/lib/iii/install.sha256"
	procWorker    = "worker"
	procInstall   = "install"
	// maxRunnerLog bounds runner.log, which a worker keeps across boots.
	maxRunnerLog = 1 << 20
)

// shutdownProcGrace is the grace a worker's command gets when the adapter
// itself stops: the engine gives the whole adapter a few seconds.
const shutdownProcGrace = 1500 * time.Millisecond

// Set is the adapter's worker VMs, by vm_id.
type Set struct {
	// h boots the VMs; keep reports whether VMs outlive this adapter
	// process (adopt_grace_ms), for shutdown.
	h      boot.Host
	keep   func() bool
	dir    string   // <state_dir>/workers
	roots  []string // resolved host roots
	diskMB uint64
	// cache keeps disks right after an install, for new workers with
	// the same install (diskcache.go).
	cache diskCache

	// bg is what runs live under. It is not the provider's: when the
	// adapter stops, its workers get a graceful stop first (shutdown),
	// and only what is left then is cut off.
	bg       context.Context
	bgCancel context.CancelFunc

	mu          sync.Mutex
	vms         map[string]*workerVM
	closed      bool
	autoInstall bool
	catalog     func(context.Context) []contract.CatalogImage
	runs        sync.WaitGroup
}

// New opens the worker VMs under cfg's state_dir: h boots them, and keep
// reports whether a VM outlives this adapter process when it stops.
func New(ctx context.Context, h boot.Host, keep func() bool, cfg *config.Config) *Set {
	s := &Set{
		h: h, keep: keep, dir: filepath.Join(cfg.StateDir, runner.WorkersDirName),
		roots: resolveHostRoots(cfg.HostRoots), diskMB: cfg.WorkerDiskMB,
		cache: diskCache{dir: filepath.Join(cfg.StateDir, diskCacheDirName)},
		vms:   map[string]*workerVM{}, autoInstall: true,
	}
	s.bg, s.bgCancel = context.WithCancel(context.Background())
	// What an earlier adapter process left running is adopted
	// (adopt.go); the rest is killed, and the directories and
	// their disks stay for the workers' next start.
	s.adoptAll(ctx)
	runner.CleanWorkerLeftovers(ctx, s.dir, h.Log())
	return s
}

// SetKit gives the set what the kit's configuration decides: whether
// images may be pulled, and the catalog names resolve against.
func (s *Set) SetKit(autoInstall bool, catalog func(context.Context) []contract.CatalogImage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.autoInstall, s.catalog = autoInstall, catalog
}

// workerVM is one vm_id.
type workerVM struct {
	set *Set
	id  string
	dir string
	// ops serialises start, stop and remove of this vm_id.
	ops chan struct{}
	log *logStore

	mu   sync.Mutex
	meta workerMeta
	run  *workerRun
}

// workerRun is one boot of a worker VM, from the first step until the VM
// is gone.
type workerRun struct {
	ctx    context.Context
	cancel context.CancelFunc
	hash   string
	// ready is closed when the run leaves starting (it runs, or failed).
	ready     chan struct{}
	readyOnce sync.Once
	done      chan struct{}
	stopping  atomic.Bool
	// detaching: the adapter is going and leaves the VM running for the
	// next adapter process (adopt.go).
	detaching atomic.Bool
	// err is why the run failed, once ready is closed.
	err error

	mu    sync.Mutex
	boot  *boot.Boot
	agent *agentclient.Client
	proc  *agentclient.Proc
	// flush writes the command's last line that had no newline.
	flush func()
	// manifests are the install step's manifests the copy sent (file
	// name → sha256), for the install step's key.
	manifests map[string]string
}

func (r *workerRun) markReady(err error) {
	r.readyOnce.Do(func() {
		r.err = err
		close(r.ready)
	})
}

func (r *workerRun) parts() (*agentclient.Client, *agentclient.Proc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.agent, r.proc
}

// get returns the worker vm_id, loading its record from disk; with create
// a worker without state is made (its directory appears when it starts).
func (s *Set) get(id string, create bool) (*workerVM, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.vms[id]; ok {
		return w, nil
	}
	dir := filepath.Join(s.dir, id)
	w := &workerVM{set: s, id: id, dir: dir, ops: make(chan struct{}, 1)}
	b, err := os.ReadFile(filepath.Join(dir, metaName))
	switch {
	case err == nil:
		m, derr := decodeMeta(b)
		if derr != nil {
			s.h.Log().Warn("unreadable worker record; starting it afresh", "vm_id", id, "error", derr)
			m = &workerMeta{Version: metaVersion, VMID: id, State: contract.WorkerStopped}
		}
		if m.State == contract.WorkerStarting || m.State == contract.WorkerRunning {
			// It ran under an adapter that is gone, and its VM with it
			// (one that outlived it was adopted before any get).
			m.State, m.PID = contract.WorkerStopped, nil
		}
		w.meta = *m
	case errors.Is(err, fs.ErrNotExist):
		if _, serr := os.Stat(dir); serr != nil && !create {
			return nil, contract.UnknownWorker(id)
		}
		w.meta = workerMeta{Version: metaVersion, VMID: id, State: contract.WorkerStopped}
	default:
		return nil, contract.NewError(contract.S300, "read the record of worker %s: %v", id, err)
	}
	w.log = openLogStore(dir, s.h.Now)
	s.vms[id] = w
	return w, nil
}

func (s *Set) forget(w *workerVM) {
	s.mu.Lock()
	if s.vms[w.id] == w {
		delete(s.vms, w.id)
	}
	s.mu.Unlock()
}

// lock takes w's turn for a start, stop or remove.
func (w *workerVM) lock(ctx context.Context) error {
	select {
	case w.ops <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *workerVM) unlock() { <-w.ops }

// update changes the record and writes it.
func (w *workerVM) update(f func(m *workerMeta)) {
	w.mu.Lock()
	f(&w.meta)
	m := w.meta
	w.mu.Unlock()
	if err := os.MkdirAll(w.dir, 0o700); err == nil {
		err = writeMeta(w.dir, &m)
		if err != nil {
			w.set.h.Log().Warn("cannot write the worker record", "vm_id", w.id, "error", err)
		}
	}
}

// note writes a line of the adapter's own to the worker's log.
func (w *workerVM) note(format string, args ...any) {
	if err := w.log.add(contract.LogSystem, fmt.Sprintf(format, args...)); err != nil {
		w.set.h.Log().Warn("cannot write the worker log", "vm_id", w.id, "error", err)
	}
}

func (w *workerVM) status() *contract.WorkerStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.meta
	return &contract.WorkerStatus{
		VMID: w.id, Name: m.Name, Namespace: m.Namespace, Image: m.Image, State: m.State,
		PID: m.PID, ExitCode: m.ExitCode, StartedAt: m.StartedAt, Restarts: m.Restarts,
		LastError: m.LastError, StateDir: w.dir,
	}
}

// plan validates a start and resolves what it can without a VM.
func (s *Set) plan(ctx context.Context, req *contract.WorkerStartRequest) (*workerPlan, error) {
	hostDir, err := checkHostDir(req.HostDir, s.roots)
	if err != nil {
		return nil, err
	}
	for _, ex := range req.Exclude {
		if !pathUnder(ex, req.HostDir) && !pathUnder(ex, hostDir) {
			s.h.Log().Debug("an exclude path outside host_dir has no effect", "vm_id", req.VMID, "exclude", ex)
		}
	}
	if err := checkInclude(req.Include); err != nil {
		return nil, err
	}
	s.mu.Lock()
	catalogFn := s.catalog
	s.mu.Unlock()
	var catalog []contract.CatalogImage
	if catalogFn != nil {
		catalog = catalogFn(ctx)
	}
	img, err := workerImage(req.Image, catalog)
	if err != nil {
		return nil, err
	}
	engineURL, err := GuestEngineURL(req.EngineURL)
	if err != nil {
		return nil, contract.NewError(contract.S001, "invalid worker::start request: engine_url: %v", err)
	}
	forward, err := EngineForward(req.EngineURL)
	if err != nil {
		return nil, contract.NewError(contract.S001, "invalid worker::start request: engine_url: %v", err)
	}
	if forward != nil && forward.HTTP {
		// The worker's connection to the engine carries its credential,
		// added on the host side: the guest never holds it.
		forward.BearerToken = req.EngineCredential
	}
	pl := &workerPlan{
		req: req, hostDir: hostDir, image: img,
		env:      workerEnv(req, engineURL),
		workdir:  req.Workdir,
		hostname: guestHostname(req.VMID),
		forward:  forward,
		cpus:     config.DefaultWorkerCPUs, memoryMB: config.DefaultWorkerMemoryMB,
		hash: planHash(req, hostDir, img.OCIRef),
	}
	if pl.workdir == "" {
		pl.workdir = contract.DefaultWorkerWorkdir
	}
	if req.CPUs != nil {
		pl.cpus = *req.CPUs
	}
	if req.MemoryMB != nil {
		pl.memoryMB = *req.MemoryMB
	}
	// The VM's agent socket lives in the worker's state directory.
	sock := filepath.Join(s.dir, req.VMID, backend.SocketName)
	if len(sock) >= backend.MaxSocketPath {
		return nil, contract.NewError(contract.S001,
			"invalid worker::start request: vm_id %q is too long for this state_dir: the VM's socket %s would be %d bytes, and unix sockets allow fewer than %d; use a shorter vm_id (or state_dir)",
			req.VMID, sock, len(sock), backend.MaxSocketPath)
	}
	return pl, nil
}

// Start serves worker::start.
func (s *Set) Start(ctx context.Context, req *contract.WorkerStartRequest) (*contract.WorkerStartResponse, error) {
	pl, err := s.plan(ctx, req)
	if err != nil {
		return nil, err
	}
	w, err := s.get(req.VMID, true)
	if err != nil {
		return nil, err
	}
	if err := w.lock(ctx); err != nil {
		return nil, err
	}
	run, err := w.startLocked(ctx, pl)
	w.unlock()
	if err != nil {
		return nil, err
	}
	if req.Wait {
		select {
		case <-run.ready:
			if run.err != nil {
				return nil, run.err
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	st := w.status()
	return &contract.WorkerStartResponse{VMID: st.VMID, State: st.State, PID: st.PID}, nil
}

func (w *workerVM) startLocked(ctx context.Context, pl *workerPlan) (*workerRun, error) {
	w.mu.Lock()
	cur := w.run
	state := w.meta.State
	w.mu.Unlock()
	if cur != nil {
		select {
		case <-cur.done:
			cur = nil
		default:
		}
	}
	if cur != nil {
		if cur.hash == pl.hash && !cur.stopping.Load() && (state == contract.WorkerRunning || state == contract.WorkerStarting) {
			return cur, nil // asked again for what already runs
		}
		if err := w.stopRun(ctx, cur, time.Duration(contract.DefaultWorkerStopTimeoutMS)*time.Millisecond); err != nil {
			return nil, err
		}
	}
	s := w.set
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, contract.NewError(contract.S300, "the sandbox adapter is shutting down")
	}
	s.runs.Add(1)
	s.mu.Unlock()

	rctx, cancel := context.WithCancel(s.bg)
	run := &workerRun{ctx: rctx, cancel: cancel, hash: pl.hash, ready: make(chan struct{}), done: make(chan struct{})}
	w.update(func(m *workerMeta) {
		m.Version, m.VMID = metaVersion, w.id
		m.Name, m.Namespace, m.Image = pl.req.Name, pl.req.Namespace, pl.req.Image
		m.State, m.PID, m.ExitCode, m.LastError = contract.WorkerStarting, nil, nil, ""
		m.PlanHash = pl.hash
		m.Starts++
		if m.Starts > 1 {
			m.Restarts++
		}
	})
	w.mu.Lock()
	w.run = run
	w.mu.Unlock()
	w.note("starting: image %s (%s), host_dir %s", pl.image.Name, pl.image.OCIRef, pl.hostDir)
	go func() {
		defer s.runs.Done()
		defer close(run.done)
		defer cancel()
		w.lifecycle(run, pl)
	}()
	return run, nil
}

// lifecycle boots the VM, watches the command until it ends, and powers
// the VM off.
func (w *workerVM) lifecycle(run *workerRun, pl *workerPlan) {
	h := w.set.h
	log := h.Log().With("vm_id", w.id)
	steps, err := w.steps(run, pl)
	if err != nil {
		w.failed(run, contract.NewError(contract.S300, "worker boot pipeline: %v", err))
		return
	}
	w.set.mu.Lock()
	autoInstall := w.set.autoInstall
	w.set.mu.Unlock()
	b := w.newBoot(h, pl, autoInstall)
	err = steps.Run(run.ctx, b)
	// Where a start's time went, in the log a user reads: a first start
	// (image unpacked, disk made, install run) is much slower than the
	// next, and this line says which step made it so.
	w.note("boot steps: %s", formatTimings(b.Timings))
	if err != nil {
		if run.stopping.Load() {
			w.ended(run, contract.WorkerStopped, nil, "")
			return
		}
		w.failed(run, contract.AsError(err, contract.S300))
		return
	}
	_, proc := run.parts()
	run.mu.Lock()
	flush := run.flush
	run.boot = b
	run.mu.Unlock()
	args := []any{"pid", proc.PID}
	for _, st := range b.Timings {
		args = append(args, st.Step+"_ms", st.Duration.Milliseconds())
	}
	log.Info("worker VM running", args...)
	w.follow(run, b, proc, flush)
}

// follow watches a running worker's command until it ends, records how,
// and powers the VM off — unless the adapter is going and leaves the VM
// to the next adapter process.
func (w *workerVM) follow(run *workerRun, b *boot.Boot, proc *agentclient.Proc, flush func()) {
	var vmGone bool
	select {
	case <-proc.Done():
	case <-b.Runner.Done():
		vmGone = true
	case <-b.Agent.Done():
		vmGone = true
	case <-run.ctx.Done():
		proc.Cancel()
	}
	if run.detaching.Load() {
		// The VM and its command go on; the record still says running,
		// for the next adapter process to adopt.
		b.Dir.Release()
		return
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	es, werr := proc.Wait(wctx)
	wcancel()
	if werr != nil {
		proc.Cancel()
	}
	flush()
	var code *int
	if es != nil {
		c := es.ExitCode
		code = &c
	}
	switch {
	case run.stopping.Load():
		w.note("stopped")
		w.ended(run, contract.WorkerStopped, code, "")
	case vmGone || werr != nil:
		why := "the worker VM stopped unexpectedly"
		if e := b.Runner.ExitErr(); e != nil {
			why += ": " + e.Error()
		}
		w.note("%s", why)
		w.ended(run, contract.WorkerFailed, code, why+boot.VMTails(b.Dir.Path, 20))
	case es.ExitCode == 0 && es.Signal == 0:
		w.note("the command exited with status 0")
		w.ended(run, contract.WorkerExited, code, "")
	default:
		msg := fmt.Sprintf("the command exited with status %d", es.ExitCode)
		if es.Signal != 0 {
			msg = fmt.Sprintf("the command was killed by signal %d", es.Signal)
		}
		w.note("%s", msg)
		w.ended(run, contract.WorkerFailed, code, msg+"; see worker::logs")
	}
	w.powerOff(b)
}

// failed records a run that never got its command running.
func (w *workerVM) failed(run *workerRun, e *contract.Error) {
	w.note("start failed: %s", e.Message)
	w.set.h.Log().Warn("worker VM did not start", "vm_id", w.id, "error", e.Error())
	w.update(func(m *workerMeta) { m.State, m.PID, m.LastError = contract.WorkerFailed, nil, e.Message })
	run.markReady(e)
}

func (w *workerVM) ended(run *workerRun, state string, code *int, lastErr string) {
	w.update(func(m *workerMeta) { m.State, m.PID, m.ExitCode, m.LastError = state, nil, code, lastErr })
	run.markReady(nil)
}

// powerOff ends the VM of a run whose command has ended: the guest flushes
// the persistent disk and powers off, then the runner goes.
func (w *workerVM) powerOff(b *boot.Boot) {
	ctx, cancel := context.WithTimeout(context.Background(), boot.StopBudget)
	defer cancel()
	select {
	case <-b.Runner.Done():
	default:
		sctx, scancel := context.WithTimeout(ctx, boot.ShutdownTimeout)
		err := b.Agent.Shutdown(sctx)
		scancel()
		if err == nil && b.Selection.Backend == backend.QEMU {
			t := time.NewTimer(boot.PowerOffWait)
			select {
			case <-b.Runner.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
	_ = b.Agent.Close()
	if err := b.Runner.Stop(ctx, boot.ReleaseGrace); err != nil {
		w.set.h.Log().Warn("stop the worker VM's runner", "vm_id", w.id, "pid", b.Runner.PID, "error", err)
	}
	b.Dir.Release()
}

// newBoot is the boot of one run of the worker VM.
func (w *workerVM) newBoot(h boot.Host, pl *workerPlan, autoInstall bool) *boot.Boot {
	b := &boot.Boot{
		Host: h,
		Spec: sandboxkit.BootSpec{
			ID: w.id, Image: pl.image, AutoInstall: autoInstall,
			CPUs: pl.cpus, MemoryMB: pl.memoryMB, Network: true, Env: pl.env, Name: pl.req.Name,
		},
		Hostname: pl.hostname,
		// A worker VM never resumes from (or records) a sandbox's
		// snapshot template: its persistent data disk is its own, and
		// find-template runs before prepare-state-dir attaches it.
		NoTemplate: true,
	}
	if pl.forward != nil {
		b.NetForwards = []backend.NetForward{*pl.forward}
	}
	return b
}

// steps is the sandbox pipeline with the worker's state directory and the
// worker's own steps.
func (w *workerVM) steps(run *workerRun, pl *workerPlan) (boot.BootSteps, error) {
	s, err := w.set.h.Steps().Replace(boot.StepPrepareStateDir, func(ctx context.Context, b *boot.Boot) error { return w.stepPrepareDir(ctx, b, pl) })
	if err != nil {
		return nil, err
	}
	return append(s,
		boot.BootStep{Name: StepCopyWorkspace, Run: func(ctx context.Context, b *boot.Boot) error { return w.stepCopyWorkspace(ctx, b, run, pl) }},
		boot.BootStep{Name: StepPublishConfig, Run: func(ctx context.Context, b *boot.Boot) error { return w.stepPublishConfig(ctx, b, pl) }},
		boot.BootStep{Name: StepInstall, Run: func(ctx context.Context, b *boot.Boot) error { return w.stepInstall(ctx, b, run, pl) }},
		boot.BootStep{Name: StepStartWorker, Run: func(ctx context.Context, b *boot.Boot) error { return w.stepStartWorker(ctx, b, run, pl) }},
	), nil
}

// stepPrepareDir takes the worker's state directory and its disk: the
// kept one, else a copy of the install cache's disk for this install,
// else a fresh one.
func (w *workerVM) stepPrepareDir(ctx context.Context, b *boot.Boot, pl *workerPlan) error {
	d, err := runner.OpenWorkerDir(w.set.dir, w.id)
	if errors.Is(err, runner.ErrDirLocked) {
		return contract.NewError(contract.S300, "worker %s is running under another sandbox-libkrun adapter that shares state_dir %s", w.id, w.set.h.Config().StateDir)
	}
	if err != nil {
		return err
	}
	b.Dir = d
	b.OnFailure(d.Release)
	if fi, err := os.Stat(d.File(runner.LogName)); err == nil && fi.Size() > maxRunnerLog {
		_ = os.Truncate(d.File(runner.LogName), 0)
	}
	disk := d.File(diskName)
	w.mu.Lock()
	prev := w.meta.ImageDigest
	w.mu.Unlock()
	if prev != "" && prev != b.Image.Digest && boot.FileExists(disk) {
		// Dependencies installed over another image (native modules
		// built against its libraries) do not belong on this one.
		w.note("the image changed (%s, was %s): starting from a fresh disk, install runs again", b.Image.Digest, prev)
		if err := os.Remove(disk); err != nil {
			return fmt.Errorf("replace the worker's disk: %w", err)
		}
	}
	if !boot.FileExists(disk) && !w.restoreCachedDisk(b, pl, disk) {
		t0 := time.Now()
		if err := makeDisk(ctx, disk, w.set.diskMB); err != nil {
			return err
		}
		w.note("made a fresh %d MiB persistent disk in %s", w.set.diskMB, roundDur(time.Since(t0)))
	}
	w.update(func(m *workerMeta) { m.ImageDigest = b.Image.Digest })
	b.DataDisk = disk
	return nil
}

// mkfsCandidates are where mkfs.ext4 is looked for besides PATH: sbin
// directories (often not on a user's PATH) and Homebrew's e2fsprogs,
// which is keg-only on macOS.
func mkfsCandidates() []string {
	return []string{"/sbin/mkfs.ext4", "/usr/sbin/mkfs.ext4", "/opt/homebrew/opt/e2fsprogs/sbin/mkfs.ext4", "/usr/local/opt/e2fsprogs/sbin/mkfs.ext4"}
}

func findMkfs() (string, error) {
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	for _, p := range mkfsCandidates() {
		if boot.FileExists(p) {
			return p, nil
		}
	}
	return "", contract.NewError(contract.S300, "mkfs.ext4 was not found (looked in PATH and %s); worker VMs need it for their persistent disk: install e2fsprogs (apt-get install e2fsprogs; brew install e2fsprogs)",
		strings.Join(mkfsCandidates(), ", "))
}

// makeDisk makes a sparse file of sizeMB and an empty ext4 filesystem on
// it. Lazy inode-table and journal init keep it sparse: the blocks mkfs
// skips read as zeros anyway.
func makeDisk(ctx context.Context, p string, sizeMB uint64) error {
	mkfs, err := findMkfs()
	if err != nil {
		return err
	}
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("make the worker's disk: %w", err)
	}
	err = f.Truncate(int64(sizeMB) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("make the worker's disk: %w", err)
	}
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-t", "ext4", "-m", "0", "-L", "iii-upper",
		"-E", "lazy_itable_init=1,lazy_journal_init=1", tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(tmp)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return contract.NewError(contract.S300, "format the worker's disk with %s: %v: %s", mkfs, err, strings.TrimSpace(string(out)))
	}
	return os.Rename(tmp, p)
}

// stepCopyWorkspace streams the host directory into /workspace.
func (w *workerVM) stepCopyWorkspace(ctx context.Context, b *boot.Boot, run *workerRun, pl *workerPlan) error {
	t0 := time.Now()
	pr, pw := io.Pipe()
	type result struct {
		st  tarStats
		err error
	}
	done := make(chan result, 1)
	rule := copyRule{include: pl.req.Include, exclude: pl.req.Exclude}
	go func() {
		st, err := writeWorkspaceTar(ctx, pw, pl.hostDir, rule)
		_ = pw.CloseWithError(err)
		done <- result{st, err}
	}()
	res, err := b.Agent.Workspace(ctx, agentproto.WorkspaceRequest{
		Dir: contract.DefaultWorkerWorkdir, Prune: true, Keep: []string{StateDirName}, KeepTop: rule.keepTop(),
	}, pr)
	// Unblocks the writer if the guest ended the stream early.
	_ = pr.CloseWithError(errors.New("the guest stopped reading the workspace"))
	tr := <-done
	if tr.err != nil && ctx.Err() == nil {
		return contract.NewError(contract.S300, "copy host_dir %s into the worker VM: %v", pl.hostDir, tr.err)
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return contract.NewError(contract.S300, "copy host_dir %s into the worker VM: %v", pl.hostDir, err)
	}
	w.note("workspace: copied %d files (%d bytes), %d directories, %d links from %s in %s; removed %d stale entries",
		res.Files, res.Bytes, res.Dirs, res.Symlinks, pl.hostDir, roundDur(time.Since(t0)), res.Removed)
	if rep := copyReport(tr.st, pl.req.Install); rep != "" {
		w.note("%s", rep)
	}
	run.mu.Lock()
	run.manifests = tr.st.Manifests
	run.mu.Unlock()
	return nil
}

// checkInclude refuses an include name the copy does not leave out: it
// would include nothing, which is surely not what the caller meant.
func checkInclude(include []string) error {
	var names []string
	for _, s := range copySkips {
		names = append(names, s.name)
	}
	for i, n := range include {
		if !slices.Contains(names, n) {
			return contract.NewError(contract.S001,
				"invalid worker::start request: include[%d] %q is not a name the copy leaves out, so there is nothing to include; it leaves out %s at the top of host_dir (and .iii everywhere, which nothing includes); leave %q out of include",
				i, truncate(n, 120), strings.Join(names, ", "), truncate(n, 120))
		}
	}
	return nil
}

// stepPublishConfig writes the config file where III_CONFIG points.
func (w *workerVM) stepPublishConfig(ctx context.Context, b *boot.Boot, pl *workerPlan) error {
	c := pl.req.Config
	if c == nil {
		return nil
	}
	p := contract.WorkerConfigDir + "/" + c.FileName
	if _, err := b.Agent.WriteFile(ctx, &agentproto.FSRequest{Path: p, Mode: "0600", Parents: true}, strings.NewReader(c.Content)); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return contract.NewError(contract.S300, "publish the worker's config at %s: %v", p, err)
	}
	return nil
}

// stepInstall runs the install command unless the disk records that it
// already succeeded with the same inputs (install.go).
func (w *workerVM) stepInstall(ctx context.Context, b *boot.Boot, run *workerRun, pl *workerPlan) error {
	if pl.req.Install == "" {
		return nil
	}
	run.mu.Lock()
	manifests := run.manifests
	run.mu.Unlock()
	want := newInstallInputs(pl.req.Install, b.Env, b.Image.Digest, manifests)
	var have strings.Builder
	_, _, rerr := b.Agent.ReadFileTo(ctx, installMarker, &have)
	why := installReason(want, have.String(), rerr == nil)
	if why == "" {
		w.note("install: already done on this disk")
		return nil
	}
	w.note("install: %s: %s", why, pl.req.Install)
	t0 := time.Now()
	proc, flush, err := w.spawn(ctx, b, procInstall, pl.req.Install, pl)
	if err != nil {
		return err
	}
	es, err := proc.Wait(ctx)
	if err != nil {
		proc.Cancel()
	}
	flush()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return contract.NewError(contract.S300, "the worker's install command did not finish: %v", err)
	}
	if es.ExitCode != 0 || es.Signal != 0 {
		w.note("install: exited with status %d", es.ExitCode)
		return contract.NewError(contract.S300, "the worker's install command `%s` exited with status %d; its output is in worker::logs", truncate(pl.req.Install, 200), es.ExitCode)
	}
	if _, err := b.Agent.WriteFile(ctx, &agentproto.FSRequest{Path: installMarker, Mode: "0600", Parents: true}, strings.NewReader(want.encode())); err != nil {
		return contract.NewError(contract.S300, "record the finished install on the worker's disk: %v", err)
	}
	w.note("install: done in %s", roundDur(time.Since(t0)))
	w.captureDisk(ctx, b, pl, want.encode())
	return nil
}

// stepStartWorker starts the command.
func (w *workerVM) stepStartWorker(ctx context.Context, b *boot.Boot, run *workerRun, pl *workerPlan) error {
	proc, flush, err := w.spawn(ctx, b, procWorker, pl.req.Command, pl)
	if err != nil {
		return err
	}
	run.mu.Lock()
	run.agent, run.proc, run.flush = b.Agent, proc, flush
	run.mu.Unlock()
	pid := proc.PID
	w.update(func(m *workerMeta) {
		m.State, m.PID, m.StartedAt = contract.WorkerRunning, &pid, w.set.h.Now().UTC().Format(time.RFC3339)
	})
	w.note("started: %s (pid %d)", pl.req.Command, pid)
	run.markReady(nil)
	return nil
}

// spawn runs command with /bin/sh -c in the guest, its output into the
// worker's log line by line. flush, called once the process has ended,
// writes a last line that had no newline.
func (w *workerVM) spawn(ctx context.Context, b *boot.Boot, name, command string, pl *workerPlan) (*agentclient.Proc, func(), error) {
	sink, flushSink := w.outputSink()
	proc, err := b.Agent.Spawn(ctx, agentproto.SpawnRequest{
		Name: name, Argv: []string{"/bin/sh", "-c", command}, Env: b.Env, Workdir: pl.workdir,
		// The worker's command outlives this adapter process, for the
		// next one to adopt (the install step does not: a new adapter
		// starts the worker afresh).
		Keep: name == procWorker && b.Agent.Has(agentproto.CapProcAttach),
	}, sink)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, contract.NewError(contract.S300, "start the worker's %s command in the VM: %v", name, err)
	}
	return proc, func() { <-proc.Done(); flushSink() }, nil
}

// outputSink writes a process's output into the worker's log line by line;
// flush, called once the output has ended, writes a last line that had no
// newline.
func (w *workerVM) outputSink() (agentclient.Sink, func()) {
	out := &lineSplitter{emit: func(l string) { _ = w.log.add(contract.LogStdout, l) }}
	errs := &lineSplitter{emit: func(l string) { _ = w.log.add(contract.LogStderr, l) }}
	sink := func(kind agentproto.Kind, p []byte) {
		if kind == agentproto.KindStderr {
			errs.write(p)
		} else {
			out.write(p)
		}
	}
	var once sync.Once
	return sink, func() { once.Do(func() { out.flush(); errs.flush() }) }
}

// stopRun ends run: its command gets SIGTERM and grace before SIGKILL, the
// VM powers off. A run still booting is cut short.
func (w *workerVM) stopRun(ctx context.Context, run *workerRun, grace time.Duration) error {
	run.stopping.Store(true)
	agent, proc := run.parts()
	if proc == nil {
		run.cancel()
	} else {
		sctx, cancel := context.WithTimeout(ctx, grace+15*time.Second)
		_, err := agent.StopProc(sctx, procWorker, grace.Milliseconds())
		cancel()
		if err != nil {
			w.set.h.Log().Debug("graceful stop failed; killing the worker VM", "vm_id", w.id, "error", err)
			run.cancel()
		}
	}
	select {
	case <-run.done:
		return nil
	case <-ctx.Done():
		run.cancel()
		return ctx.Err()
	}
}

// stopCurrent stops the worker's run, if it has one; the caller holds
// the worker's lock.
func (w *workerVM) stopCurrent(ctx context.Context, timeout time.Duration) error {
	w.mu.Lock()
	run := w.run
	w.mu.Unlock()
	if run == nil {
		return nil
	}
	return w.stopRun(ctx, run, timeout)
}

// Stop serves worker::stop.
func (s *Set) Stop(ctx context.Context, req *contract.WorkerStopRequest) (*contract.WorkerStatus, error) {
	w, err := s.get(req.VMID, false)
	if err != nil {
		return nil, err
	}
	if err := w.lock(ctx); err != nil {
		return nil, err
	}
	defer w.unlock()
	if err := w.stopCurrent(ctx, time.Duration(req.TimeoutMS)*time.Millisecond); err != nil {
		return nil, err
	}
	return w.status(), nil
}

// Remove serves worker::remove.
func (s *Set) Remove(ctx context.Context, req *contract.WorkerRemoveRequest) (*contract.WorkerRemoveResponse, error) {
	dir := filepath.Join(s.dir, req.VMID)
	w, err := s.get(req.VMID, false)
	if contract.IsCode(err, contract.S002) {
		return &contract.WorkerRemoveResponse{VMID: req.VMID, StateDir: dir}, nil
	}
	if err != nil {
		return nil, err
	}
	if err := w.lock(ctx); err != nil {
		return nil, err
	}
	defer w.unlock()
	if err := w.stopCurrent(ctx, time.Duration(contract.DefaultWorkerStopTimeoutMS)*time.Millisecond); err != nil {
		return nil, err
	}
	w.log.close()
	s.forget(w)
	w.mu.Lock()
	ns, name := w.meta.Namespace, w.meta.Name
	w.mu.Unlock()
	// The worker is gone from its project: so is its install's disk.
	if err := s.cache.remove(ns, name); err != nil {
		s.h.Log().Warn("cannot delete the worker's cached disk", "vm_id", req.VMID, "error", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, contract.NewError(contract.S216, "worker %s is stopped but its state directory could not be deleted: %v; its state (disk, logs, record) stays in %s: delete it by hand",
			req.VMID, err, dir)
	}
	return &contract.WorkerRemoveResponse{VMID: req.VMID, Removed: true, StateDir: dir}, nil
}

// List serves worker::list: every worker with a state directory, and any
// the adapter holds in memory, by vm_id.
func (s *Set) List() (*contract.WorkerListResponse, error) {
	ids := map[string]bool{}
	des, err := os.ReadDir(s.dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, contract.NewError(contract.S300, "read %s: %v", s.dir, err)
	}
	for _, de := range des {
		if de.IsDir() && contract.ValidVMID(de.Name()) {
			ids[de.Name()] = true
		}
	}
	s.mu.Lock()
	for id := range s.vms {
		ids[id] = true
	}
	s.mu.Unlock()
	sorted := make([]string, 0, len(ids))
	for id := range ids {
		sorted = append(sorted, id)
	}
	sort.Strings(sorted)
	out := &contract.WorkerListResponse{}
	for _, id := range sorted {
		w, err := s.get(id, false)
		if err != nil {
			continue // removed meanwhile
		}
		out.Workers = append(out.Workers, *w.status())
	}
	return out, nil
}

// Logs serves worker::logs.
func (s *Set) Logs(req *contract.WorkerLogsRequest) (*contract.WorkerLogsResponse, error) {
	w, err := s.get(req.VMID, false)
	if err != nil {
		return nil, err
	}
	entries, cursor, truncated, more, err := w.log.read(req.Tail, req.Cursor)
	if err != nil {
		return nil, contract.NewError(contract.S300, "%v", err)
	}
	return &contract.WorkerLogsResponse{VMID: req.VMID, Entries: entries, Cursor: cursor, Truncated: truncated, More: more}, nil
}

// Shutdown stops every worker VM, quickly: the engine gives the adapter a
// few seconds. Their state directories stay; Compose starts them again
// after an adapter restart.
func (s *Set) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	var all []*workerVM
	for _, w := range s.vms {
		all = append(all, w)
	}
	s.mu.Unlock()
	keep := s.keep()
	var wg sync.WaitGroup
	for _, w := range all {
		w.mu.Lock()
		run := w.run
		w.mu.Unlock()
		if run == nil {
			continue
		}
		if keep && w.detach(run) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = w.stopRun(ctx, run, shutdownProcGrace)
		}()
	}
	wg.Wait()
	// What did not stop in time is cut off now; the runners kill their
	// VMs when their lifelines close.
	s.bgCancel()
	done := make(chan struct{})
	go func() { s.runs.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("worker VMs still stopping: %w", ctx.Err())
	}
	s.mu.Lock()
	for _, w := range s.vms {
		w.log.close()
	}
	s.mu.Unlock()
	return nil
}

// Status serves worker::status.
func (s *Set) Status(id string) (*contract.WorkerStatus, error) {
	w, err := s.get(id, false)
	if err != nil {
		return nil, err
	}
	return w.status(), nil
}

// Roots are the host roots worker VMs may copy from, resolved, for
// adapter::info.
func (s *Set) Roots() []string { return append([]string{}, s.roots...) }
