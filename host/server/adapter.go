package server

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/iii-sandbox/iii/host/config"
	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/protocol"
)

// syncAdapter makes the adapter the engine runs for config.yaml's
// sandbox: section match next: the adapter it started for an earlier
// binding that differs (adapter, namespace or config) is stopped and
// dropped from engine::adapters::list, unless
// Compose or a caller has taken it over since; the adapter next binds is
// looked up by name (the plugin host's search order) and started with
// next's config. An unchanged binding is left untouched. Nothing here
// fails the engine: an adapter that is not installed leaves sandbox::*
// answering S301 with how to install it, and one that does not start
// stays listed as failed, so calls get S301 with its reason.
func (s *Server) syncAdapter(ctx context.Context, next *config.Sandbox) {
	s.adapterMu.Lock()
	defer s.adapterMu.Unlock()
	if s.reloadInPlace(ctx, next) {
		return
	}
	if prev := s.loaded; prev != nil && (next == nil || adapterOf(*prev) != adapterOf(*next)) {
		removed, err := s.ph.RemoveIfStartedBy(ctx, prev.Adapter, prev.Namespace, pluginhost.OriginConfig)
		switch {
		case err != nil:
			s.log.Warn("stop the sandbox adapter of the previous binding", "adapter", prev.Adapter, "namespace", prev.Namespace, "error", err)
		case removed:
			s.log.Info("stopped the sandbox adapter of the previous binding", "adapter", prev.Adapter, "namespace", prev.Namespace)
		}
		s.loaded = nil
	}
	s.missing.Store(nil)
	if next == nil || s.opts.AdapterByCompose {
		return
	}
	if next.Hosts != "" {
		// A fleet: sandbox hosts connect and register themselves
		// (docs/scale-out.md); the engine runs no adapter of its own.
		s.log.Info("sandbox binding is a fleet; waiting for its hosts to connect", "adapter", next.Adapter, "namespace", next.Namespace, "hosts", next.Hosts)
		return
	}
	if s.loaded != nil {
		return // unchanged
	}
	if _, err := s.ph.Find(next.Adapter); err != nil {
		msg := err.Error()
		s.missing.Store(&msg)
		s.log.Info("the sandbox adapter config.yaml binds is not installed; sandbox::* calls answer S301 until it runs", "adapter", next.Adapter, "reason", msg)
		return
	}
	var cfg json.RawMessage
	if next.Config != "" {
		cfg = json.RawMessage(next.Config)
	}
	st, err := s.ph.Start(ctx, pluginhost.StartRequest{Adapter: next.Adapter, Namespace: next.Namespace, Config: cfg, Origin: pluginhost.OriginConfig})
	var eb *protocol.ErrorBody
	switch {
	case err == nil:
		s.loaded = copySandbox(next)
		s.log.Info("started the sandbox adapter config.yaml binds", "adapter", next.Adapter, "namespace", next.Namespace, "path", st.Path, "pid", st.PID)
	case errors.As(err, &eb) && eb.Code == pluginhost.CodeAlreadyStarted:
		// Compose or a caller runs it already, with its own configuration.
		s.log.Info("the sandbox adapter config.yaml binds is already running; left as it is", "adapter", next.Adapter, "namespace", next.Namespace, "started_by", st.StartedBy)
	default:
		// It stays listed (failed or incompatible), so callers get the
		// reason; a later change of the binding retries it.
		s.loaded = copySandbox(next)
		s.log.Error("the sandbox adapter config.yaml binds did not start", "adapter", next.Adapter, "namespace", next.Namespace, "error", err)
	}
}

