package sandboxkit

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func testPresets() []contract.CatalogImage {
	return []contract.CatalogImage{{Name: "python", OCIRef: "p:1"}, {Name: "node", OCIRef: "n:1"}, {Name: "shell", OCIRef: "s:1"}}
}

func TestParseConfigDefaults(t *testing.T) {
	for _, raw := range []string{"", "null", " {} ", `{"default_cpus": null}`} {
		cfg, prov, err := ParseConfig([]byte(raw), testPresets(), nil)
		assert.NilError(t, err, raw)
		assert.DeepEqual(t, *cfg, DefaultConfig())
		assert.Equal(t, len(prov), 0)
	}
	d := DefaultConfig()
	assert.Equal(t, d.DefaultCPUs, uint32(1))
	assert.Equal(t, d.DefaultMemoryMB, uint32(512))
	assert.Equal(t, d.DefaultIdleTimeoutSecs, uint64(300))
	assert.Equal(t, d.MaxConcurrentSandboxes, uint32(32))
	assert.Equal(t, d.MaxConcurrentExecPerSandbox, uint32(4))
	assert.Equal(t, d.MaxExecTimeoutMS, uint64(300000))
	assert.Equal(t, d.ReaperTick, 10*time.Second)
	assert.Check(t, d.AutoInstall)
	assert.Equal(t, len(d.ImageAllowlist), 0, "fail-closed: no image allowed by default")
}

func TestParseConfigValues(t *testing.T) {
	raw := `{
		"image_allowlist": ["python", "mine", "python"],
		"custom_images": {"mine": "example.org/mine:2", "other.img_1": "o:1"},
		"auto_install": false,
		"default_cpus": 2,
		"default_memory_mb": 1024,
		"default_idle_timeout_secs": 60,
		"max_concurrent_sandboxes": 8,
		"max_concurrent_exec_per_sandbox": 0,
		"max_exec_timeout_ms": 1000,
		"per_image_caps": {"python": {"max_cpus": 4}, "mine": {"max_memory_mb": 256, "max_cpus": null}},
		"reaper_tick_ms": 250,
		"idle_action": "pause",
		"provider_thing": {"x": [1]}
	}`
	cfg, prov, err := ParseConfig([]byte(raw), testPresets(), []string{"provider_thing", "unused"})
	assert.NilError(t, err)
	assert.DeepEqual(t, *cfg, Config{
		ImageAllowlist:              []string{"python", "mine"},
		CustomImages:                map[string]string{"mine": "example.org/mine:2", "other.img_1": "o:1"},
		AutoInstall:                 false,
		DefaultCPUs:                 2,
		DefaultMemoryMB:             1024,
		DefaultIdleTimeoutSecs:      60,
		MaxConcurrentSandboxes:      8,
		MaxConcurrentExecPerSandbox: 0,
		MaxExecTimeoutMS:            1000,
		PerImageCaps:                map[string]ImageCaps{"python": {MaxCPUs: 4}, "mine": {MaxMemoryMB: 256}},
		ReaperTick:                  250 * time.Millisecond,
		IdleAction:                  IdlePause,
	})
	assert.Equal(t, cfg.ExecSlots(), uint32(1))
	assert.DeepEqual(t, prov, map[string]json.RawMessage{"provider_thing": json.RawMessage(`{"x": [1]}`)})
}

