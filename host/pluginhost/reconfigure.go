package pluginhost

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"

	"github.com/iii-sandbox/iii/contract"
)

// Reloading a running adapter's configuration without a restart (issue
// 23): an adapter that announces contract.CapabilityReconfigure gets the
// new configuration through the same Configure call that configured it at
// start, and keeps its process, its sandboxes and its publication. When
// it answers contract.RestartRequired (a changed key needs a new process),
// refuses the configuration, cannot be reached, or does not announce the
// capability, the caller takes the restart path as before: a restart
// keeps the sandboxes of an adapter that can adopt them (sandbox-libkrun),
// and a refused configuration then fails the new process with the reason,
// which is what callers and engine::adapters::list report.

// Reconfigure hands config to adapter's running process in namespace in
// place, when its last start came from origin (Status.StartedBy; "" for
// any) and it announces the reconfigure capability. reconfigured reports
// whether it did; when not, why says so for the log, and the caller
// restarts the adapter instead. err is only for a malformed request or a
// context that ended while waiting for the host's turn.
func (h *Host) Reconfigure(ctx context.Context, adapter, namespace string, config json.RawMessage, origin string) (st Status, reconfigured bool, why string, err error) {
	k, err := checkNames(adapter, namespace)
	if err != nil {
		return Status{}, false, "", err
	}
	cfg, err := normConfig(config)
	if err != nil {
		return Status{}, false, "", err
	}
	if err := h.acquire(ctx); err != nil {
		return Status{}, false, "", err
	}
	defer h.release()
	h.mu.Lock()
	closed, m := h.closed, h.entries[k]
	h.mu.Unlock()
	switch {
	case closed:
		return Status{}, false, "the engine is stopping", nil
	case m == nil:
		return Status{}, false, "the adapter is not running", nil
	case origin != "" && m.snapshot().StartedBy != origin:
		return m.snapshot(), false, "the adapter was started by " + m.snapshot().StartedBy, nil
	}
	ok, why := h.reconfigureLocked(ctx, m, cfg)
	return m.snapshot(), ok, why, nil
}

// tryReconfigure is Restart's first attempt when the caller gives a new
// configuration: the adapter keeps running when it can take it live. An
// unchanged configuration is a restart the caller asked for (to pick up an
// upgraded binary, or host roots read at start), so it is not tried. The
// caller holds the host's turn.
func (h *Host) tryReconfigure(ctx context.Context, m *managed, config json.RawMessage) (Status, bool) {
	if config == nil {
		return Status{}, false
	}
	m.mu.Lock()
	current := m.config
	m.mu.Unlock()
	if sameConfig(current, config) {
		return Status{}, false
	}
	ok, why := h.reconfigureLocked(ctx, m, config)
	if !ok {
		m.log.Info("restarting the sandbox adapter to apply its new configuration", "why", why)
		return Status{}, false
	}
	// A new configuration is the caller's, no longer config.yaml's, as
	// after a restart with one.
	m.update(func(s *Status) { s.StartedBy = OriginCall })
	return m.snapshot(), true
}

// reconfigureLocked sends config to m's running process; the caller holds
// the host's turn. On success m keeps config for relaunches and the
// configuration worker is told of it.
func (h *Host) reconfigureLocked(ctx context.Context, m *managed, config json.RawMessage) (bool, string) {
	m.mu.Lock()
	in, state := m.current, m.status.State
	m.mu.Unlock()
	switch {
	case in == nil || state != StateRunning:
		return false, "the adapter is not running (state " + string(state) + ")"
	case in.info == nil || !in.info.HasCapability(contract.CapabilityReconfigure):
		return false, "the adapter does not announce the " + contract.CapabilityReconfigure + " capability"
	}
	cctx, cancel := context.WithTimeout(ctx, h.opts.StartTimeout)
	defer cancel()
	stop := context.AfterFunc(h.ctx, cancel)
	defer stop()
	if err := in.adapter.Configure(cctx, config); err != nil {
		if contract.IsRestartRequired(err) {
			return false, "a changed key needs a new process: " + restartReason(err)
		}
		return false, "the running adapter did not take the configuration: " + err.Error()
	}
	m.mu.Lock()
	m.config = config
	m.mu.Unlock()
	h.announceConfig(m.key, config)
	m.log.Info("sandbox adapter configuration reloaded without a restart", "pid", in.pid)
	return true, ""
}

// restartReason is the adapter's message of a RestartRequired refusal.
func restartReason(err error) string {
	var rej *contract.ConfigRejectedError
	if errors.As(err, &rej) && rej.Err != nil {
		return rej.Err.Message
	}
	return err.Error()
}

// sameConfig compares two configurations as JSON values: spacing and
// member order do not count.
func sameConfig(a, b json.RawMessage) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return string(a) == string(b)
	}
	return reflect.DeepEqual(va, vb)
}
