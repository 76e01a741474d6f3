package config

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/contract"
)

func keysOf(t *testing.T, js string) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	assert.NilError(t, json.Unmarshal([]byte(js), &m))
	return m
}

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig(nil, "/home/u", "linux")
	assert.NilError(t, err)
	assert.DeepEqual(t, cfg, &Config{
		Hypervisor: Auto, Accel: Auto, StateDir: "/home/u/.iii/sandbox", CacheDir: "/home/u/.iii/cache",
		RegistryMirrors: map[string]string{}, BootTimeout: DefaultBootTimeout, AdoptGrace: DefaultAdoptGrace, WorkerDiskMB: DefaultWorkerDiskMB,
		WarmPool: map[string]int{}, SnapshotTemplates: true, SnapshotTemplatesMaxMB: DefaultSnapshotTemplatesMaxMB,
	})
}

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    string
		goos  string
		check func(t *testing.T, c *Config)
		err   string
	}{
		{name: "every key", in: `{"hypervisor":"qemu","accel":"tcg","kernel":"/boot/vmlinuz-x","qemu_binary":"~/bin/qemu",
			"libkrun_path":"/opt/libkrun.so.1","agent_path":"/opt/agent","state_dir":"/s","cache_dir":"/c",
			"registry_mirrors":{"docker.io":"http://127.0.0.1:5000"},"boot_timeout_ms":1500,
			"snapshot_templates":false,"snapshot_templates_max_mb":100,"adopt_grace_ms":2500}`,
			check: func(t *testing.T, c *Config) {
				assert.DeepEqual(t, c, &Config{Hypervisor: "qemu", Accel: "tcg", Kernel: "/boot/vmlinuz-x", QEMUBinary: "/home/u/bin/qemu",
					LibkrunPath: "/opt/libkrun.so.1", AgentPath: "/opt/agent", StateDir: "/s", CacheDir: "/c",
					RegistryMirrors: map[string]string{"docker.io": "http://127.0.0.1:5000"}, BootTimeout: 1500 * time.Millisecond, AdoptGrace: 2500 * time.Millisecond, WorkerDiskMB: DefaultWorkerDiskMB,
					WarmPool: map[string]int{}, SnapshotTemplatesMaxMB: 100})
			}},
		{name: "nulls are defaults", in: `{"hypervisor":null,"state_dir":null}`, check: func(t *testing.T, c *Config) {
			assert.Equal(t, c.Hypervisor, Auto)
			assert.Equal(t, c.StateDir, "/home/u/.iii/sandbox")
		}},
		{name: "paths are cleaned", in: `{"state_dir":"/a//b/../c/"}`, check: func(t *testing.T, c *Config) { assert.Equal(t, c.StateDir, "/a/c") }},
		{name: "hvf on macOS", in: `{"accel":"hvf"}`, goos: "darwin", check: func(t *testing.T, c *Config) { assert.Equal(t, c.Accel, "hvf") }},
		{name: "warm pool", in: `{"warm_pool":{"python":2,"node":0}}`, check: func(t *testing.T, c *Config) {
			assert.DeepEqual(t, c.WarmPool, map[string]int{"python": 2})
		}},
		{name: "snapshot templates not a bool", in: `{"snapshot_templates":"yes"}`, err: `key "snapshot_templates": want true or false`},
		{name: "snapshot templates size absurd", in: `{"snapshot_templates_max_mb":-5}`, err: `key "snapshot_templates_max_mb"`},
		{name: "warm pool negative", in: `{"warm_pool":{"python":-1}}`, err: `key "warm_pool.python": must be a whole number from 0 to 16`},
		{name: "warm pool absurd", in: `{"warm_pool":{"python":1000}}`, err: `key "warm_pool.python": must be a whole number from 0 to 16`},
		{name: "warm pool not a map", in: `{"warm_pool":["python"]}`, err: `key "warm_pool": must be a map`},
		{name: "unknown hypervisor", in: `{"hypervisor":"firecracker"}`, err: `key "hypervisor": "firecracker" is not one of auto, libkrun, qemu`},
		{name: "hypervisor not a string", in: `{"hypervisor":1}`, err: `key "hypervisor": must be a string, got a number`},
		{name: "unknown accel", in: `{"accel":"whpx"}`, err: `key "accel"`},
		{name: "hvf on Linux", in: `{"accel":"hvf"}`, err: `hvf is macOS's hypervisor`},
		{name: "kvm on macOS", in: `{"accel":"kvm"}`, goos: "darwin", err: `kvm is Linux's hypervisor`},
		{name: "libkrun cannot emulate", in: `{"hypervisor":"libkrun","accel":"tcg"}`, err: `libkrun runs on the host's hypervisor`},
		{name: "relative path", in: `{"kernel":"vmlinuz"}`, err: `key "kernel": "vmlinuz" is not an absolute path`},
		{name: "comma in a path", in: `{"cache_dir":"/a,b"}`, err: `holds a comma`},
		{name: "NUL in a path", in: `{"agent_path":"/a\u0000b"}`, err: `NUL`},
		{name: "state_dir too long", in: `{"state_dir":"/` + strings.Repeat("d", 60) + `"}`, err: `too long`},
		{name: "state_dir is cache_dir", in: `{"state_dir":"/x","cache_dir":"/x"}`, err: `must differ from cache_dir`},
		{name: "boot timeout zero", in: `{"boot_timeout_ms":0}`, err: `from 1 to 3600000`},
		{name: "boot timeout fraction", in: `{"boot_timeout_ms":1.5}`, err: `whole number`},
		{name: "boot timeout too long", in: `{"boot_timeout_ms":3600001}`, err: `from 1 to 3600000`},
		{name: "boot timeout negative", in: `{"boot_timeout_ms":-1}`, err: `whole number`},
		{name: "adopt grace over a day", in: `{"adopt_grace_ms":86400001}`, err: `adopt_grace_ms`},
		{name: "adopt grace off", in: `{"adopt_grace_ms":0}`, check: func(t *testing.T, c *Config) { assert.Equal(t, c.AdoptGrace, time.Duration(0)) }},
		{name: "mirrors not a map", in: `{"registry_mirrors":["a"]}`, err: `must be a map`},
		{name: "mirror not a string", in: `{"registry_mirrors":{"docker.io":1}}`, err: `registry_mirrors.docker.io`},
		{name: "mirror host with a slash", in: `{"registry_mirrors":{"a/b":"http://x"}}`, err: `not a registry host`},
		{name: "unknown key", in: `{"vcpus":2}`, err: `not a sandbox-libkrun key`},
		{name: "network_allow_cidrs", in: `{"network_allow_cidrs":["10.1.0.0/16"," 192.168.7.9/24","fd00::/8"]}`, check: func(t *testing.T, c *Config) {
			assert.DeepEqual(t, c.NetworkAllowCIDRs, []string{"10.1.0.0/16", "192.168.7.0/24", "fd00::/8"})
		}},
		{name: "allow loopback", in: `{"network_allow_cidrs":["127.0.0.0/8"]}`, err: `key "network_allow_cidrs": item 0 "127.0.0.0/8" overlaps 127.0.0.0/8 (loopback)`},
		{name: "allow everything", in: `{"network_allow_cidrs":["0.0.0.0/0"]}`, err: `(unspecified), which a guest never reaches`},
		{name: "allow metadata", in: `{"network_allow_cidrs":["169.254.169.254/32"]}`, err: `link-local`},
		{name: "allow v6 loopback", in: `{"network_allow_cidrs":["::1/128"]}`, err: `loopback`},
		{name: "allow not a CIDR", in: `{"network_allow_cidrs":["10.0.0.1"]}`, err: `not a CIDR`},
		{name: "allow not a list", in: `{"network_allow_cidrs":"10.0.0.0/8"}`, err: `must be a list of CIDRs`},
		{name: "allow item not a string", in: `{"network_allow_cidrs":[10]}`, err: `item 0 must be a string`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			goos := tc.goos
			if goos == "" {
				goos = "linux"
			}
			cfg, err := ParseConfig(keysOf(t, tc.in), "/home/u", goos)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			tc.check(t, cfg)
		})
	}
}

