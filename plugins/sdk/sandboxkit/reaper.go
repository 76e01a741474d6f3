package sandboxkit

import (
	"context"
	"sync"
	"time"
)

// reaper stops idle sandboxes every tick until stop is closed.
func (m *Manager) reaper(tick time.Duration, stop <-chan struct{}) {
	defer m.wg.Done()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			m.reapOnce(m.now())
		}
	}
}

// reapOnce stops every sandbox idle past its timeout at now. Idle time
// counts from the later of the last operation and the provider's own
// activity (relayed network payload). A sandbox with an operation in
// flight is exempt until idle_timeout + max_exec_timeout + 60 s, which
// only a leaked exec slot reaches. It returns the ids it reaped.
func (m *Manager) reapOnce(now time.Time) []string {
	m.mu.Lock()
	if m.cfg == nil || m.closed {
		m.mu.Unlock()
		return nil
	}
	maxExec := durationOf(m.cfg.MaxExecTimeoutMS, time.Millisecond)
	var live []*entry
	for _, e := range m.sandboxes {
		// A paused sandbox is not idle: nothing runs in it.
		if !e.stopped && !e.paused && !e.moving {
			live = append(live, e)
		}
	}
	pause := m.cfg.IdleAction == IdlePause
	m.pruneLocked(now)
	m.mu.Unlock()

	// The provider's activity is read without the Manager's lock, and for
	// every sandbox at once: it may ask inside a VM, and one slow sandbox
	// must not hold up the others.
	acts := make([]time.Time, len(live))
	var reads sync.WaitGroup
	for i, e := range live {
		reads.Add(1)
		go func() {
			defer reads.Done()
			acts[i] = e.lastActivity()
		}()
	}
	reads.Wait()
	last := make(map[*entry]time.Time, len(live))
	for i, e := range live {
		last[e] = acts[i]
	}

	var reaped, paused []*entry
	m.mu.Lock()
	for _, e := range live {
		if e.stopped || e.paused || e.moving {
			continue
		}
		// An operation may have started since the snapshot; its touch
		// is newer than the snapshot's activity.
		lastAct := last[e]
		if t := time.Unix(0, e.lastOp.Load()); t.After(lastAct) {
			lastAct = t
		}
		idle := now.Sub(lastAct)
		busy := e.execs+e.ops > 0
		due := !busy && idle > e.idleTimeout ||
			busy && idle > addSat(addSat(e.idleTimeout, maxExec), busyGrace)
		if _, ok := e.sb.(Pausable); due && !busy && pause && ok {
			// idle_action: pause. The sandbox keeps its memory and
			// files; sandbox::resume brings it back.
			e.moving = true
			paused = append(paused, e)
			m.wg.Add(1)
			continue
		}
		if due && m.markStoppedLocked(e, "reaped after "+idle.Truncate(time.Second).String()+" idle") {
			reaped = append(reaped, e)
			m.wg.Add(1)
		}
	}
	m.mu.Unlock()

	for _, e := range paused {
		m.log.Info("pausing idle sandbox", "sandbox_id", e.id)
		go func() {
			defer m.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
			defer cancel()
			if err := m.pauseEntry(ctx, e, e.sb.(Pausable), "the idle reaper"); err != nil {
				// An idle sandbox that cannot be paused is stopped,
				// as without idle_action: pause.
				m.log.Warn("pausing an idle sandbox failed; stopping it", "sandbox_id", e.id, "error", err)
				if m.markStopped(e, "reaped: pausing it failed: "+err.Error()) {
					m.stopQuietly(e.sb, "reaped")
				}
			}
		}()
	}
	ids := make([]string, 0, len(reaped)+len(paused))
	for _, e := range paused {
		ids = append(ids, e.id)
	}
	for _, e := range reaped {
		ids = append(ids, e.id)
		m.log.Info("reaping idle sandbox", "sandbox_id", e.id, "reason", e.stopReason)
		go func() {
			defer m.wg.Done()
			m.stopQuietly(e.sb, "reaped")
		}()
	}
	return ids
}
