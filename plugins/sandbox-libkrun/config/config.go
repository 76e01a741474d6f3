// Package config is the sandbox-libkrun adapter's configuration: its keys,
// their defaults and the checks ParseConfig runs on them. It depends on
// nothing else of the adapter, so the boot pipeline, the worker VMs and the
// adapter all read one Config.
package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/consolelog"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/runner"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/usernet"
)

// The adapter's own configuration keys (the kit owns the contract's).
const (
	KeyHypervisor      = "hypervisor"
	KeyAccel           = "accel"
	KeyKernel          = "kernel"
	KeyQEMUBinary      = "qemu_binary"
	KeyLibkrunPath     = "libkrun_path"
	KeyAgentPath       = "agent_path"
	KeyStateDir        = "state_dir"
	KeyCacheDir        = "cache_dir"
	KeyRegistryMirrors = "registry_mirrors"
	KeyBootTimeoutMS   = "boot_timeout_ms"
	// KeyNetworkAllowCIDRs opens private ranges to guests with network
	// (docs/sandbox-libkrun.md, "Network").
	KeyNetworkAllowCIDRs = "network_allow_cidrs"
	// Worker VMs (worker::*, docs/vm-workers.md).
	KeyHostRoots    = "host_roots"
	KeyWorkerDiskMB = "worker_disk_mb"
	// KeyWarmPool keeps booted VMs ready per image ({image: count}, see
	// boot/pool.go and docs/sandbox-libkrun.md, "Warm pool").
	KeyWarmPool = "warm_pool"
	// KeySnapshotTemplates and KeySnapshotTemplatesMaxMB: boot each
	// image and shape once, save it, and restore later creates from it
	// (boot/templates.go, docs/sandbox-libkrun.md, "Snapshot templates").
	KeySnapshotTemplates      = "snapshot_templates"
	KeySnapshotTemplatesMaxMB = "snapshot_templates_max_mb"
	// KeyNetworkDNSServers are the nameservers the guests' DNS service
	// asks (docs/sandbox-libkrun.md, "Network"); default the host's.
	KeyNetworkDNSServers = "network_dns_servers"
	// KeyConsoleLogMaxKB caps each VM's console log on disk
	// (docs/sandbox-libkrun.md, "The runner and the state directory").
	KeyConsoleLogMaxKB = "console_log_max_kb"
	// KeyAdoptGraceMS is how long a sandbox's VM outlives its adapter,
	// waiting for the next adapter process to adopt it (adapter/adopt.go,
	// docs/sandbox-libkrun.md, "Sandboxes outlive the adapter"); 0 ends
	// every VM with its adapter.
	KeyAdoptGraceMS = "adopt_grace_ms"
)

// DefaultAdoptGrace covers an adapter restart by the plugin host, an
// upgrade and an engine restart, with room for a slow host; a user who
// stops the engine for good gets their VMs back after this long.
const DefaultAdoptGrace = 60 * time.Second

// maxAdoptGraceMS is a day: a VM nobody can reach for longer is a leak.
const maxAdoptGraceMS = 86_400_000

// maxDNSServers is how many nameservers network_dns_servers may name.
const maxDNSServers = 3

// DefaultSnapshotTemplatesMaxMB bounds the templates' disk use by default.
const DefaultSnapshotTemplatesMaxMB = 4096

// maxWarmPoolPerImage bounds one image's warm pool: every pooled VM holds
// its memory for as long as the adapter runs, so more is a mistake, not a
// setting.
const maxWarmPoolPerImage = 16

// ConfigKeys lists the adapter's own keys, for sandboxkit.Options.
func ConfigKeys() []string {
	return []string{
		KeyHypervisor, KeyAccel, KeyKernel, KeyQEMUBinary, KeyLibkrunPath, KeyAgentPath,
		KeyStateDir, KeyCacheDir, KeyRegistryMirrors, KeyBootTimeoutMS,
		KeyHostRoots, KeyWorkerDiskMB, KeyNetworkAllowCIDRs, KeyWarmPool,
		KeySnapshotTemplates, KeySnapshotTemplatesMaxMB, KeyNetworkDNSServers, KeyConsoleLogMaxKB,
		KeyAdoptGraceMS,
	}
}

