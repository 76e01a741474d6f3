package boot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentclient"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/consolelog"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/runner"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

// Names of the boot steps, in their default order.
const (
	StepSelectBackend   = "select-backend"
	StepResolveImage    = "resolve-image"
	StepBuildInitramfs  = "build-initramfs"
	StepFindTemplate    = "find-template"
	StepPrepareStateDir = "prepare-state-dir"
	StepSpawnRunner     = "spawn-runner"
	StepConnectAgent    = "connect-agent"
	StepConfigureGuest  = "configure-guest"
)

// Boot is one sandbox being booted: what the steps of the pipeline read
// and fill in, in order.
type Boot struct {
	// Host is the adapter the boot runs for.
	Host Host
	Spec sandboxkit.BootSpec
	// Selection is the back end (select-backend).
	Selection *Selection
	// Image is the installed image (resolve-image).
	Image *images.Image
	// Initrd is the initramfs (build-initramfs).
	Initrd string
	// Dir is the VM's state directory (prepare-state-dir).
	Dir *runner.Dir
	// VM is the VM's specification and Runner its runner (spawn-runner).
	VM     backend.Spec
	Runner *runner.Process
	// Agent is the connection to the guest agent (connect-agent).
	Agent *agentclient.Client
	// Env and Workdir are the exec defaults: the image's environment
	// with the create request's merged over it, and the image's working
	// directory (configure-guest).
	Env     []string
	Workdir string
	// Timings records how long each step took, in order.
	Timings []StepTiming
	// Hostname is the guest's host name; empty means sandbox-<id prefix>.
	Hostname string
	// DataDisk is a writable disk the guest uses as a persistent upper
	// layer (worker VMs); empty means a tmpfs upper, thrown away.
	DataDisk string
	// NetForwards are the gateway ports that lead to the host: a worker
	// VM's way to the engine. Sandboxes have none.
	NetForwards []backend.NetForward
	// Pooled is the warm pool id the VM was booted under (its state
	// directory's name and host name) when a create claimed it from the
	// warm pool; empty for a VM booted for its sandbox.
	Pooled string
	// NoTemplate boots cold, never resuming from (or recording) a
	// snapshot template: a worker VM's, whose data disk is its own.
	NoTemplate bool

	// Snapshot templates (templates.go): recordTemplate makes this boot
	// the recording of one; otherwise find-template sets tplKey when the
	// boot may use one, and restore to the template it resumes from, or
	// tplMiss when there is none yet.
	recordTemplate *backend.Template
	restore        *backend.Template
	tplKey         templateKey
	tplMiss        bool
	// helloLost: connect-agent gave up on a VM that was still running.
	helloLost bool

	undo []func()
}

// adoptGraceMS is how long the VM's runner outlives the adapter: a
// sandbox's (or a warm pool VM's, which may become one) and a worker VM's
// for adopt_grace_ms; a template recording's not at all.
func (b *Boot) adoptGraceMS() uint64 {
	if b.recordTemplate != nil {
		return 0
	}
	return uint64(b.Host.Current().AdoptGrace.Milliseconds())
}

// StepTiming is how long one boot step took.
type StepTiming struct {
	Step     string
	Duration time.Duration
}

// OnFailure registers fn to undo a step's work if a later step fails; undo
// runs in reverse order.
func (b *Boot) OnFailure(fn func()) { b.undo = append(b.undo, fn) }

func (b *Boot) rollback() {
	for i := len(b.undo) - 1; i >= 0; i-- {
		b.undo[i]()
	}
	b.undo = nil
}

// BootStep is one named step of the boot pipeline.
type BootStep struct {
	Name string
	Run  func(ctx context.Context, b *Boot) error
}

// BootSteps is the boot pipeline: named steps run in order, which tests
// (and future back ends) can list, replace, remove or insert into.
type BootSteps []BootStep