func TestParseConfigRejects(t *testing.T) {
	tests := []struct {
		name, raw, key, reason string
		providerKeys           []string
	}{
		{"not an object", `[1]`, "", "must be a JSON object", nil},
		{"not JSON", `{"a":`, "", "must be a JSON object", nil},
		{"trailing data", `{} {}`, "", "trailing data", nil},
		{"duplicate key", `{"default_cpus": 1, "default_cpus": 2}`, "", "appears twice", nil},
		{"legacy wrapped shape", `{"sandbox": {"image_allowlist": ["python"]}}`, "sandbox", "legacy wrapped shape", nil},
		{"unknown key", `{"image_allow_list": []}`, "image_allow_list", "unknown key", nil},
		{"provider key shadows a kit key", `{}`, "default_cpus", "kit owns it", []string{"default_cpus"}},
		{"bool of the wrong type", `{"auto_install": "yes"}`, "auto_install", "true or false", nil},
		{"number as a string", `{"default_cpus": "2"}`, "default_cpus", "whole number", nil},
		{"fraction", `{"default_cpus": 1.5}`, "default_cpus", "whole number from 1", nil},
		{"exponent", `{"max_exec_timeout_ms": 1e3}`, "max_exec_timeout_ms", "whole number", nil},
		{"negative", `{"default_memory_mb": -1}`, "default_memory_mb", "whole number", nil},
		{"zero cpus", `{"default_cpus": 0}`, "default_cpus", "from 1", nil},
		{"zero sandboxes", `{"max_concurrent_sandboxes": 0}`, "max_concurrent_sandboxes", "from 1", nil},
		{"u32 overflow", `{"default_cpus": 4294967296}`, "default_cpus", "to 4294967295", nil},
		{"huge reaper tick", `{"reaper_tick_ms": 90000000}`, "reaper_tick_ms", "at most one day", nil},
		{"allowlist not a list", `{"image_allowlist": "python"}`, "image_allowlist", "list of image names", nil},
		{"allowlist item not a string", `{"image_allowlist": [1]}`, "image_allowlist[0]", "must be a string", nil},
		{"allowlist names nothing", `{"image_allowlist": ["python", "ruby"]}`, "image_allowlist[1]", "neither a preset nor a custom_images key: the presets are python, node, shell", nil},
		{"allowlist names nothing, with custom images", `{"custom_images": {"zz": "r/zz:1", "aa": "r/aa:1"}, "image_allowlist": ["ruby"]}`, "image_allowlist[0]",
			`"ruby" is neither a preset nor a custom_images key: the presets are python, node, shell and the custom_images keys aa, zz`, nil},
		{"custom not an object", `{"custom_images": ["a"]}`, "custom_images", "object of image name", nil},
		{"custom redefines a reserved name", `{"custom_images": {"alpine": "a:1"}}`, "custom_images.alpine", "preset image name", nil},
		{"custom redefines bash", `{"custom_images": {"bash": "a:1"}}`, "custom_images.bash", "preset image name", nil},
		{"custom redefines a provider preset", `{"custom_images": {"shell": "a:1"}}`, "custom_images.shell", "preset image name", nil},
		{"custom name with a slash", `{"custom_images": {"a/b": "a:1"}}`, "custom_images.a/b", "image names are", nil},
		{"custom empty ref", `{"custom_images": {"a": ""}}`, "custom_images.a", "non-empty OCI reference", nil},
		{"custom ref with a space", `{"custom_images": {"a": "x y"}}`, "custom_images.a", "non-empty OCI reference", nil},
		{"custom ref not a string", `{"custom_images": {"a": 1}}`, "custom_images.a", "must be a string", nil},
		{"caps for an unknown image", `{"per_image_caps": {"ruby": {"max_cpus": 1}}}`, "per_image_caps.ruby", "neither a preset", nil},
		{"caps not an object", `{"per_image_caps": {"python": 3}}`, "per_image_caps.python", "must be an object", nil},
		{"caps unknown key", `{"per_image_caps": {"python": {"max_gpus": 1}}}`, "per_image_caps.python.max_gpus", "unknown key", nil},
		{"caps zero", `{"per_image_caps": {"python": {"max_cpus": 0}}}`, "per_image_caps.python.max_cpus", "from 1", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ParseConfig([]byte(tc.raw), testPresets(), tc.providerKeys)
			var ce *ConfigError
			assert.Assert(t, errors.As(err, &ce), "got %v", err)
			assert.Equal(t, ce.Key, tc.key)
			assert.Check(t, is.Contains(ce.Reason, tc.reason))
			assert.Check(t, is.Contains(err.Error(), "invalid sandbox adapter configuration"))
		})
	}
}

func TestParseConfigProviderMayOwnSandboxKey(t *testing.T) {
	_, prov, err := ParseConfig([]byte(`{"sandbox": {"x": 1}}`), testPresets(), []string{"sandbox"})
	assert.NilError(t, err)
	assert.Equal(t, string(prov["sandbox"]), `{"x": 1}`)
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"image_allowlist":["python"],"custom_images":{"a":"b:1"},"per_image_caps":{"a":{"max_cpus":2}}}`))
	f.Add([]byte(`{"sandbox":{}}`))
	f.Add([]byte(`{"default_cpus":1e2,"x":null}`))
	f.Add([]byte(`{"reaper_tick_ms":18446744073709551615}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		cfg, _, err := ParseConfig(raw, testPresets(), []string{"p"})
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		catalog := buildCatalog(testPresets(), cfg.CustomImages)
		for _, name := range cfg.ImageAllowlist {
			if !slices.ContainsFunc(catalog, func(c contract.CatalogImage) bool { return c.Name == name }) {
				t.Fatalf("allowlist names %q, which is not in the catalog", name)
			}
		}
		if cfg.DefaultCPUs == 0 || cfg.MaxConcurrentSandboxes == 0 || cfg.ReaperTick <= 0 || cfg.ExecSlots() == 0 {
			t.Fatalf("a zero limit was accepted: %+v", cfg)
		}
		if !bytes.Contains(raw, []byte("{")) && len(bytes.TrimSpace(raw)) > 0 && string(bytes.TrimSpace(raw)) != "null" {
			t.Fatalf("accepted a non-object %q", raw)
		}
	})
}

func TestOutputBuffer(t *testing.T) {
	var b OutputBuffer
	n, err := b.Write(bytes.Repeat([]byte("a"), contract.ExecOutputCap-1))
	assert.NilError(t, err)
	assert.Equal(t, n, contract.ExecOutputCap-1)
	assert.Check(t, !b.Truncated())
	n, _ = b.Write([]byte("bcd"))
	assert.Equal(t, n, 3, "writes past the cap are accepted so the writer never blocks")
	assert.Check(t, b.Truncated())
	assert.Equal(t, len(b.Bytes()), contract.ExecOutputCap)
	assert.Equal(t, b.Bytes()[contract.ExecOutputCap-1], byte('b'))
	_, _ = b.Write([]byte("more"))
	assert.Equal(t, len(b.Bytes()), contract.ExecOutputCap)
}

func TestDurations(t *testing.T) {
	assert.Equal(t, durationOf(3, time.Second), 3*time.Second)
	assert.Equal(t, durationOf(1<<62, time.Second), time.Duration(1<<63-1))
	assert.Equal(t, addSat(time.Duration(1<<63-1), time.Second), time.Duration(1<<63-1))
	assert.Equal(t, addSat(time.Second, time.Second), 2*time.Second)
}
