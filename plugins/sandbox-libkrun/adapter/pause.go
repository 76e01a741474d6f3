package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/boot"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/runner"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

// Pause and resume (sandbox::pause, sandbox::resume) under QEMU. Pause
// saves the running VM (RAM and devices: QEMU's migration stream, as a
// snapshot template is saved) to pause.state in the sandbox's state
// directory, beside its overlay, and ends QEMU and the runner: a paused
// sandbox holds no memory and no process. pause.json records what a later
// adapter needs to resume it (the runner configuration it restarts from).
// Resume starts a runner on the same directory restoring from pause.state
// (-incoming), reconnects to the guest agent and makes the guest fresh as
// a template clone is made fresh (new RNG seed, the host's clock), then
// removes the saved state. libkrun cannot save a VM: its sandboxes answer
// S006 (docs/sandbox-libkrun.md, Pause and resume).

// Files of a paused sandbox, in its state directory.
const (
	pauseStateName = "pause.state"
	pauseRAMName   = "pause.ram"
	pauseMetaName  = "pause.json"
)

// pauseFormat is pause.json's version.
const pauseFormat = 1

// pauseMeta is pause.json: the paused sandbox as a later adapter finds it.
type pauseMeta struct {
	Format    int       `json:"format"`
	SandboxID string    `json:"sandbox_id"`
	PausedAt  time.Time `json:"paused_at"`
	// Runner is the configuration a resume starts the runner with: the
	// VM's spec with its template set to the saved state.
	Runner  runner.Config `json:"runner"`
	Env     []string      `json:"env"`
	Workdir string        `json:"workdir"`
	// StateBytes is pause.state's size.
	StateBytes int64 `json:"state_bytes"`
}

var (
	_ sandboxkit.PauseProvider = (*Provider)(nil)
	_ sandboxkit.Pausable      = (*sandbox)(nil)
)

// CanPause implements sandboxkit.PauseProvider: QEMU VMs can be saved,
// libkrun's cannot. While the back end is still being chosen, the
// configured hypervisor decides; before the configuration (the engine's
// plugin host reads adapter::info first, and publishes sandbox::pause
// from it) the answer is yes, and a libkrun sandbox answers S006.
func (p *Provider) CanPause() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sel != nil {
		return p.sel.Backend == backend.QEMU
	}
	return p.cfg == nil || p.cfg.Hypervisor != backend.Libkrun
}

// resumeSpec is the spec that restores the VM from its saved state: the
// same devices, RAM backed as at boot (a clone's file-backed RAM by an
// empty private file of the same size, so the RAM block is the same).
func (s *sandbox) resumeSpec() backend.Spec {
	spec := s.vm
	t := &backend.Template{StateFile: s.dir.File(pauseStateName)}
	if s.vm.Template != nil && s.vm.Template.MemoryFile != "" {
		t.MemoryFile = s.dir.File(pauseRAMName)
	}
	spec.Template = t
	return spec
}

// Pause implements sandboxkit.Pausable.
func (s *sandbox) Pause(ctx context.Context) error {
	s.move.Lock()
	defer s.move.Unlock()
	if s.backend != backend.QEMU {
		return contract.NewError(contract.S006, "sandbox %s runs under %s, which cannot save a VM's state; only QEMU sandboxes pause (hypervisor: qemu); use sandbox::stop", s.id, s.backend)
	}
	s.mu.Lock()
	proc, agent, stopping, paused := s.proc, s.agent, s.stopping, s.paused
	s.mu.Unlock()
	switch {
	case stopping:
		return contract.NewError(contract.S004, "sandbox %s is stopping", s.id)
	case paused:
		return nil
	}
	select {
	case <-proc.Done():
		return contract.NewError(contract.S004, "sandbox %s: its VM is gone", s.id)
	default:
	}
	log := s.p.log.With("sandbox_id", s.id)
	t0 := time.Now()
	// The guest's agent then waits for a new host, as at boot: resume
	// connects again.
	_ = agent.Close()
	statePath := s.dir.File(pauseStateName)
	tmp := statePath + ".tmp"
	_ = os.Remove(tmp)
	// Frozen first: the save copies a still VM, which is what a pause
	// keeps (and QEMU then restores it paused; restore continues it).
	if err := qemu.Stop(ctx, s.dir.Path); err != nil {
		return s.unpause(ctx, proc, fmt.Errorf("stop the VM's CPUs: %w", err))
	}
	if err := qemu.SaveTemplate(ctx, s.dir.Path, tmp); err != nil {
		_ = os.Remove(tmp)
		return s.unpause(ctx, proc, fmt.Errorf("save the VM's state: %w", err))
	}
	s.mu.Lock()
	s.pausing = true
	s.mu.Unlock()
	if err := qemu.Quit(ctx, s.dir.Path); err != nil {
		log.Warn("quit QEMU after saving a paused sandbox; killing it", "error", err)
	}
	qctx, cancel := context.WithTimeout(ctx, boot.PowerOffWait)
	select {
	case <-proc.Done():
	case <-qctx.Done():
	}
	cancel()
	if err := proc.Stop(ctx, boot.ReleaseGrace); err != nil {
		log.Warn("stop the runner of a paused sandbox", "pid", proc.PID, "error", err)
	}
	err := s.writePaused(tmp, statePath)
	s.mu.Lock()
	s.pausing = false
	if err == nil {
		s.paused = true
	}
	s.mu.Unlock()
	if err != nil {
		// The VM is gone and its state could not be kept.
		s.markGone()
		return fmt.Errorf("keep the paused sandbox's state: %w", err)
	}
	log.Info("sandbox paused", "ms", time.Since(t0).Milliseconds())
	return nil
}

