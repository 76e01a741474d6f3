package sandboxkit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/jsonkind"
)

// Configuration keys the kit owns (spec §7.3), plus reaper_tick_ms.
const (
	KeyImageAllowlist              = "image_allowlist"
	KeyCustomImages                = "custom_images"
	KeyAutoInstall                 = "auto_install"
	KeyDefaultCPUs                 = "default_cpus"
	KeyDefaultMemoryMB             = "default_memory_mb"
	KeyDefaultIdleTimeoutSecs      = "default_idle_timeout_secs"
	KeyMaxConcurrentSandboxes      = "max_concurrent_sandboxes"
	KeyMaxConcurrentExecPerSandbox = "max_concurrent_exec_per_sandbox"
	KeyMaxExecTimeoutMS            = "max_exec_timeout_ms"
	KeyPerImageCaps                = "per_image_caps"
	// KeyReaperTickMS sets how often the reaper looks for idle
	// sandboxes. It is not part of the upstream configuration; tests
	// shorten it so idle reaping happens within a test's patience.
	KeyReaperTickMS = "reaper_tick_ms"
	// KeyIdleAction is what the reaper does to an idle sandbox: "stop"
	// (the default) or "pause" (adapters whose sandboxes can pause).
	KeyIdleAction = "idle_action"
)

// DefaultReaperTick is how often the reaper runs unless reaper_tick_ms
// says otherwise.
const DefaultReaperTick = 10 * time.Second

// reservedImageNames may never be custom_images keys: the upstream catalog
// reserves them for its presets, so a configuration moved between adapters
// never changes what they mean.
var reservedImageNames = [...]string{"python", "node", "bash", "alpine"}

// KitConfigKeys returns the configuration keys the kit owns.
func KitConfigKeys() []string {
	return []string{
		KeyImageAllowlist, KeyCustomImages, KeyAutoInstall, KeyDefaultCPUs,
		KeyDefaultMemoryMB, KeyDefaultIdleTimeoutSecs, KeyMaxConcurrentSandboxes,
		KeyMaxConcurrentExecPerSandbox, KeyMaxExecTimeoutMS, KeyPerImageCaps, KeyReaperTickMS, KeyIdleAction,
	}
}

// ImageCaps are the per-image resource ceilings; zero means no ceiling.
type ImageCaps struct {
	MaxCPUs     uint32
	MaxMemoryMB uint32
}

// Config is an adapter's parsed configuration, with every default applied.
type Config struct {
	// ImageAllowlist is fail-closed: empty denies every image.
	ImageAllowlist []string
	// CustomImages maps extra catalog names to OCI references.
	CustomImages                map[string]string
	AutoInstall                 bool
	DefaultCPUs                 uint32
	DefaultMemoryMB             uint32
	DefaultIdleTimeoutSecs      uint64
	MaxConcurrentSandboxes      uint32
	MaxConcurrentExecPerSandbox uint32
	MaxExecTimeoutMS            uint64
	PerImageCaps                map[string]ImageCaps
	ReaperTick                  time.Duration
	// IdleAction is IdleStop or IdlePause.
	IdleAction string
}

// DefaultConfig is the configuration of an adapter given no keys at all.
func DefaultConfig() Config {
	return Config{
		CustomImages:                map[string]string{},
		AutoInstall:                 true,
		DefaultCPUs:                 contract.DefaultCPUs,
		DefaultMemoryMB:             contract.DefaultMemoryMB,
		DefaultIdleTimeoutSecs:      contract.DefaultIdleTimeoutSecs,
		MaxConcurrentSandboxes:      contract.DefaultMaxConcurrentSandboxes,
		MaxConcurrentExecPerSandbox: contract.DefaultMaxConcurrentExecPerSandbox,
		MaxExecTimeoutMS:            contract.DefaultMaxExecTimeoutMS,
		PerImageCaps:                map[string]ImageCaps{},
		ReaperTick:                  DefaultReaperTick,
		IdleAction:                  IdleStop,
	}
}

// ExecSlots is how many execs may run at once in one sandbox: the
// configured number, where 0 means 1 (not unlimited).
func (c *Config) ExecSlots() uint32 {
	return max(c.MaxConcurrentExecPerSandbox, 1)
}