func TestParseConfigNoHome(t *testing.T) {
	_, err := ParseConfig(nil, "", "linux")
	assert.ErrorContains(t, err, "no home directory")
	_, err = ParseConfig(keysOf(t, `{"kernel":"~/k","state_dir":"/s","cache_dir":"/c"}`), "", "linux")
	assert.ErrorContains(t, err, "no home directory")
	cfg, err := ParseConfig(keysOf(t, `{"state_dir":"/s","cache_dir":"/c"}`), "", "linux")
	assert.NilError(t, err)
	assert.Equal(t, cfg.StateDir, "/s")
}

// The longest state_dir accepted still leaves the socket path under the
// unix limit.
func TestStateDirLimit(t *testing.T) {
	for n := 1; n < 80; n++ {
		dir := "/" + strings.Repeat("d", n-1)
		_, err := ParseConfig(keysOf(t, `{"state_dir":"`+dir+`"}`), "/home/u", "linux")
		sock := len(dir) + 1 + 36 + 1 + len("exec.sock")
		assert.Check(t, (err == nil) == (sock < 100), "state_dir of %d bytes: %v", n, err)
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"hypervisor":"qemu","accel":"tcg","state_dir":"~/s","boot_timeout_ms":10}`))
	f.Add([]byte(`{"registry_mirrors":{"docker.io":"http://127.0.0.1:1"}}`))
	f.Add([]byte(`{"kernel":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var keys map[string]json.RawMessage
		if json.Unmarshal(b, &keys) != nil {
			return
		}
		cfg, err := ParseConfig(keys, "/home/u", "linux")
		if err != nil {
			return
		}
		for _, p := range []string{cfg.StateDir, cfg.CacheDir, cfg.Kernel, cfg.QEMUBinary, cfg.AgentPath, cfg.LibkrunPath} {
			if p != "" && (p[0] != '/' || strings.ContainsAny(p, ",\x00")) {
				t.Fatalf("accepted path %q", p)
			}
		}
		if cfg.BootTimeout <= 0 {
			t.Fatalf("boot timeout %v", cfg.BootTimeout)
		}
	})
}