// Choices of hypervisor and accel.
const (
	Auto = "auto"
)

// DefaultBootTimeout bounds a boot to the agent's hello. Under TCG a boot
// takes about 2 s on an idle host; several concurrent boots on a loaded
// two-core host take a good deal longer, and a cold image adds nothing
// here (it is installed before the VM starts).
const DefaultBootTimeout = 60 * time.Second

// maxBootTimeoutMS is an hour: longer is a mistake, not a setting.
const maxBootTimeoutMS = 3_600_000

// Config is the adapter's own configuration, defaults applied.
type Config struct {
	// Hypervisor is auto, libkrun or qemu.
	Hypervisor string
	// Accel is auto, kvm, hvf or tcg.
	Accel string
	// Kernel is the guest kernel; empty means the newest one FindKernel
	// finds under /boot.
	Kernel string
	// QEMUBinary is the emulator; empty means qemu-system-<arch> on PATH.
	QEMUBinary string
	// LibkrunPath is libkrun's shared library; empty means the default
	// search.
	LibkrunPath string
	// AgentPath is the guest agent binary; empty means beside the adapter,
	// then ~/.iii/lib.
	AgentPath string
	// StateDir holds one directory per VM (default ~/.iii/sandbox).
	StateDir string
	// CacheDir holds images and initramfs archives (default ~/.iii/cache).
	CacheDir string
	// RegistryMirrors maps registry hosts to mirror base URLs.
	RegistryMirrors map[string]string
	// BootTimeout bounds a boot to the agent's hello.
	BootTimeout time.Duration
	// HostRoots are the directories worker VMs may copy from (absolute,
	// as configured; resolved when the adapter starts).
	HostRoots []string
	// WorkerDiskMB is the size of a new worker VM's persistent disk.
	WorkerDiskMB uint64
	// NetworkAllowCIDRs are private ranges VMs with network may reach,
	// in canonical form; loopback, link-local, unspecified and the host's
	// own addresses are never reachable.
	NetworkAllowCIDRs []string
	// WarmPool is how many booted VMs to keep ready per image name (only
	// counts above zero are kept). The names are checked against the
	// catalog and the allowlist when the provider is configured.
	WarmPool map[string]int
	// SnapshotTemplates turns snapshot templates on (QEMU back end);
	// SnapshotTemplatesMaxMB bounds the disk they take under
	// state_dir/templates (least recently used go first).
	SnapshotTemplates      bool
	SnapshotTemplatesMaxMB uint64
	// NetworkDNSServers are the nameservers ("ip" or "ip:port") the
	// guests' DNS service asks; empty means the host's /etc/resolv.conf.
	NetworkDNSServers []string
	// ConsoleLogMaxBytes caps each VM's console log on disk (console.log
	// and console.log.1 together); 0 means consolelog.DefaultMaxBytes.
	ConsoleLogMaxBytes int64
	// AdoptGrace is how long a sandbox's runner keeps its VM after the
	// adapter went, for the next adapter to adopt; 0: not at all.
	AdoptGrace time.Duration
}

// ConfigError is a rejected key.
type ConfigError struct {
	Key    string
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("key %q: %s", e.Key, e.Reason)
}

