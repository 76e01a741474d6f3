package adapter

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
)

// TestReconfigureKeyClassification: which changed keys sandbox-libkrun
// applies live and which need a new adapter process. No VM boots.
func TestReconfigureKeyClassification(t *testing.T) {
	home := dirs.Short(t, "ah")
	base := map[string]any{"boot_timeout_ms": 30000}
	for _, tc := range []struct {
		key     string
		value   any
		restart bool
	}{
		{config.KeyBootTimeoutMS, 45000, false},
		{config.KeyAdoptGraceMS, 0, false},
		{config.KeyWarmPool, map[string]any{"python": 1}, false},
		{config.KeySnapshotTemplates, false, false},
		{config.KeySnapshotTemplatesMaxMB, 100, false},
		{config.KeyNetworkDNSServers, []string{"192.0.2.53"}, false},
		{config.KeyConsoleLogMaxKB, 512, false},
		{config.KeyHypervisor, "qemu", true},
		{config.KeyAccel, "tcg", true},
		{config.KeyKernel, "/boot/vmlinuz-x", true},
		{config.KeyQEMUBinary, "/usr/bin/qemu-x", true},
		{config.KeyLibkrunPath, "/usr/lib/libkrun.so", true},
		{config.KeyAgentPath, "/opt/agent", true},
		{config.KeyStateDir, filepath.Join(home, "s2"), true},
		{config.KeyCacheDir, filepath.Join(home, "c2"), true},
		{config.KeyRegistryMirrors, map[string]any{"docker.io": "https://mirror.example"}, true},
		{config.KeyHostRoots, []string{"/srv"}, true},
		{config.KeyWorkerDiskMB, 2048, true},
		{config.KeyNetworkAllowCIDRs, []string{"192.168.10.0/24"}, true},
	} {
		t.Run(tc.key, func(t *testing.T) {
			a, err := config.ParseConfig(rawKeys(t, base), home, "linux")
			assert.NilError(t, err)
			next := map[string]any{tc.key: tc.value}
			for k, v := range base {
				if k != tc.key {
					next[k] = v
				}
			}
			b, err := config.ParseConfig(rawKeys(t, next), home, "linux")
			assert.NilError(t, err)
			changed := changedConfigKeys(a, b)
			assert.DeepEqual(t, changed, []string{tc.key})
			assert.Equal(t, len(restartKeys(changed)) > 0, tc.restart)
		})
	}
	t.Run("every key is classified and none is missed", func(t *testing.T) {
		a, err := config.ParseConfig(nil, home, "linux")
		assert.NilError(t, err)
		b, err := config.ParseConfig(rawKeys(t, map[string]any{"network_dns_servers": []string{}, "warm_pool": map[string]any{}}), home, "linux")
		assert.NilError(t, err)
		assert.Check(t, is.Len(changedConfigKeys(a, b), 0), "empty lists and maps are the defaults")
		assert.DeepEqual(t, LiveKeys(), []string{config.KeyBootTimeoutMS, config.KeyWarmPool, config.KeySnapshotTemplates, config.KeySnapshotTemplatesMaxMB,
			config.KeyNetworkDNSServers, config.KeyConsoleLogMaxKB, config.KeyAdoptGraceMS})
	})
}

// TestReconfigureProvider: a configured provider takes live keys (what
// adapter::info shows changes, and so do the values boots read), refuses a
// restart-only key with RESTART_REQUIRED naming it and changes nothing,
// and refuses an invalid value the same way Configure does.
func TestReconfigureProvider(t *testing.T) {
	home := dirs.Short(t, "ah")
	p := newTestProvider(t, Options{Home: home})
	ctx := context.Background()
	assert.NilError(t, p.Configure(ctx, rawKeys(t, map[string]any{"boot_timeout_ms": 30000})))

	assert.NilError(t, p.Reconfigure(ctx, rawKeys(t, map[string]any{"boot_timeout_ms": 45000, "console_log_max_kb": 512,
		"network_dns_servers": []string{"192.0.2.53"}, "adopt_grace_ms": 0, "snapshot_templates": false})))
	cur := p.current()
	assert.Equal(t, cur.BootTimeout, 45*time.Second)
	assert.Equal(t, cur.AdoptGrace, time.Duration(0))
	assert.Check(t, !p.KeepsSandboxes(), "adopt_grace_ms 0: the next shutdown stops its VMs")
	info := p.Info(ctx)
	assert.Equal(t, info["boot_timeout_ms"], int64(45000))
	assert.Equal(t, info["console_log_max_kb"], int64(512))
	assert.DeepEqual(t, info["network_dns_servers"], []string{"192.0.2.53:53"})
	assert.DeepEqual(t, info["snapshot_templates"], map[string]any{"enabled": false})

	err := p.Reconfigure(ctx, rawKeys(t, map[string]any{"boot_timeout_ms": 1000, "hypervisor": "qemu", "worker_disk_mb": 2048}))
	assert.Assert(t, contract.IsRestartRequired(err), "%v", err)
	var se *contract.Error
	assert.Assert(t, errors.As(err, &se))
	assert.Check(t, is.Contains(se.Message, "hypervisor, worker_disk_mb"))
	assert.Equal(t, p.current().BootTimeout, 45*time.Second, "nothing changed")

	err = p.Reconfigure(ctx, rawKeys(t, map[string]any{"boot_timeout_ms": "soon"}))
	assert.ErrorContains(t, err, config.KeyBootTimeoutMS)
	assert.Check(t, !contract.IsRestartRequired(err))
	assert.Equal(t, p.current().BootTimeout, 45*time.Second, "nothing changed")
}
