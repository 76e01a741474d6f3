package sandboxkit

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Adopter is an optional Provider extension, for a back end whose
// sandboxes can outlive the adapter process (sandbox-libkrun's VMs run
// under runners that wait for the next adapter; containerd's shims and
// Nomad's RecoverTask are the same idea). With it, an adapter restart, an
// upgrade or an engine restart loses no sandbox:
//
//   - Configure calls AdoptSandboxes once, after Provider.Configure: the
//     sandboxes an earlier process of this adapter left running (or
//     paused) are registered under their ids, with their limits and idle
//     timers, and count toward max_concurrent_sandboxes at once.
//   - Shutdown, when KeepsSandboxes reports true, detaches every live
//     sandbox that implements Detachable instead of stopping it.
type Adopter interface {
	AdoptSandboxes(ctx context.Context) ([]Adopted, error)
	KeepsSandboxes() bool
}

// Detachable is the Sandbox side of Adopter: Detach lets go of the sandbox
// without stopping it, so that the next adapter process can adopt it.
// lastActivity is the kit's idle clock for it, to be handed back through
// Adopted.LastActivity. After Detach the kit never calls the sandbox again.
type Detachable interface {
	Detach(ctx context.Context, lastActivity time.Time) error
}

// Adopted is one sandbox an earlier adapter process left, as the provider
// found it.
type Adopted struct {
	Sandbox Sandbox
	// ID is its sandbox id (a UUID); Name and Image are as created.
	ID, Name, Image string
	Created         time.Time
	// IdleTimeout is the sandbox's own idle timeout (zero: none).
	IdleTimeout time.Duration
	// LastActivity is when it was last used, as the kit last knew it;
	// zero (the earlier adapter did not get to say) counts from now.
	LastActivity time.Time
	// Paused: it was paused and has no VM; Sandbox must be Pausable.
	Paused bool
}

// adopt registers what the provider found. It runs inside Configure,
// before any operation can reach the Manager.
func (m *Manager) adopt(ctx context.Context) {
	a, ok := m.provider.(Adopter)
	if !ok {
		return
	}
	found, err := a.AdoptSandboxes(ctx)
	if err != nil {
		m.log.Warn("could not look for sandboxes an earlier adapter process left", "error", err)
	}
	now := m.now()
	var adopted, paused int
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, f := range found {
		if f.Sandbox == nil {
			continue
		}
		_, dup := m.sandboxes[f.ID]
		_, isPausable := f.Sandbox.(Pausable)
		if _, err := uuid.Parse(f.ID); err != nil || dup || (f.Paused && !isPausable) {
			m.log.Warn("not adopting a sandbox the provider found", "sandbox_id", f.ID, "duplicate", dup)
			sb := f.Sandbox
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				m.stopQuietly(sb, "it could not be adopted")
			}()
			continue
		}
		e := &entry{
			id:          f.ID,
			name:        f.Name,
			image:       f.Image,
			sb:          f.Sandbox,
			created:     f.Created,
			idleTimeout: f.IdleTimeout,
			paused:      f.Paused,
			released:    make(chan struct{}),
		}
		last := f.LastActivity
		if last.IsZero() || last.After(now) {
			last = now
		}
		e.touch(last)
		m.sandboxes[e.id] = e
		m.wg.Add(1)
		go m.watch(e)
		adopted++
		if f.Paused {
			paused++
		}
	}
	if adopted > 0 {
		m.log.Info("adopted the sandboxes an earlier adapter process left", "count", adopted, "paused", paused)
	}
}

// keepsSandboxes reports whether Shutdown detaches instead of stopping.
func (m *Manager) keepsSandboxes() bool {
	a, ok := m.provider.(Adopter)
	return ok && a.KeepsSandboxes()
}
