package hostdir

import (
	"context"
	"errors"

	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

// Pause and resume, plainly: a hostdir sandbox is a directory, so pausing
// marks it paused (the kit then answers exec and fs with S005) and resume
// unmarks it. Processes an exec left in the background keep running on
// the host: hostdir isolates nothing, and freezes nothing either.

var (
	_ sandboxkit.PauseProvider = (*Provider)(nil)
	_ sandboxkit.Pausable      = (*sandbox)(nil)
)

// CanPause implements sandboxkit.PauseProvider: every hostdir sandbox can
// be paused.
func (p *Provider) CanPause() bool { return true }

// Pause implements sandboxkit.Pausable.
func (s *sandbox) Pause(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return errors.New("the sandbox is stopped")
	}
	s.paused = true
	return nil
}

// Resume implements sandboxkit.Pausable.
func (s *sandbox) Resume(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return errors.New("the sandbox is stopped")
	}
	s.paused = false
	return nil
}