// DefaultBootSteps is how a sandbox boots.
func DefaultBootSteps() BootSteps {
	return BootSteps{
		{StepSelectBackend, stepSelectBackend},
		{StepResolveImage, stepResolveImage},
		{StepBuildInitramfs, stepBuildInitramfs},
		{StepFindTemplate, stepFindTemplate},
		{StepPrepareStateDir, stepPrepareStateDir},
		{StepSpawnRunner, stepSpawnRunner},
		{StepConnectAgent, stepConnectAgent},
		{StepConfigureGuest, stepConfigureGuest},
	}
}

// Names lists the steps in order.
func (s BootSteps) Names() []string {
	out := make([]string, len(s))
	for i, st := range s {
		out[i] = st.Name
	}
	return out
}

func (s BootSteps) index(name string) (int, error) {
	for i, st := range s {
		if st.Name == name {
			return i, nil
		}
	}
	return -1, fmt.Errorf("no boot step %q (steps: %s)", name, strings.Join(s.Names(), ", "))
}

// Replace returns the pipeline with step name's function replaced.
func (s BootSteps) Replace(name string, run func(context.Context, *Boot) error) (BootSteps, error) {
	i, err := s.index(name)
	if err != nil {
		return nil, err
	}
	out := slices.Clone(s)
	out[i].Run = run
	return out, nil
}

// Remove returns the pipeline without step name.
func (s BootSteps) Remove(name string) (BootSteps, error) {
	i, err := s.index(name)
	if err != nil {
		return nil, err
	}
	return slices.Delete(slices.Clone(s), i, i+1), nil
}

// InsertBefore returns the pipeline with step inserted before step name.
func (s BootSteps) InsertBefore(name string, step BootStep) (BootSteps, error) {
	i, err := s.index(name)
	if err != nil {
		return nil, err
	}
	return slices.Insert(slices.Clone(s), i, step), nil
}

// InsertAfter returns the pipeline with step inserted after step name.
func (s BootSteps) InsertAfter(name string, step BootStep) (BootSteps, error) {
	i, err := s.index(name)
	if err != nil {
		return nil, err
	}
	return slices.Insert(slices.Clone(s), i+1, step), nil
}

// Run runs the steps in order. When one fails, what the earlier steps did
// is undone (the runner killed, the state directory removed) and its
// error returned: an S-code error keeps its code, a canceled context stays
// the context's error, anything else becomes S300 naming the step.
func (s BootSteps) Run(ctx context.Context, b *Boot) error {
	for _, st := range s {
		err := ctx.Err()
		if err == nil {
			t0 := time.Now()
			err = st.Run(ctx, b)
			b.Timings = append(b.Timings, StepTiming{st.Name, time.Since(t0)})
		}
		if err == nil {
			continue
		}
		b.rollback()
		var ce *contract.Error
		switch {
		case errors.As(err, &ce):
			return ce
		case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
			return err
		}
		return contract.NewError(contract.S300, "sandbox boot step %s failed: %v", st.Name, err)
	}
	return nil
}

// Cold boots spec through h's pipeline. When restoring from a snapshot
// template fails, it boots again without one; when the VM's agent never
// answered, it boots another VM once. A template a cold boot found
// missing starts being recorded.
func Cold(ctx context.Context, h Host, spec sandboxkit.BootSpec) (*Boot, error) {
	t0 := time.Now()
	b := &Boot{Host: h, Spec: spec}
	err := h.Steps().Run(ctx, b)
	if err != nil && b.restore != nil && ctx.Err() == nil {
		h.Templates().restoreFailed(b.tplKey, err)
		b = &Boot{Host: h, Spec: spec, NoTemplate: true}
		err = h.Steps().Run(ctx, b)
	}
	if err != nil && b.helloLost && ctx.Err() == nil {
		// Rarely, under TCG on a loaded host, a VM whose agent is up
		// never gets the host's hello across several connections
		// (cause not found yet: docs/sandbox-libkrun.md). A new VM
		// does; the caller waits one boot_timeout_ms more.
		h.Log().Warn("the sandbox VM's agent never answered; booting another VM", "sandbox_id", spec.ID, "error", err.Error())
		b = &Boot{Host: h, Spec: spec, NoTemplate: true}
		err = h.Steps().Run(ctx, b)
	}
	if err != nil {
		return nil, err
	}
	afterBoot(b, time.Since(t0))
	return b, nil
}