// reloadInPlace applies a binding whose only change is sandbox.config to
// the adapter the engine runs for it, keeping its process (and so every
// sandbox), when the adapter can take the new configuration live
// (pluginhost.Host.Reconfigure). It reports whether it did; when not,
// syncAdapter restarts the adapter as before. The caller holds adapterMu.
func (s *Server) reloadInPlace(ctx context.Context, next *config.Sandbox) bool {
	prev := s.loaded
	if prev == nil || next == nil || next.Hosts != "" || s.opts.AdapterByCompose || !onlyConfigDiffers(*prev, *next) {
		return false
	}
	var cfg json.RawMessage
	if next.Config != "" {
		cfg = json.RawMessage(next.Config)
	}
	st, ok, why, err := s.ph.Reconfigure(ctx, next.Adapter, next.Namespace, cfg, pluginhost.OriginConfig)
	switch {
	case err != nil:
		s.log.Warn("reload the sandbox adapter's configuration in place; restarting it instead", "adapter", next.Adapter, "namespace", next.Namespace, "error", err)
		return false
	case !ok:
		s.log.Info("sandbox.config changed; restarting the sandbox adapter to apply it", "adapter", next.Adapter, "namespace", next.Namespace, "why", why)
		return false
	}
	s.loaded = copySandbox(next)
	s.log.Info("sandbox.config changed; applied to the running sandbox adapter without a restart", "adapter", next.Adapter, "namespace", next.Namespace, "pid", st.PID)
	return true
}

// onlyConfigDiffers reports whether two bindings of the same adapter
// differ in sandbox.config alone (the heartbeat aside, see adapterOf).
func onlyConfigDiffers(a, b config.Sandbox) bool {
	a, b = adapterOf(a), adapterOf(b)
	if a.Config == b.Config {
		return false
	}
	a.Config, b.Config = "", ""
	return a == b
}

// adapterOf is what of a binding the adapter process depends on: the
// heartbeat is the engine's business and never restarts it.
func adapterOf(b config.Sandbox) config.Sandbox {
	b.HostHeartbeatMS = 0
	return b
}

// bindingRestartTimeout bounds bringing the bound adapter back.
const bindingRestartTimeout = 2 * time.Minute

// bindingComebackDelay is how long a stopped adapter that had taken over
// the bound one stays stopped before the engine brings its own back: a
// restart (Compose's compose::restart is a stop, then a start with a
// newly layered configuration) starts it again well within it, and then
// nothing is done.
const bindingComebackDelay = 5 * time.Second

// adapterStopped brings back the adapter config.yaml binds when another
// start had taken it over (Compose's, or a caller's) and that one was
// stopped for good: config.yaml still says which adapter serves
// sandbox::*, so it runs again with config.yaml's configuration. An
// adapter the engine itself started and someone stopped stays stopped:
// that was the point; so does one that failed (its reason is what callers
// should see).
func (s *Server) adapterStopped(adapter, namespace, startedBy string) {
	b := s.sandbox.Load()
	if b == nil || b.Hosts != "" || startedBy == pluginhost.OriginConfig || s.opts.AdapterByCompose {
		return
	}
	ns := b.Namespace
	if ns == "" {
		ns = "default"
	}
	if b.Adapter != adapter || ns != namespace {
		return
	}
	next := copySandbox(b)
	s.comebacks.Add(1)
	go func() {
		defer s.comebacks.Done()
		delay := s.opts.comebackDelay
		if delay <= 0 {
			delay = bindingComebackDelay
		}
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.closing:
			return
		}
		cur := s.sandbox.Load()
		st, ok := s.ph.Lookup(adapter, namespace)
		if cur == nil || *cur != *next || !ok || st.State != pluginhost.StateStopped || st.StartedBy == pluginhost.OriginConfig {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), bindingRestartTimeout)
		defer cancel()
		go func() {
			select {
			case <-s.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		s.adapterMu.Lock()
		s.loaded = nil
		s.adapterMu.Unlock()
		s.log.Info("the adapter that took over the one config.yaml binds was stopped; starting config.yaml's again", "adapter", adapter, "namespace", namespace, "stopped_start_by", startedBy)
		s.syncAdapter(ctx, next)
	}()
}

func copySandbox(b *config.Sandbox) *config.Sandbox {
	c := *b
	return &c
}

// notInstalled is the router's view of a bound adapter the engine found
// no binary for: where it looked ("" when it was found, or not looked for).
func (s *Server) notInstalled(adapter, namespace string) string {
	m := s.missing.Load()
	b := s.sandbox.Load()
	if m == nil || b == nil || b.Adapter != adapter || b.Namespace != namespace {
		return ""
	}
	return *m
}

// bindingWarnings are the router's warnings about the sandbox binding
// (engine::adapters::list shows them). The router is created after the
// plugin host, before the engine serves anyone.
func (s *Server) bindingWarnings() []string {
	if s.rt == nil {
		return nil
	}
	return s.rt.Warnings()
}