// Allowed reports whether image may be used by create and run.
func (c *Config) Allowed(image string) bool {
	return slices.Contains(c.ImageAllowlist, image)
}

// ConfigError is a rejected configuration: the key at fault, and why.
type ConfigError struct {
	Key    string
	Reason string
}

func (e *ConfigError) Error() string {
	if e.Key == "" {
		return "invalid sandbox adapter configuration: " + e.Reason
	}
	return fmt.Sprintf("invalid sandbox adapter configuration: key %q: %s", e.Key, e.Reason)
}

func configErr(key, format string, args ...any) error {
	return &ConfigError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// ParseConfig reads an adapter's configuration (a JSON object) fail-closed:
// every key the kit owns is checked for its type and range, keys named in
// providerKeys are collected raw for the provider, and anything else is an
// error. The legacy wrapped shape {"sandbox": {...}} is refused with a
// message saying how to unwrap it. An empty or null document is the
// default configuration. presets are the provider's images, whose names
// custom_images may not take.
//
// A key whose value is null counts as absent: YAML "key:" with no value
// asks for the default.
func ParseConfig(raw []byte, presets []contract.CatalogImage, providerKeys []string) (*Config, map[string]json.RawMessage, error) {
	cfg := DefaultConfig()
	provider := map[string]json.RawMessage{}
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		return &cfg, provider, nil
	}
	fields, err := readObject(trimmed)
	if err != nil {
		return nil, nil, configErr("", "the configuration must be a JSON object of the adapter's keys: %v", err)
	}
	if v, ok := fields["sandbox"]; ok && !slices.Contains(providerKeys, "sandbox") && len(v) > 0 && v[0] == '{' {
		return nil, nil, configErr("sandbox", "the legacy wrapped shape {sandbox: {...}} is not accepted: move the keys inside `sandbox:` up one level, directly under the adapter's config_override")
	}

	kit := KitConfigKeys()
	for _, k := range providerKeys {
		if slices.Contains(kit, k) {
			return nil, nil, configErr(k, "the adapter declares it as a provider key, but the kit owns it; this is a bug in the adapter")
		}
	}
	var customRaw, capsRaw, allowRaw json.RawMessage
	for _, key := range sortedKeys(fields) {
		v := fields[key]
		if isNull(v) {
			continue
		}
		switch key {
		case KeyImageAllowlist:
			allowRaw = v
		case KeyCustomImages:
			customRaw = v
		case KeyPerImageCaps:
			capsRaw = v
		case KeyAutoInstall:
			cfg.AutoInstall, err = parseBool(key, v)
		case KeyDefaultCPUs:
			cfg.DefaultCPUs, err = parseU32(key, v, 1)
		case KeyDefaultMemoryMB:
			cfg.DefaultMemoryMB, err = parseU32(key, v, 1)
		case KeyDefaultIdleTimeoutSecs:
			cfg.DefaultIdleTimeoutSecs, err = parseU64(key, v, 1)
		case KeyMaxConcurrentSandboxes:
			cfg.MaxConcurrentSandboxes, err = parseU32(key, v, 1)
		case KeyMaxConcurrentExecPerSandbox:
			cfg.MaxConcurrentExecPerSandbox, err = parseU32(key, v, 0)
		case KeyMaxExecTimeoutMS:
			cfg.MaxExecTimeoutMS, err = parseU64(key, v, 1)
		case KeyIdleAction:
			cfg.IdleAction, err = parseIdleAction(key, v)
		case KeyReaperTickMS:
			var ms uint64
			ms, err = parseU64(key, v, 1)
			if err == nil && ms > uint64(24*time.Hour/time.Millisecond) {
				err = configErr(key, "must be at most one day (86400000), got %d", ms)
			}
			cfg.ReaperTick = time.Duration(ms) * time.Millisecond
		default:
			if slices.Contains(providerKeys, key) {
				provider[key] = v
				continue
			}
			err = configErr(key, "unknown key; this adapter accepts %s", strings.Join(knownKeys(providerKeys), ", "))
		}
		if err != nil {
			return nil, nil, err
		}
	}

	presetNames := map[string]bool{}
	for _, p := range presets {
		presetNames[p.Name] = true
	}
	if customRaw != nil {
		if cfg.CustomImages, err = parseCustomImages(customRaw, presetNames); err != nil {
			return nil, nil, err
		}
	}
	known := func(name string) bool { return presetNames[name] || cfg.CustomImages[name] != "" }
	if allowRaw != nil {
		if cfg.ImageAllowlist, err = parseAllowlist(allowRaw, known, knownImageNames(presets, cfg.CustomImages)); err != nil {
			return nil, nil, err
		}
	}
	if capsRaw != nil {
		if cfg.PerImageCaps, err = parseCaps(capsRaw, known); err != nil {
			return nil, nil, err
		}
	}
	return &cfg, provider, nil
}