// Err is a ConfigError for key, its reason formatted.
func Err(key, format string, args ...any) error {
	return &ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// SandboxDirLen is the length of a sandbox's state directory name (a UUID).
const SandboxDirLen = 36

// ParseConfig reads the adapter's keys fail-closed: a key of the wrong type,
// an unknown choice, a relative path or a combination that cannot work is
// an error naming the key. home expands a leading "~/" in paths; goos is
// the host OS the choices are checked against.
func ParseConfig(keys map[string]json.RawMessage, home, goos string) (*Config, error) {
	cfg := &Config{
		Hypervisor:      Auto,
		Accel:           Auto,
		RegistryMirrors: map[string]string{},
		BootTimeout:     DefaultBootTimeout,
		AdoptGrace:      DefaultAdoptGrace,
		WorkerDiskMB:    DefaultWorkerDiskMB,
		WarmPool:        map[string]int{},

		SnapshotTemplates:      true,
		SnapshotTemplatesMaxMB: DefaultSnapshotTemplatesMaxMB,
	}
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, key := range names {
		v := bytes.TrimSpace(keys[key])
		if string(v) == "null" {
			continue
		}
		var err error
		switch key {
		case KeyHypervisor:
			cfg.Hypervisor, err = parseChoice(key, v, Auto, backend.Libkrun, backend.QEMU)
		case KeyAccel:
			cfg.Accel, err = parseChoice(key, v, Auto, backend.AccelKVM, backend.AccelHVF, backend.AccelTCG)
		case KeyKernel:
			cfg.Kernel, err = parsePath(key, v, home)
		case KeyQEMUBinary:
			cfg.QEMUBinary, err = parsePath(key, v, home)
		case KeyLibkrunPath:
			cfg.LibkrunPath, err = parsePath(key, v, home)
		case KeyAgentPath:
			cfg.AgentPath, err = parsePath(key, v, home)
		case KeyStateDir:
			cfg.StateDir, err = parsePath(key, v, home)
		case KeyCacheDir:
			cfg.CacheDir, err = parsePath(key, v, home)
		case KeyRegistryMirrors:
			cfg.RegistryMirrors, err = parseMirrors(key, v)
		case KeyHostRoots:
			cfg.HostRoots, err = parseHostRoots(key, v, home)
		case KeyNetworkAllowCIDRs:
			cfg.NetworkAllowCIDRs, err = parseAllowCIDRs(key, v)
		case KeyWarmPool:
			cfg.WarmPool, err = parseWarmPool(key, v)
		case KeyNetworkDNSServers:
			cfg.NetworkDNSServers, err = parseDNSServers(key, v)
		case KeyConsoleLogMaxKB:
			var kb uint64
			kb, err = parseUint(key, v, consolelog.MinMaxBytes>>10, consolelog.MaxMaxBytes>>10)
			cfg.ConsoleLogMaxBytes = int64(kb) << 10
		case KeySnapshotTemplates:
			if uerr := json.Unmarshal(v, &cfg.SnapshotTemplates); uerr != nil {
				err = Err(key, "want true or false")
			}
		case KeySnapshotTemplatesMaxMB:
			cfg.SnapshotTemplatesMaxMB, err = parseUint(key, v, 0, 1<<20)
		case KeyWorkerDiskMB:
			cfg.WorkerDiskMB, err = parseUint(key, v, minWorkerDiskMB, maxWorkerDiskMB)
		case KeyBootTimeoutMS:
			var ms uint64
			ms, err = parseUint(key, v, 1, maxBootTimeoutMS)
			cfg.BootTimeout = time.Duration(ms) * time.Millisecond
		case KeyAdoptGraceMS:
			var ms uint64
			ms, err = parseUint(key, v, 0, maxAdoptGraceMS)
			cfg.AdoptGrace = time.Duration(ms) * time.Millisecond
		default:
			err = Err(key, "not a sandbox-libkrun key")
		}
		if err != nil {
			return nil, err
		}
	}
	if home == "" && (cfg.StateDir == "" || cfg.CacheDir == "") {
		return nil, Err(KeyStateDir, "no home directory to put the default state_dir and cache_dir in; set both")
	}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(home, ".iii", "sandbox")
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = filepath.Join(home, ".iii", "cache")
	}
	if err := cfg.check(goos); err != nil {
		return nil, err
	}
	return cfg, nil
}