// unpause lets a VM whose save failed run on: QMP cont, then a new agent
// connection. If that fails too the VM is killed and the sandbox is gone.
func (s *sandbox) unpause(ctx context.Context, proc *runner.Process, cause error) error {
	err := func() error {
		q, err := qemu.DialQMP(ctx, s.dir.File(qemu.QMPName))
		if err != nil {
			return err
		}
		defer q.Close()
		if err := q.Execute(ctx, "cont", nil, nil); err != nil {
			return err
		}
		dctx, cancel := context.WithTimeout(ctx, s.p.current().BootTimeout)
		defer cancel()
		c, err := boot.DialAgent(dctx, proc, s.vm.SocketPath(), s.p.log.With("sandbox_id", s.id))
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.agent = c
		s.mu.Unlock()
		return nil
	}()
	if err != nil {
		s.p.log.Warn("a sandbox whose pause failed could not run on; killing it", "sandbox_id", s.id, "error", err)
		kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = proc.Kill(kctx)
		cancel()
		return errors.Join(cause, fmt.Errorf("and the VM could not run on (it was stopped): %w", err))
	}
	return cause
}

// writePaused finishes a pause on disk: the state file under its name, the
// RAM file a clone's resume maps, pause.json, and no stale pid files.
func (s *sandbox) writePaused(tmp, statePath string) error {
	if err := os.Rename(tmp, statePath); err != nil {
		return err
	}
	for _, name := range []string{runner.VMPIDName, runner.RunnerPIDName} {
		_ = os.Remove(s.dir.File(name))
	}
	spec := s.resumeSpec()
	if spec.Template.MemoryFile != "" {
		f, err := os.OpenFile(spec.Template.MemoryFile, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		err = f.Truncate(int64(spec.MemoryMiB) << 20)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	fi, err := os.Stat(statePath)
	if err != nil {
		return err
	}
	meta := pauseMeta{
		Format: pauseFormat, SandboxID: s.id, PausedAt: s.p.now().UTC(),
		Runner: runner.Config{Version: runner.ConfigVersion, Backend: s.backend, Spec: spec},
		Env:    s.env, Workdir: s.workdir, StateBytes: fi.Size(),
	}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(s.dir.File(pauseMetaName), b, 0o600)
}

// Resume implements sandboxkit.Pausable.
func (s *sandbox) Resume(ctx context.Context) error {
	s.move.Lock()
	defer s.move.Unlock()
	s.mu.Lock()
	stopping, paused := s.stopping, s.paused
	s.mu.Unlock()
	switch {
	case stopping:
		return contract.NewError(contract.S004, "sandbox %s is stopping", s.id)
	case !paused:
		return nil
	}
	log := s.p.log.With("sandbox_id", s.id)
	t0 := time.Now()
	spec := s.resumeSpec()
	proc, err := runner.Spawn(ctx, runner.SpawnOptions{
		Executable: s.p.exe,
		Dir:        s.dir,
		Config:     runner.Config{Version: runner.ConfigVersion, Backend: s.backend, Spec: spec, AdoptGraceMS: uint64(s.p.current().AdoptGrace.Milliseconds())},
	})
	if err != nil {
		return fmt.Errorf("start the VM's runner: %w", err)
	}
	fail := func(err error) error {
		kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = proc.Kill(kctx)
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, s.p.current().BootTimeout)
	agent, err := boot.DialAgent(dctx, proc, spec.SocketPath(), log)
	cancel()
	if err != nil {
		return fail(contract.NewError(contract.S300, "the paused sandbox's VM did not come back (it stays paused): %v%s", err, boot.VMTails(s.dir.Path, 20)))
	}
	// Like every clone of a template, a resumed VM has its old RNG
	// state and clock: nothing may run before it is made fresh.
	fresh, err := boot.Freshen(ctx, &boot.Boot{Host: s.p.host(), Agent: agent}, boot.SandboxHostname(s.id))
	if err == nil && !fresh {
		err = errors.New("the guest agent cannot reseed its RNG")
	}
	if err != nil {
		_ = agent.Close()
		return fail(contract.NewError(contract.S300, "make the resumed sandbox VM fresh (it stays paused): %v", err))
	}
	s.mu.Lock()
	s.proc, s.agent, s.paused = proc, agent, false
	s.mu.Unlock()
	go s.watch(proc)
	for _, name := range []string{pauseMetaName, pauseStateName, pauseRAMName} {
		_ = os.Remove(s.dir.File(name))
	}
	log.Info("sandbox resumed", "ms", time.Since(t0).Milliseconds())
	return nil
}