func knownKeys(providerKeys []string) []string {
	keys := append(KitConfigKeys(), providerKeys...)
	sort.Strings(keys)
	return keys
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func isNull(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "null" }

// readObject reads one JSON object into its members, refusing duplicate
// keys (the last one would silently win) and trailing data.
func readObject(raw []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("got %s", jsonkind.Of(raw))
	}
	out := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, errors.New("object keys must be strings")
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("key %q: %v", key, err)
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("key %q appears twice", key)
		}
		out[key] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the object")
	}
	return out, nil
}

func parseBool(key string, v json.RawMessage) (bool, error) {
	switch string(bytes.TrimSpace(v)) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, configErr(key, "must be true or false, got %s", jsonkind.Of(v))
}

// parseUint reads a whole number: digits only, so 1.5, 1e3 and -1 are
// refused rather than rounded or wrapped.
func parseUint(key string, v json.RawMessage, bits int, minimum uint64) (uint64, error) {
	s := string(bytes.TrimSpace(v))
	limit := uint64(1)<<bits - 1
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		if jsonkind.Of(v) == "a number" {
			return 0, configErr(key, "must be a whole number from %d to %d, got %s", minimum, limit, truncate(s, 40))
		}
		return 0, configErr(key, "must be a whole number, got %s", jsonkind.Of(v))
	}
	n, err := strconv.ParseUint(s, 10, bits)
	if err != nil || n < minimum {
		return 0, configErr(key, "must be a whole number from %d to %d, got %s", minimum, limit, truncate(s, 40))
	}
	return n, nil
}

func parseU32(key string, v json.RawMessage, minimum uint64) (uint32, error) {
	n, err := parseUint(key, v, 32, minimum)
	return uint32(n), err
}

func parseU64(key string, v json.RawMessage, minimum uint64) (uint64, error) {
	// 63 bits: durations in milliseconds must fit a time.Duration.
	return parseUint(key, v, 63, minimum)
}

func parseString(key string, v json.RawMessage) (string, error) {
	v = bytes.TrimSpace(v)
	var s string
	if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil {
		return "", configErr(key, "must be a string, got %s", jsonkind.Of(v))
	}
	return s, nil
}

// validImageName: catalog names travel in requests and logs; keep them
// plain words.
func validImageName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for i, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			i > 0 && (c == '.' || c == '_' || c == '-')
		if !ok {
			return false
		}
	}
	return true
}

func parseCustomImages(raw json.RawMessage, presets map[string]bool) (map[string]string, error) {
	fields, err := readObject(raw)
	if err != nil {
		return nil, configErr(KeyCustomImages, "must be an object of image name to OCI reference: %v", err)
	}
	out := make(map[string]string, len(fields))
	for _, name := range sortedKeys(fields) {
		key := KeyCustomImages + "." + name
		if !validImageName(name) {
			return nil, configErr(key, "image names are 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit")
		}
		if slices.Contains(reservedImageNames[:], name) || presets[name] {
			return nil, configErr(key, "%q is a preset image name and cannot be redefined; pick another name", name)
		}
		ref, err := parseString(key, fields[name])
		if err != nil {
			return nil, err
		}
		if ref == "" || strings.ContainsAny(ref, " \t\r\n\x00") {
			return nil, configErr(key, "must be a non-empty OCI reference without spaces, such as docker.io/library/alpine:3.20")
		}
		out[name] = ref
	}
	return out, nil
}