// check refuses combinations that cannot work on goos.
func (c *Config) check(goos string) error {
	switch {
	case c.Accel == backend.AccelHVF && goos != "darwin":
		return Err(KeyAccel, "hvf is macOS's hypervisor; on %s use auto, kvm or tcg", goos)
	case c.Accel == backend.AccelKVM && goos != "linux":
		return Err(KeyAccel, "kvm is Linux's hypervisor; on %s use auto, hvf or tcg", goos)
	case c.Hypervisor == backend.Libkrun && c.Accel == backend.AccelTCG:
		return Err(KeyAccel, "libkrun runs on the host's hypervisor (kvm or hvf) and cannot emulate; use hypervisor: qemu for tcg")
	}
	// The agent socket lives at <state_dir>/<sandbox id>/exec.sock and
	// must fit a unix socket address.
	sock := len(c.StateDir) + 1 + SandboxDirLen + 1 + len(backend.SocketName)
	if sock >= backend.MaxSocketPath {
		return Err(KeyStateDir, "%s is too long: VM sockets under it would be %d bytes, and unix sockets allow fewer than %d; use a path of at most %d bytes",
			c.StateDir, sock, backend.MaxSocketPath, backend.MaxSocketPath-1-SandboxDirLen-2-len(backend.SocketName))
	}
	if c.StateDir == c.CacheDir {
		return Err(KeyStateDir, "must differ from cache_dir: stale VM directories in state_dir are removed at start")
	}
	return nil
}

func parseChoice(key string, v json.RawMessage, choices ...string) (string, error) {
	s, err := parseString(key, v)
	if err != nil {
		return "", err
	}
	if !slices.Contains(choices, s) {
		return "", Err(key, "%q is not one of %s", truncate(s, 40), strings.Join(choices, ", "))
	}
	return s, nil
}

func parseString(key string, v json.RawMessage) (string, error) {
	var s string
	if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil {
		return "", Err(key, "must be a string, got %s", kind(v))
	}
	return s, nil
}

// parsePath reads an absolute path; "~/" at its start is the home
// directory. Relative paths are refused: the adapter's working directory is
// whatever the engine's was, which nobody configuring it can rely on.
func parsePath(key string, v json.RawMessage, home string) (string, error) {
	s, err := parseString(key, v)
	if err != nil {
		return "", err
	}
	if strings.ContainsAny(s, "\x00\n") {
		return "", Err(key, "holds a NUL or newline")
	}
	if rest, ok := strings.CutPrefix(s, "~/"); ok {
		if home == "" {
			return "", Err(key, "%q starts with ~/ but there is no home directory", s)
		}
		s = filepath.Join(home, rest)
	}
	if !filepath.IsAbs(s) {
		return "", Err(key, "%q is not an absolute path (a leading ~/ means the home directory)", truncate(s, 80))
	}
	// QEMU's option syntax splits on commas, so no path the VM uses may
	// hold one.
	if strings.Contains(s, ",") {
		return "", Err(key, "%q holds a comma, which QEMU options cannot carry", truncate(s, 80))
	}
	return filepath.Clean(s), nil
}

func parseUint(key string, v json.RawMessage, minimum, maximum uint64) (uint64, error) {
	s := string(v)
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, Err(key, "must be a whole number from %d to %d, got %s", minimum, maximum, kind(v))
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n < minimum || n > maximum {
		return 0, Err(key, "must be a whole number from %d to %d, got %s", minimum, maximum, truncate(s, 24))
	}
	return n, nil
}