func TestCheckWarmPool(t *testing.T) {
	catalog := []contract.CatalogImage{{Name: "python"}, {Name: "node"}}
	allowed := func(n string) bool { return n == "python" }
	assert.NilError(t, CheckWarmPool(map[string]int{"python": 1}, catalog, allowed))
	assert.ErrorContains(t, CheckWarmPool(map[string]int{"ruby": 1}, catalog, allowed), `key "warm_pool.ruby": "ruby" is not a catalog image`)
	assert.ErrorContains(t, CheckWarmPool(map[string]int{"node": 1}, catalog, allowed), `key "warm_pool.node": image "node" is not on the image_allowlist`)
}

// rawKeys is m as the kit hands the adapter its keys.
func rawKeys(t *testing.T, m map[string]any) map[string]json.RawMessage {
	t.Helper()
	out := map[string]json.RawMessage{}
	for k, v := range m {
		b, err := json.Marshal(v)
		assert.NilError(t, err)
		out[k] = b
	}
	return out
}

func TestParseHostRoots(t *testing.T) {
	cfg, err := ParseConfig(rawKeys(t, map[string]any{"host_roots": []any{"/srv/a/", "~/proj"}, "worker_disk_mb": 1024}), "/home/u", "linux")
	assert.NilError(t, err)
	assert.DeepEqual(t, cfg.HostRoots, []string{"/srv/a", "/home/u/proj"})
	assert.Equal(t, cfg.WorkerDiskMB, uint64(1024))
	for _, bad := range []map[string]any{
		{"host_roots": "/srv"},
		{"host_roots": []any{"relative"}},
		{"host_roots": []any{1}},
		{"worker_disk_mb": 1},
	} {
		_, err := ParseConfig(rawKeys(t, bad), "/home/u", "linux")
		assert.Check(t, err != nil, "%v", bad)
	}
}
