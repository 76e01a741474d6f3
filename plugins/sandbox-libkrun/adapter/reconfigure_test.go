package adapter

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
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
		{KeyBootTimeoutMS, 45000, false},
		{KeyAdoptGraceMS, 0, false},
		{KeyWarmPool, map[string]any{"python": 1}, false},
		{KeySnapshotTemplates, false, false},
		{KeySnapshotTemplatesMaxMB, 100, false},
		{KeyNetworkDNSServers, []string{"192.0.2.53"}, false},
		{KeyConsoleLogMaxKB, 512, false},
		{KeyHypervisor, "qemu", true},
		{KeyAccel, "tcg", true},
		{KeyKernel, "/boot/vmlinuz-x", true},
		{KeyQEMUBinary, "/usr/bin/qemu-x", true},
		{KeyLibkrunPath, "/usr/lib/libkrun.so", true},
		{KeyAgentPath, "/opt/agent", true},
		{KeyStateDir, filepath.Join(home, "s2"), true},
		{KeyCacheDir, filepath.Join(home, "c2"), true},
		{KeyRegistryMirrors, map[string]any{"docker.io": "https://mirror.example"}, true},
		{KeyHostRoots, []string{"/srv"}, true},
		{KeyWorkerDiskMB, 2048, true},
		{KeyNetworkAllowCIDRs, []string{"192.168.10.0/24"}, true},
	} {
		t.Run(tc.key, func(t *testing.T) {
			a, err := ParseConfig(rawKeys(t, base), home, "linux")
			assert.NilError(t, err)
			next := map[string]any{tc.key: tc.value}
			for k, v := range base {
				if k != tc.key {
					next[k] = v
				}
			}
			b, err := ParseConfig(rawKeys(t, next), home, "linux")
			assert.NilError(t, err)
			changed := changedConfigKeys(a, b)
			assert.DeepEqual(t, changed, []string{tc.key})
			assert.Equal(t, len(restartKeys(changed)) > 0, tc.restart)
		})
	}
	t.Run("every key is classified and none is missed", func(t *testing.T) {
		a, err := ParseConfig(nil, home, "linux")
		assert.NilError(t, err)
		b, err := ParseConfig(rawKeys(t, map[string]any{"network_dns_servers": []string{}, "warm_pool": map[string]any{}}), home, "linux")
		assert.NilError(t, err)
		assert.Check(t, is.Len(changedConfigKeys(a, b), 0), "empty lists and maps are the defaults")
		assert.DeepEqual(t, LiveKeys(), []string{KeyBootTimeoutMS, KeyWarmPool, KeySnapshotTemplates, KeySnapshotTemplatesMaxMB,
			KeyNetworkDNSServers, KeyConsoleLogMaxKB, KeyAdoptGraceMS})
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
	assert.ErrorContains(t, err, KeyBootTimeoutMS)
	assert.Check(t, !contract.IsRestartRequired(err))
	assert.Equal(t, p.current().BootTimeout, 45*time.Second, "nothing changed")
}

// TestWarmPoolResize: a reload's warm_pool stops ready VMs beyond the new
// targets, and every ready VM of a changed shape; the filler then boots
// what is missing. No VM boots: the ready lists hold placeholders.
func TestWarmPoolResize(t *testing.T) {
	catalog := []contract.CatalogImage{{Name: "python", OCIRef: "r/python"}, {Name: "node", OCIRef: "r/node"}}
	kit := &sandboxkit.Config{DefaultCPUs: 1, DefaultMemoryMB: 512}
	w := newWarmPool(nil, map[string]int{"python": 3, "node": 1}, kit, catalog)
	var mu sync.Mutex
	var stopped []*Boot
	w.discard = func(b *Boot) {
		mu.Lock()
		stopped = append(stopped, b)
		mu.Unlock()
	}
	py := []*Boot{{}, {}, {}}
	w.ready["python"] = append([]*Boot{}, py...)
	w.ready["node"] = []*Boot{{}}

	// Fewer python, node gone: two VMs stop, one python VM stays.
	w.resize(map[string]int{"python": 1}, kit, catalog)
	w.discards.Wait()
	assert.Equal(t, len(stopped), 3)
	assert.DeepEqual(t, w.info(), map[string]any{"python": map[string]any{"ready": 1, "target": 1}})
	assert.Check(t, w.ready["python"][0] == py[0])
	assert.Equal(t, w.next(), "")

	// More python: the filler is woken to boot what is missing.
	w.resize(map[string]int{"python": 2}, kit, catalog)
	assert.Equal(t, w.next(), "python")
	select {
	case <-w.kick:
	default:
		t.Fatal("the filler was not woken")
	}

	// A new default shape: every ready VM is the wrong shape.
	bigger := &sandboxkit.Config{DefaultCPUs: 2, DefaultMemoryMB: 512}
	w.resize(map[string]int{"python": 2}, bigger, catalog)
	w.discards.Wait()
	assert.Equal(t, len(stopped), 4)
	assert.DeepEqual(t, w.info(), map[string]any{"python": map[string]any{"ready": 0, "target": 2}})
	spec := sandboxkit.BootSpec{Image: catalog[0], CPUs: 2, MemoryMB: 512}
	assert.Check(t, w.matches(spec), "creates in the new default shape are served from the pool")
	w.mu.Lock()
	assert.Check(t, w.wantedLocked("python", spec))
	old := spec
	old.CPUs = 1
	assert.Check(t, !w.wantedLocked("python", old), "a VM booted in the old shape during the reload is not kept")
	w.mu.Unlock()
}