// knownImageNames lists what an allowlist may name, for its error: the
// message names them itself, since sandbox::catalog::list answers S301
// while the adapter is down for a rejected configuration.
func knownImageNames(presets []contract.CatalogImage, custom map[string]string) string {
	var names []string
	for _, p := range presets {
		names = append(names, p.Name)
	}
	var customs []string
	for n := range custom {
		customs = append(customs, n)
	}
	slices.Sort(customs)
	s := "the presets are " + orNone(names)
	if len(customs) > 0 {
		s += " and the custom_images keys " + strings.Join(customs, ", ")
	}
	return s
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "(none)"
	}
	return strings.Join(names, ", ")
}

func parseAllowlist(raw json.RawMessage, known func(string) bool, names string) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	var items []json.RawMessage
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, configErr(KeyImageAllowlist, "must be a list of image names, got %s", jsonkind.Of(raw))
	}
	var out []string
	for i, it := range items {
		name, err := parseString(fmt.Sprintf("%s[%d]", KeyImageAllowlist, i), it)
		if err != nil {
			return nil, err
		}
		if !known(name) {
			return nil, configErr(fmt.Sprintf("%s[%d]", KeyImageAllowlist, i),
				"%q is neither a preset nor a custom_images key: %s", truncate(name, 64), names)
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out, nil
}

func parseCaps(raw json.RawMessage, known func(string) bool) (map[string]ImageCaps, error) {
	fields, err := readObject(raw)
	if err != nil {
		return nil, configErr(KeyPerImageCaps, "must be an object of image name to {max_cpus, max_memory_mb}: %v", err)
	}
	out := make(map[string]ImageCaps, len(fields))
	for _, name := range sortedKeys(fields) {
		key := KeyPerImageCaps + "." + name
		if !known(name) {
			return nil, configErr(key, "%q is neither a preset nor a custom_images key", truncate(name, 64))
		}
		inner, err := readObject(fields[name])
		if err != nil {
			return nil, configErr(key, "must be an object {max_cpus, max_memory_mb}: %v", err)
		}
		var caps ImageCaps
		for _, k := range sortedKeys(inner) {
			v := inner[k]
			if isNull(v) {
				continue
			}
			switch k {
			case "max_cpus":
				caps.MaxCPUs, err = parseU32(key+".max_cpus", v, 1)
			case "max_memory_mb":
				caps.MaxMemoryMB, err = parseU32(key+".max_memory_mb", v, 1)
			default:
				err = configErr(key+"."+k, "unknown key; a cap has max_cpus and max_memory_mb")
			}
			if err != nil {
				return nil, err
			}
		}
		out[name] = caps
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// buildCatalog lists the provider's presets in their order, then the
// custom images sorted by name.
func buildCatalog(presets []contract.CatalogImage, custom map[string]string) []contract.CatalogImage {
	out := make([]contract.CatalogImage, 0, len(presets)+len(custom))
	for _, p := range presets {
		out = append(out, contract.CatalogImage{Name: p.Name, OCIRef: p.OCIRef, Kind: contract.KindPreset})
	}
	for _, name := range sortedKeys(custom) {
		out = append(out, contract.CatalogImage{Name: name, OCIRef: custom[name], Kind: contract.KindCustom})
	}
	return out
}

// checkPresets refuses a provider whose presets would make the catalog
// ambiguous.
func checkPresets(presets []contract.CatalogImage) error {
	seen := map[string]bool{}
	for _, p := range presets {
		if !validImageName(p.Name) {
			return fmt.Errorf("the adapter's preset image name %q is not a plain name; this is a bug in the adapter", p.Name)
		}
		if seen[p.Name] {
			return fmt.Errorf("the adapter lists preset image %q twice; this is a bug in the adapter", p.Name)
		}
		seen[p.Name] = true
	}
	return nil
}

// parseIdleAction reads idle_action: "stop" or "pause".
func parseIdleAction(key string, v json.RawMessage) (string, error) {
	var a string
	if err := json.Unmarshal(v, &a); err != nil || (a != IdleStop && a != IdlePause) {
		return "", configErr(key, "must be %q or %q, got %s", IdleStop, IdlePause, jsonkind.Of(v))
	}
	return a, nil
}