// afterBoot counts a restore, or starts recording the template a cold boot
// found missing.
func afterBoot(b *Boot, took time.Duration) {
	switch {
	case b.restore != nil:
		b.Host.Templates().restoredOne()
	case b.tplMiss:
		b.Host.Templates().recordLater(b.tplKey, b.Spec, took)
	}
}

// Restored reports whether the VM resumed from a snapshot template.
func (b *Boot) Restored() bool { return b.restore != nil }

// Rollback undoes what the steps did (the runner killed, the state
// directory removed), for a booted VM nobody will use.
func (b *Boot) Rollback() { b.rollback() }

func stepSelectBackend(ctx context.Context, b *Boot) error {
	sel, err := b.Host.Selected(ctx)
	if err != nil {
		return err
	}
	b.Selection = sel
	return nil
}

// minMemoryMB is the least memory a guest kernel and the agent boot in.
const minMemoryMB = 64

func stepResolveImage(ctx context.Context, b *Boot) error {
	if b.Spec.MemoryMB < minMemoryMB {
		return contract.NewError(contract.S400, "memory_mb %d is below %d, the least a sandbox VM boots in", b.Spec.MemoryMB, minMemoryMB)
	}
	img, err := b.Host.Images().Ensure(ctx, b.Spec.Image.OCIRef, images.EnsureOptions{
		AutoInstall: b.Spec.AutoInstall,
		Progress:    func(p images.Progress) { sandboxkit.ReportProgress(ctx, imageProgress(p)) },
	})
	if err != nil {
		var ie *images.InstallError
		switch {
		case errors.Is(err, images.ErrNotInstalled):
			return contract.NewError(contract.S101, "image %s (%s): %v", b.Spec.Image.Name, b.Spec.Image.OCIRef, err)
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &ie):
			return contract.NewError(contract.S102, "image %s: %v", b.Spec.Image.Name, err)
		}
		return contract.NewError(contract.S102, "image %s (%s) could not be installed: %v; retry later", b.Spec.Image.Name, b.Spec.Image.OCIRef, err)
	}
	b.Image = img
	return nil
}

// imageProgress turns an image install's report into the contract's
// progress event (the kit fills in the image's names). Resolving the tag
// is the start of the pull, before its size is known.
func imageProgress(p images.Progress) contract.ProgressEvent {
	var ev contract.ProgressEvent
	switch p.Phase {
	case images.PhaseResolving, images.PhasePulling:
		ev.Phase = contract.ProgressPulling
	case images.PhaseUnpacking:
		ev.Phase = contract.ProgressUnpacking
	case images.PhaseBuilding:
		ev.Phase = contract.ProgressBuilding
	default:
		ev.Phase = string(p.Phase)
	}
	if p.Phase == images.PhaseResolving || p.Done < 0 {
		return ev
	}
	return ev.WithBytes(uint64(p.Done), uint64(max(p.Total, 0)))
}

func stepBuildInitramfs(ctx context.Context, b *Boot) error {
	sel := b.Selection
	if FileExists(sel.Initrd) {
		b.Initrd = sel.Initrd
		return nil
	}
	// The cache was cleaned under a running adapter: build it again.
	p, err := buildInitramfs(ctx, &sel.Kernel, sel.Agent, b.Host.Config().CacheDir)
	if err != nil {
		return err
	}
	b.Initrd = p
	return nil
}

