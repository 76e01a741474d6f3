package adapter

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/boot"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

// Reloading sandbox-libkrun's keys in a running adapter (sandboxkit's
// Reconfigurer; docs/sandbox-libkrun.md, "Reloading the configuration").
//
// Live: boot_timeout_ms, adopt_grace_ms, network_dns_servers and
// console_log_max_kb apply to VMs started from then on (a running VM keeps
// the runner, console cap, DNS servers and grace it started with);
// warm_pool resizes the pool (surplus ready VMs stop, missing ones boot);
// snapshot_templates turns templates on or off for the next boots, and a
// lower snapshot_templates_max_mb evicts at once.
//
// Restart: everything the back end, the image cache, the state directory
// or the worker VMs were set up from at start (hypervisor, accel, kernel,
// qemu_binary, libkrun_path, agent_path, state_dir, cache_dir,
// registry_mirrors, host_roots, worker_disk_mb), and network_allow_cidrs:
// the guests' network filter lives in each running VM's runner, so a
// reload could not narrow it for VMs already running, and a filter that
// differs between VMs of one adapter is not what anyone would expect.

// liveKeys are the keys Reconfigure applies without a restart.
var liveKeys = map[string]bool{
	config.KeyBootTimeoutMS:          true,
	config.KeyAdoptGraceMS:           true,
	config.KeyWarmPool:               true,
	config.KeySnapshotTemplates:      true,
	config.KeySnapshotTemplatesMaxMB: true,
	config.KeyNetworkDNSServers:      true,
	config.KeyConsoleLogMaxKB:        true,
}

// LiveKeys lists, in ConfigKeys order, the keys a reload applies without
// restarting the adapter.
func LiveKeys() []string {
	var out []string
	for _, k := range config.ConfigKeys() {
		if liveKeys[k] {
			out = append(out, k)
		}
	}
	return out
}

// changedConfigKeys lists, in ConfigKeys order, the keys whose parsed
// values differ between a and b.
func changedConfigKeys(a, b *config.Config) []string {
	fields := map[string]func(c *config.Config) any{
		config.KeyHypervisor:             func(c *config.Config) any { return c.Hypervisor },
		config.KeyAccel:                  func(c *config.Config) any { return c.Accel },
		config.KeyKernel:                 func(c *config.Config) any { return c.Kernel },
		config.KeyQEMUBinary:             func(c *config.Config) any { return c.QEMUBinary },
		config.KeyLibkrunPath:            func(c *config.Config) any { return c.LibkrunPath },
		config.KeyAgentPath:              func(c *config.Config) any { return c.AgentPath },
		config.KeyStateDir:               func(c *config.Config) any { return c.StateDir },
		config.KeyCacheDir:               func(c *config.Config) any { return c.CacheDir },
		config.KeyRegistryMirrors:        func(c *config.Config) any { return c.RegistryMirrors },
		config.KeyBootTimeoutMS:          func(c *config.Config) any { return c.BootTimeout },
		config.KeyHostRoots:              func(c *config.Config) any { return c.HostRoots },
		config.KeyWorkerDiskMB:           func(c *config.Config) any { return c.WorkerDiskMB },
		config.KeyNetworkAllowCIDRs:      func(c *config.Config) any { return c.NetworkAllowCIDRs },
		config.KeyWarmPool:               func(c *config.Config) any { return c.WarmPool },
		config.KeySnapshotTemplates:      func(c *config.Config) any { return c.SnapshotTemplates },
		config.KeySnapshotTemplatesMaxMB: func(c *config.Config) any { return c.SnapshotTemplatesMaxMB },
		config.KeyNetworkDNSServers:      func(c *config.Config) any { return c.NetworkDNSServers },
		config.KeyConsoleLogMaxKB:        func(c *config.Config) any { return c.ConsoleLogMaxBytes },
		config.KeyAdoptGraceMS:           func(c *config.Config) any { return c.AdoptGrace },
	}
	var out []string
	for _, k := range config.ConfigKeys() {
		get := fields[k]
		// A key added to ConfigKeys without a line here counts as
		// changed, and so restarts the adapter rather than being ignored.
		if get == nil || !sandboxkit.SameConfigValue(get(a), get(b)) {
			out = append(out, k)
		}
	}
	return out
}

// restartKeys are the changed keys a reload cannot apply.
func restartKeys(changed []string) []string {
	var out []string
	for _, k := range changed {
		if !liveKeys[k] {
			out = append(out, k)
		}
	}
	return out
}

// Reconfigure implements sandboxkit.Reconfigurer. The keys are parsed and
// checked as at Configure; a change of a key that needs a restart answers
// contract.RestartRequired and changes nothing. The kit has handed the new
// kit configuration (ConfigureKit) just before, so the warm pool is
// checked against the new catalog and allowlist and booted in the new
// default shape.
func (p *Provider) Reconfigure(ctx context.Context, keys map[string]json.RawMessage) error {
	next, err := config.ParseConfig(keys, p.home, config.HostGOOS())
	if err != nil {
		return err
	}
	p.mu.Lock()
	started, closed, kit, catalog := p.cfg, p.closed, p.kit, p.catalog
	p.mu.Unlock()
	if started == nil || closed {
		return errors.New("the provider is not configured or is shutting down")
	}
	cur := p.current()
	changed := changedConfigKeys(cur, next)
	if restart := restartKeys(changed); len(restart) > 0 {
		return contract.RestartRequired(restart)
	}
	if len(next.WarmPool) > 0 {
		err := config.Err(config.KeyWarmPool, "needs the kit's configuration (the catalog and the allowlist)")
		if kit != nil {
			err = config.CheckWarmPool(next.WarmPool, catalog, kit.Allowed)
		}
		if err != nil {
			return err
		}
	}

	// Nothing below fails: the reload is applied whole.
	p.live.Store(next)
	p.templates.Apply(ctx, next.SnapshotTemplates, next.SnapshotTemplatesMaxMB)
	p.mu.Lock()
	pool := p.pool
	switch {
	case pool != nil && kit != nil:
		pool.Resize(next.WarmPool, kit, catalog)
	case pool == nil && len(next.WarmPool) > 0 && !p.closed:
		pool = boot.NewWarmPool(p.host(), next.WarmPool, kit, catalog)
		p.pool = pool
		go pool.Run(p.bg)
	}
	p.mu.Unlock()
	if len(changed) > 0 {
		p.log.Info("sandbox-libkrun configuration reloaded", "changed", changed)
	}
	return nil
}
