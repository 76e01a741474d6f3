package sandboxkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/iii-sandbox/iii/contract"
)

// Reloading the configuration of a running adapter (issue 23). The host
// sends Configure again when the adapter's configuration changes; the
// Manager announces contract.CapabilityReconfigure so it knows it may. A
// reload is all or nothing: the new configuration is parsed and checked
// exactly as at start, then either every change is applied, or nothing
// is and Configure answers why.
//
// Every key the kit owns changes live. What a change means for sandboxes
// already running is what a user raising or lowering a limit expects:
//
//   - max_concurrent_sandboxes counts from the next create; lowering it
//     stops no sandbox, it refuses creates until enough have ended.
//   - max_concurrent_exec_per_sandbox applies to every sandbox's next
//     exec; execs under way are not stopped.
//   - max_exec_timeout_ms clamps the next exec's timeout.
//   - image_allowlist, custom_images, per_image_caps, default_cpus,
//     default_memory_mb, default_idle_timeout_secs and auto_install apply
//     to sandboxes created from now on; a running sandbox keeps its image,
//     shape and idle timeout even if the new configuration would refuse it.
//   - idle_action applies from the reaper's next round; reaper_tick_ms
//     restarts the reaper.
//
// The provider's keys change live only through Reconfigurer. Without it,
// a change of any provider key answers contract.RestartRequired naming
// those keys, and so does any change at all for a KitConfigurer (its own
// keys refer to the kit's configuration, and it has no way to hear that
// the kit's changed).

// Reconfigurer is an optional Provider extension, for a provider some of
// whose keys can change while it runs. On every reload Reconfigure gets
// the provider's keys, all of them as at Configure (not only the changed
// ones); a KitConfigurer has been handed the new kit configuration just
// before. It either applies every change and returns nil, or changes
// nothing and returns contract.RestartRequired naming the changed keys it
// cannot apply live, or another error for an invalid value (which rejects
// the reload; the adapter keeps running with its configuration). When it
// fails, a KitConfigurer is handed the previous kit configuration back.
type Reconfigurer interface {
	Reconfigure(ctx context.Context, providerKeys map[string]json.RawMessage) error
}

// reconfigure applies cfg and providerKeys to a configured Manager; the
// caller holds confMu.
func (m *Manager) reconfigure(ctx context.Context, cfg *Config, providerKeys map[string]json.RawMessage, presets []contract.CatalogImage) error {
	if cfg.IdleAction == IdlePause && !m.canPause() {
		return fmt.Errorf("invalid sandbox adapter configuration: %s is %q, but this adapter's sandboxes cannot be paused (it does not announce the %q capability); use %q", KeyIdleAction, IdlePause, contract.CapabilityPause, IdleStop)
	}
	m.mu.Lock()
	old, oldCatalog, oldKeys := m.cfg, m.catalog, m.providerKeys
	m.mu.Unlock()
	kitChanged := ChangedKitKeys(old, cfg)
	provChanged := ChangedKeys(oldKeys, providerKeys)
	catalog := buildCatalog(presets, cfg.CustomImages)

	kc, isKC := m.provider.(KitConfigurer)
	rc, isRC := m.provider.(Reconfigurer)
	switch {
	case isRC:
		if isKC {
			kc.ConfigureKit(cfg, catalog)
		}
		if err := rc.Reconfigure(ctx, providerKeys); err != nil {
			if isKC {
				kc.ConfigureKit(old, oldCatalog)
			}
			if contract.IsRestartRequired(err) {
				return err
			}
			return fmt.Errorf("invalid sandbox adapter configuration: %w", err)
		}
	case len(provChanged) > 0:
		return contract.RestartRequired(provChanged)
	case isKC && len(kitChanged) > 0:
		return contract.RestartRequired(kitChanged)
	}

	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return errors.New("the adapter is shutting down")
	}
	m.cfg, m.catalog, m.providerKeys = cfg, catalog, providerKeys
	if cfg.ReaperTick != old.ReaperTick && m.stopReaper != nil {
		close(m.stopReaper)
		m.stopReaper = make(chan struct{})
		m.wg.Add(1)
		go m.reaper(cfg.ReaperTick, m.stopReaper)
	}
	m.mu.Unlock()
	changed := append(kitChanged, provChanged...)
	if len(changed) == 0 {
		m.log.Info("configuration reloaded; nothing changed")
		return nil
	}
	m.log.Info("configuration reloaded without a restart", "changed", strings.Join(changed, ","),
		"max_concurrent_sandboxes", cfg.MaxConcurrentSandboxes, "exec_slots", cfg.ExecSlots())
	return nil
}

// ChangedKitKeys lists the kit's keys whose values differ between a and
// b, in KitConfigKeys order.
func ChangedKitKeys(a, b *Config) []string {
	fields := map[string]func(c *Config) any{
		KeyImageAllowlist:              func(c *Config) any { return c.ImageAllowlist },
		KeyCustomImages:                func(c *Config) any { return c.CustomImages },
		KeyAutoInstall:                 func(c *Config) any { return c.AutoInstall },
		KeyDefaultCPUs:                 func(c *Config) any { return c.DefaultCPUs },
		KeyDefaultMemoryMB:             func(c *Config) any { return c.DefaultMemoryMB },
		KeyDefaultIdleTimeoutSecs:      func(c *Config) any { return c.DefaultIdleTimeoutSecs },
		KeyMaxConcurrentSandboxes:      func(c *Config) any { return c.MaxConcurrentSandboxes },
		KeyMaxConcurrentExecPerSandbox: func(c *Config) any { return c.MaxConcurrentExecPerSandbox },
		KeyMaxExecTimeoutMS:            func(c *Config) any { return c.MaxExecTimeoutMS },
		KeyPerImageCaps:                func(c *Config) any { return c.PerImageCaps },
		KeyReaperTickMS:                func(c *Config) any { return c.ReaperTick },
		KeyIdleAction:                  func(c *Config) any { return c.IdleAction },
	}
	var out []string
	for _, k := range KitConfigKeys() {
		get := fields[k]
		if get == nil {
			// A key added to KitConfigKeys without a line here counts as
			// changed, so a reload never silently ignores it.
			out = append(out, k)
			continue
		}
		if !SameConfigValue(get(a), get(b)) {
			out = append(out, k)
		}
	}
	return out
}

// SameConfigValue compares two parsed configuration values; empty and
// nil lists or maps are the same (a parser leaves an absent list nil).
// Providers classifying their own changed keys use it too.
func SameConfigValue(a, b any) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	if va.Kind() == vb.Kind() && (va.Kind() == reflect.Slice || va.Kind() == reflect.Map) && va.Len() == 0 && vb.Len() == 0 {
		return true
	}
	return reflect.DeepEqual(a, b)
}

// ChangedKeys lists, sorted, the keys whose JSON values differ between a
// and b, a key present in only one of them included. Values are compared
// as JSON, not as bytes: spacing and member order do not count.
func ChangedKeys(a, b map[string]json.RawMessage) []string {
	var out []string
	for k, va := range a {
		vb, ok := b[k]
		if !ok || !sameJSON(va, vb) {
			out = append(out, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func sameJSON(a, b json.RawMessage) bool {
	if bytes.Equal(bytes.TrimSpace(a), bytes.TrimSpace(b)) {
		return true
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}