// stepFindTemplate picks the snapshot template this boot resumes from,
// when there is one (templates.go).
func stepFindTemplate(_ context.Context, b *Boot) error {
	s := b.Host.Templates()
	if b.recordTemplate != nil || b.NoTemplate {
		return nil
	}
	k, ok := s.keyFor(b)
	if !ok {
		return nil
	}
	b.tplKey = k
	if t := s.lookup(k); t != nil {
		b.restore = t
	} else {
		b.tplMiss = true
	}
	return nil
}

func stepPrepareStateDir(_ context.Context, b *Boot) error {
	name, err := config.SandboxDirName(b.Spec.ID)
	if err != nil {
		return err
	}
	parent := b.Host.Config().StateDir
	if b.recordTemplate != nil {
		// Recording VMs are not sandboxes: they live apart, and a
		// crashed adapter's are swept from there (templates.go).
		parent = b.Host.Templates().vmsDir()
		if err := os.MkdirAll(parent, 0o700); err != nil {
			return err
		}
	}
	d, err := runner.CreateDir(parent, name)
	if err != nil {
		return err
	}
	b.Dir = d
	b.OnFailure(func() {
		if err := d.Remove(); err != nil {
			b.Host.Log().Warn("removing the state directory of a failed boot", "error", err)
		}
	})
	return nil
}

func stepSpawnRunner(ctx context.Context, b *Boot) error {
	sandboxkit.ReportProgress(ctx, contract.ProgressEvent{Phase: contract.ProgressBooting})
	sel := b.Selection
	hostname := b.hostname()
	b.VM = backend.Spec{
		ID:           b.Spec.ID,
		CPUs:         int(b.Spec.CPUs),
		MemoryMiB:    int(b.Spec.MemoryMB),
		Kernel:       sel.Kernel.BootImage(),
		KernelConfig: sel.Kernel.Config,
		Initrd:       b.Initrd,
		RootDisk:     b.Image.RootfsPath,
		RootFSType:   "erofs",
		Network:      b.Spec.Network,
		DataDisk:     b.DataDisk,
		Hostname:     hostname,
		StateDir:     b.Dir.Path,
		Accel:        sel.Accel,
		QEMUBinary:   sel.QEMUBinary,
		LibkrunPath:  sel.LibkrunPath,

		ConsoleLogMaxBytes: b.Host.Current().ConsoleLogMaxBytes,
	}
	if b.Spec.Network {
		b.VM.NetAllowCIDRs = b.Host.Config().NetworkAllowCIDRs
		b.VM.NetForwards = b.NetForwards
		b.VM.NetDNSServers = b.Host.Current().NetworkDNSServers
	}
	if b.recordTemplate != nil {
		b.VM.Template = b.recordTemplate
	} else if b.restore != nil {
		b.VM.Template = b.restore
	}
	proc, err := runner.Spawn(ctx, runner.SpawnOptions{
		Executable: b.Host.Executable(),
		Dir:        b.Dir,
		Config:     runner.Config{Version: runner.ConfigVersion, Backend: sel.Backend, Spec: b.VM, AdoptGraceMS: b.adoptGraceMS()},
	})
	if err != nil {
		return err
	}
	b.Runner = proc
	b.OnFailure(func() {
		kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := proc.Kill(kctx); err != nil {
			b.Host.Log().Warn("killing the runner of a failed boot", "pid", proc.PID, "error", err)
		}
	})
	return nil
}

func stepConnectAgent(ctx context.Context, b *Boot) error {
	cctx, cancel := context.WithTimeout(ctx, b.Host.Current().BootTimeout)
	defer cancel()
	c, err := DialAgent(cctx, b.Runner, b.VM.SocketPath(), b.Host.Log().With("sandbox_id", b.Spec.ID))
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		select {
		case <-b.Runner.Done():
		default:
			// The VM runs but its agent never answered.
			b.helloLost = true
		}
		return contract.NewError(contract.S300, "the sandbox VM did not start (%s with %s, boot_timeout_ms %d): %v%s",
			b.Selection.Backend, b.Selection.Accel, b.Host.Current().BootTimeout.Milliseconds(), err, VMTails(b.Dir.Path, 20))
	}
	b.Agent = c
	b.OnFailure(func() { _ = c.Close() })
	return nil
}