// parseAllowCIDRs reads network_allow_cidrs: a list of CIDRs, none of
// which may name loopback, link-local, unspecified or multicast addresses.
func parseAllowCIDRs(key string, v json.RawMessage) ([]string, error) {
	if len(v) == 0 || v[0] != '[' {
		return nil, Err(key, "must be a list of CIDRs such as [\"192.168.10.0/24\"], got %s", kind(v))
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil {
		return nil, Err(key, "must be a list of CIDRs: %v", err)
	}
	items := make([]string, 0, len(raw))
	for i, r := range raw {
		s, err := parseString(key, r)
		if err != nil {
			return nil, Err(key, "item %d must be a string, got %s", i, kind(r))
		}
		items = append(items, s)
	}
	prefixes, err := usernet.ParseAllowCIDRs(items)
	if err != nil {
		return nil, Err(key, "%v", err)
	}
	out := make([]string, len(prefixes))
	for i, p := range prefixes {
		out[i] = p.String()
	}
	return out, nil
}

// parseDNSServers reads network_dns_servers: a list of at most
// maxDNSServers nameservers, each "ip" or "ip:port".
func parseDNSServers(key string, v json.RawMessage) ([]string, error) {
	if len(v) == 0 || v[0] != '[' {
		return nil, Err(key, "must be a list of nameservers such as [\"192.0.2.53\"], got %s", kind(v))
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil {
		return nil, Err(key, "must be a list of nameservers: %v", err)
	}
	if len(raw) > maxDNSServers {
		return nil, Err(key, "names %d nameservers; at most %d are asked", len(raw), maxDNSServers)
	}
	out := make([]string, 0, len(raw))
	for i, r := range raw {
		s, err := parseString(key, r)
		if err != nil {
			return nil, Err(key, "item %d must be a string, got %s", i, kind(r))
		}
		ap, err := backend.ParseNameserver(strings.TrimSpace(s))
		if err != nil {
			return nil, Err(key, "item %d: %v", i, err)
		}
		out = append(out, ap.String())
	}
	return out, nil
}

// parseWarmPool reads {image name: count}, each count from 0 to
// maxWarmPoolPerImage; zero counts are dropped.
func parseWarmPool(key string, v json.RawMessage) (map[string]int, error) {
	if len(v) == 0 || v[0] != '{' {
		return nil, Err(key, "must be a map of image name to VM count such as {\"python\": 1}, got %s", kind(v))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil {
		return nil, Err(key, "must be a map of image name to VM count: %v", err)
	}
	out := make(map[string]int, len(raw))
	for name, c := range raw {
		sub := key + "." + name
		if name == "" {
			return nil, Err(key, "an image name is empty")
		}
		n, err := parseUint(sub, bytes.TrimSpace(c), 0, maxWarmPoolPerImage)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			out[name] = int(n)
		}
	}
	return out, nil
}

// CheckWarmPool refuses warm pool images the catalog does not have or
// the allowlist does not permit.
func CheckWarmPool(pool map[string]int, catalog []contract.CatalogImage, allowed func(string) bool) error {
	names := make([]string, 0, len(pool))
	for n := range pool {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !slices.ContainsFunc(catalog, func(c contract.CatalogImage) bool { return c.Name == n }) {
			return Err(KeyWarmPool+"."+n, "%q is not a catalog image", truncate(n, 40))
		}
		if !allowed(n) {
			return Err(KeyWarmPool+"."+n, "image %q is not on the image_allowlist", truncate(n, 40))
		}
	}
	return nil
}

// parseMirrors reads {registry host: base URL}; the image store checks the
// URLs themselves when it opens.
func parseMirrors(key string, v json.RawMessage) (map[string]string, error) {
	if len(v) == 0 || v[0] != '{' {
		return nil, Err(key, "must be a map of registry host to mirror URL, got %s", kind(v))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil {
		return nil, Err(key, "must be a map of registry host to mirror URL: %v", err)
	}
	out := make(map[string]string, len(raw))
	for host, u := range raw {
		sub := key + "." + host
		if host == "" || strings.ContainsAny(host, " /\t\n\x00") {
			return nil, Err(sub, "%q is not a registry host such as docker.io or 127.0.0.1:5000", truncate(host, 40))
		}
		s, err := parseString(sub, bytes.TrimSpace(u))
		if err != nil {
			return nil, err
		}
		out[host] = s
	}
	return out, nil
}

func kind(v json.RawMessage) string {
	if len(v) == 0 {
		return "nothing"
	}
	switch v[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "a list"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// HostGOOS is the OS choices are checked against.
func HostGOOS() string { return runtime.GOOS }

// SandboxDirName is the state directory name of a sandbox.
func SandboxDirName(id string) (string, error) {
	if !runner.ValidDirName(id) || len(id) != SandboxDirLen {
		return "", fmt.Errorf("sandbox id %q is not a UUID", id)
	}
	return id, nil
}
