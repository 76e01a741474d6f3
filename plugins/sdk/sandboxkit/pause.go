package sandboxkit

import (
	"context"
	"errors"
	"fmt"

	"github.com/iii-sandbox/iii/contract"
)

// Pausable is an optional Sandbox extension: a sandbox that can be paused
// keeping its memory (processes and their variables) and its files, and
// resumed where it stopped. The kit calls Pause only with no exec or fs
// operation in flight, never calls Exec or an fs method while the sandbox
// is paused or being paused or resumed, and never runs Pause and Resume of
// one sandbox at once; Stop may come at any time, also during either, and
// the sandbox must order it after them. Done must not fire because of a
// pause: a paused sandbox is not gone. Stop of a paused sandbox throws its
// saved state away.
type Pausable interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// PauseProvider is an optional Provider extension: CanPause reports
// whether the provider's sandboxes implement Pausable, so the kit
// announces contract.CapabilityPause in adapter::info. It is asked after
// Configure (a provider may only know once its back end is chosen).
type PauseProvider interface {
	CanPause() bool
}

// Idle actions (idle_action): what the reaper does to an idle sandbox.
const (
	IdleStop  = "stop"
	IdlePause = "pause"
)

var _ contract.PauseAdapter = (*Manager)(nil)

// canPause reports whether the provider announces pausing.
func (m *Manager) canPause() bool {
	p, ok := m.provider.(PauseProvider)
	return ok && p.CanPause()
}

// pausable finds the sandbox of a pause or resume and claims its
// transition: S002 unknown, S004 stopped, S006 when it cannot be paused.
func (m *Manager) pausable(id, op string) (*entry, Pausable, *contract.Error) {
	if !m.canPause() {
		return nil, nil, contract.PauseUnsupported(m.opts.Name, op)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg == nil {
		return nil, nil, m.notConfigured()
	}
	e, ok := m.sandboxes[id]
	if !ok {
		return nil, nil, contract.NewError(contract.S002, "sandbox %s not found: it was never created by this adapter, or was stopped long ago", id)
	}
	if e.stopped {
		return nil, nil, stoppedError(e)
	}
	p, ok := e.sb.(Pausable)
	if !ok {
		return nil, nil, contract.NewError(contract.S006, "sandbox %s cannot be %sd by sandbox adapter %q: its back end cannot save it; use sandbox::stop", id, op, m.opts.Name)
	}
	if e.moving {
		return nil, nil, contract.NewError(contract.S003, "sandbox %s is being paused or resumed; retry %s%s once that is done", id, contract.RouterPrefix, op)
	}
	return e, p, nil
}

// Pause serves sandbox::pause: the sandbox keeps its memory and files and
// answers S005 until Resume. Pausing a paused sandbox changes nothing.
func (m *Manager) Pause(ctx context.Context, req *contract.PauseRequest) (*contract.SandboxStatus, error) {
	e, p, ce := m.pausable(req.SandboxID, contract.OpPause)
	if ce != nil {
		return nil, ce
	}
	m.mu.Lock()
	switch {
	case e.paused:
		m.mu.Unlock()
		return &contract.SandboxStatus{SandboxID: e.id, Status: contract.SandboxPaused}, nil
	case e.execs+e.ops > 0:
		m.mu.Unlock()
		return nil, contract.NewError(contract.S003, "sandbox %s has %d exec(s) and %d fs operation(s) running; pause it once they are done (processes started in the background keep running and are paused with it)", e.id, e.execs, e.ops)
	}
	e.moving = true
	m.mu.Unlock()
	if err := m.pauseEntry(ctx, e, p, "sandbox::pause"); err != nil {
		return nil, err
	}
	return &contract.SandboxStatus{SandboxID: e.id, Status: contract.SandboxPaused}, nil
}

// pauseEntry pauses a sandbox whose transition the caller has claimed.
func (m *Manager) pauseEntry(ctx context.Context, e *entry, p Pausable, why string) error {
	err := p.Pause(ctx)
	m.mu.Lock()
	e.moving = false
	if err == nil {
		e.paused = true
	}
	e.touch(m.now())
	stopped := e.stopped
	m.mu.Unlock()
	if err != nil {
		if stopped {
			return stoppedError(e)
		}
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return err
		}
		return contract.AsError(fmt.Errorf("pause sandbox %s: %w", e.id, err), contract.S300)
	}
	m.log.Info("sandbox paused", "sandbox_id", e.id, "by", why)
	return nil
}

// Resume serves sandbox::resume: the sandbox runs again where it was
// paused. Resuming a running sandbox changes nothing.
func (m *Manager) Resume(ctx context.Context, req *contract.ResumeRequest) (*contract.SandboxStatus, error) {
	e, p, ce := m.pausable(req.SandboxID, contract.OpResume)
	if ce != nil {
		return nil, ce
	}
	m.mu.Lock()
	if !e.paused {
		m.mu.Unlock()
		return &contract.SandboxStatus{SandboxID: e.id, Status: contract.SandboxRunning}, nil
	}
	e.moving = true
	m.mu.Unlock()
	err := p.Resume(ctx)
	m.mu.Lock()
	e.moving = false
	if err == nil {
		e.paused = false
	}
	e.touch(m.now())
	stopped := e.stopped
	m.mu.Unlock()
	if err != nil {
		if stopped {
			return nil, stoppedError(e)
		}
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, err
		}
		return nil, contract.AsError(fmt.Errorf("resume sandbox %s (it stays paused; retry, or stop it): %w", e.id, err), contract.S300)
	}
	m.log.Info("sandbox resumed", "sandbox_id", e.id)
	return &contract.SandboxStatus{SandboxID: e.id, Status: contract.SandboxRunning}, nil
}