func stepConfigureGuest(ctx context.Context, b *Boot) error {
	if b.restore != nil {
		// Every clone of a template resumes with the same RNG state,
		// clock and host name: it must not run anything before this.
		fresh, err := Freshen(ctx, b, b.hostname())
		if err != nil && ctx.Err() == nil {
			// Seen rarely on a loaded host: the restored agent answered
			// the hello, then nothing reached it. A new connection
			// re-announces the host end to the guest; one more try.
			b.Host.Log().Warn("no answer from a restored VM's agent; connecting again", "sandbox_id", b.Spec.ID, "error", err.Error())
			_ = b.Agent.Close()
			cctx, cancel := context.WithTimeout(ctx, firstHelloWindow)
			c, derr := DialAgent(cctx, b.Runner, b.VM.SocketPath(), b.Host.Log().With("sandbox_id", b.Spec.ID))
			cancel()
			if derr == nil {
				b.Agent = c
				b.OnFailure(func() { _ = c.Close() })
				fresh, err = Freshen(ctx, b, b.hostname())
			}
		}
		if err == nil && !fresh {
			err = errors.New("the guest agent cannot reseed its RNG")
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return contract.NewError(contract.S300, "make the restored sandbox VM fresh: %v", err)
		}
	}
	if b.Spec.Network {
		if _, err := b.Agent.ConfigureNetwork(ctx, agentproto.NetRequest{}); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return contract.NewError(contract.S300, "configure the sandbox's network: %v", err)
		}
	}
	// Execs run as root; like container runtimes, give them root's HOME
	// unless the image says otherwise.
	b.Env = MergeEnv([]string{"HOME=/root"}, b.Image.Config.Env, b.Spec.Env)
	b.Workdir = b.Image.Config.WorkingDir
	if b.Workdir == "" {
		b.Workdir = "/"
	}
	return nil
}

// hostname is the guest's host name.
func (b *Boot) hostname() string {
	if b.Hostname != "" {
		return b.Hostname
	}
	return SandboxHostname(b.Spec.ID)
}

// MergeEnv merges "K=V" lists: a later entry replaces an earlier one with
// the same key in its place, new keys are appended in order. Entries
// without "=" are dropped (the contract's decoder never lets one through).
func MergeEnv(lists ...[]string) []string {
	var out []string
	at := map[string]int{}
	for _, l := range lists {
		for _, kv := range l {
			k, _, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				continue
			}
			if i, seen := at[k]; seen {
				out[i] = kv
				continue
			}
			at[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

// VMTails returns the ends of a VM's logs, for error messages: the runner's
// own log, QEMU's stderr and the guest console.
func VMTails(dir string, lines int) string {
	var b strings.Builder
	for _, f := range []struct{ name, label string }{
		{runner.LogName, "runner log"},
		{backend.StderrName, "qemu stderr"},
		{backend.ConsoleName, "guest console"},
	} {
		t := tailFile(filepath.Join(dir, f.name), lines)
		if f.name == backend.ConsoleName {
			// The console log rotates; its tail may start in the
			// rotated file.
			t = consolelog.Tail(filepath.Join(dir, f.name), lines, 16<<10)
		}
		if t != "" {
			fmt.Fprintf(&b, "\n--- %s (last lines) ---\n%s", f.label, t)
		}
	}
	return b.String()
}

// tailFile returns the last n lines of a file, reading at most 16 KiB.
func tailFile(p string, n int) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	const window = 16 << 10
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(fi.Size()-window, 0)
	data, err := io.ReadAll(io.NewSectionReader(f, off, window))
	if err != nil {
		return ""
	}
	s := strings.TrimRight(strings.ToValidUTF8(string(data), "?"), "\n")
	if s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
