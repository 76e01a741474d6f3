package sandboxkit

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
)

// reconfProvider is the fake provider with the Reconfigurer and
// KitConfigurer extensions: reconfErr is what Reconfigure answers.
type reconfProvider struct {
	*fakeProvider
	mu        sync.Mutex
	reconfErr error
	reconfs   []map[string]json.RawMessage
	kit       *Config
	kitCalls  int
}

func (p *reconfProvider) Reconfigure(_ context.Context, keys map[string]json.RawMessage) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reconfs = append(p.reconfs, keys)
	return p.reconfErr
}

func (p *reconfProvider) ConfigureKit(cfg *Config, _ []contract.CatalogImage) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.kit = cfg
	p.kitCalls++
}

func configJSON(t *testing.T, cfg map[string]any) []byte {
	t.Helper()
	if _, ok := cfg["image_allowlist"]; !ok {
		cfg["image_allowlist"] = []string{"python", "shell"}
	}
	raw, err := json.Marshal(cfg)
	assert.NilError(t, err)
	return raw
}

// TestReloadWhichKeys: every kit key reloads live; a provider key of a
// provider without Reconfigurer needs a restart, and then nothing changes.
func TestReloadWhichKeys(t *testing.T) {
	base := map[string]any{"max_concurrent_sandboxes": 2, "fake_key": 1}
	for _, tc := range []struct {
		name    string
		change  map[string]any
		restart []string // nil: reloads live
		reject  string   // a validation error
	}{
		{name: "nothing changed", change: map[string]any{}},
		{name: "max_concurrent_sandboxes", change: map[string]any{"max_concurrent_sandboxes": 5}},
		{name: "exec slots", change: map[string]any{"max_concurrent_exec_per_sandbox": 3}},
		{name: "max_exec_timeout_ms", change: map[string]any{"max_exec_timeout_ms": 1000}},
		{name: "allowlist", change: map[string]any{"image_allowlist": []string{"node"}}},
		{name: "custom images", change: map[string]any{"custom_images": map[string]any{"ruby": "r:1"}, "image_allowlist": []string{"ruby"}}},
		{name: "per_image_caps", change: map[string]any{"per_image_caps": map[string]any{"python": map[string]any{"max_cpus": 1}}}},
		{name: "defaults", change: map[string]any{"default_cpus": 2, "default_memory_mb": 256, "default_idle_timeout_secs": 60}},
		{name: "auto_install", change: map[string]any{"auto_install": false}},
		{name: "reaper tick", change: map[string]any{"reaper_tick_ms": 50}},
		{name: "same provider value, other spelling", change: map[string]any{"fake_key": json.RawMessage("1.0")}},
		{name: "provider key", change: map[string]any{"fake_key": 2}, restart: []string{"fake_key"}},
		{name: "provider key removed", change: map[string]any{"fake_key": nil}, restart: []string{"fake_key"}},
		{name: "provider key with a kit key", change: map[string]any{"fake_key": 2, "max_concurrent_sandboxes": 5}, restart: []string{"fake_key"}},
		{name: "invalid value", change: map[string]any{"max_concurrent_sandboxes": "many"}, reject: "max_concurrent_sandboxes"},
		{name: "unknown key", change: map[string]any{"nope": 1}, reject: "nope"},
		{name: "idle_action pause without pause", change: map[string]any{"idle_action": "pause"}, reject: "cannot be paused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := newManager(t, copyMap(base))
			before := create(t, m, &contract.CreateRequest{})
			next := copyMap(base)
			for k, v := range tc.change {
				if v == nil {
					delete(next, k)
					continue
				}
				next[k] = v
			}
			m.mu.Lock()
			old := *m.cfg
			m.mu.Unlock()
			err := m.Configure(ctx, configJSON(t, next))
			m.mu.Lock()
			now := *m.cfg
			m.mu.Unlock()
			switch {
			case tc.restart != nil:
				assert.Assert(t, contract.IsRestartRequired(err), "%v", err)
				var se *contract.Error
				assert.Assert(t, errors.As(err, &se))
				for _, k := range tc.restart {
					assert.Check(t, is.Contains(se.Message, k))
				}
				assert.DeepEqual(t, now, old)
			case tc.reject != "":
				assert.ErrorContains(t, err, tc.reject)
				assert.Check(t, !contract.IsRestartRequired(err))
				assert.DeepEqual(t, now, old)
			default:
				assert.NilError(t, err)
				want, _, perr := ParseConfig(configJSON(t, next), m.provider.Presets(), []string{"fake_key"})
				assert.NilError(t, perr)
				assert.DeepEqual(t, now, *want)
			}
			// Whatever happened, the sandbox created before is still
			// there and answers.
			_, err = m.Exec(ctx, &contract.ExecRequest{SandboxID: before, Argv: []string{"echo", "hi"}})
			assert.NilError(t, err)
		})
	}
}

func copyMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestReloadAppliesLimits: a raised max_concurrent_sandboxes lets the next
// create through; a lowered exec cap applies to a running sandbox.
func TestReloadAppliesLimits(t *testing.T) {
	m, _ := newManager(t, map[string]any{"max_concurrent_sandboxes": 1, "max_concurrent_exec_per_sandbox": 4})
	first := create(t, m, &contract.CreateRequest{})
	_, err := m.Create(ctx, &contract.CreateRequest{Image: "python"})
	assert.Equal(t, code(t, err), contract.S400)

	assert.NilError(t, m.Configure(ctx, configJSON(t, map[string]any{"max_concurrent_sandboxes": 2, "max_concurrent_exec_per_sandbox": 1})))
	create(t, m, &contract.CreateRequest{})
	list, err := m.List(ctx, &contract.ListRequest{})
	assert.NilError(t, err)
	assert.Equal(t, len(list.Sandboxes), 2)
	assert.Equal(t, list.Sandboxes[0].SandboxID, first)
	assert.Equal(t, list.Sandboxes[0].ExecSlotsFree, uint32(1), "the new exec cap applies to a running sandbox")
	info, err := m.Info(ctx)
	assert.NilError(t, err)
	assert.Equal(t, info.Facts["capacity"].(map[string]any)["max_sandboxes"], int64(2))
}

// TestReloadWithReconfigurer: the provider gets every reload and decides;
// its refusal changes nothing, and a KitConfigurer gets the previous kit
// configuration back.
func TestReloadWithReconfigurer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		restart bool
	}{
		{name: "accepted"},
		{name: "restart required", err: contract.RestartRequired([]string{"fake_key"}), restart: true},
		{name: "invalid", err: errors.New("fake_key must be small")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &reconfProvider{fakeProvider: newFakeProvider()}
			m := New(p, Options{Name: "fake", ProviderConfigKeys: []string{"fake_key"}})
			t.Cleanup(func() { assert.NilError(t, m.Shutdown(ctx)) })
			assert.NilError(t, m.Configure(ctx, configJSON(t, map[string]any{"fake_key": 1})))
			first := p.kit
			p.reconfErr = tc.err
			err := m.Configure(ctx, configJSON(t, map[string]any{"fake_key": 2, "max_concurrent_sandboxes": 9}))
			p.mu.Lock()
			defer p.mu.Unlock()
			assert.Equal(t, len(p.reconfs), 1)
			assert.DeepEqual(t, p.reconfs[0], map[string]json.RawMessage{"fake_key": json.RawMessage("2")})
			m.mu.Lock()
			maxN := m.cfg.MaxConcurrentSandboxes
			m.mu.Unlock()
			switch {
			case tc.err == nil:
				assert.NilError(t, err)
				assert.Equal(t, maxN, uint32(9))
				assert.Equal(t, p.kit.MaxConcurrentSandboxes, uint32(9))
				assert.Equal(t, p.kitCalls, 2)
			default:
				assert.Check(t, is.Equal(contract.IsRestartRequired(err), tc.restart), "%v", err)
				assert.ErrorContains(t, err, "fake_key")
				assert.Equal(t, maxN, contract.DefaultMaxConcurrentSandboxes)
				assert.Check(t, p.kit == first, "the previous kit configuration is handed back")
				assert.Equal(t, p.kitCalls, 3)
			}
		})
	}
}

// A KitConfigurer without Reconfigurer cannot hear of a kit change.
func TestReloadKitConfigurerNeedsRestart(t *testing.T) {
	p := &kitOnlyProvider{fakeProvider: newFakeProvider()}
	m := New(p, Options{Name: "fake"})
	t.Cleanup(func() { assert.NilError(t, m.Shutdown(ctx)) })
	assert.NilError(t, m.Configure(ctx, configJSON(t, map[string]any{})))
	assert.NilError(t, m.Configure(ctx, configJSON(t, map[string]any{})), "an unchanged configuration needs nothing")
	err := m.Configure(ctx, configJSON(t, map[string]any{"default_cpus": 2}))
	assert.Assert(t, contract.IsRestartRequired(err), "%v", err)
	assert.ErrorContains(t, err, "default_cpus")
}

type kitOnlyProvider struct{ *fakeProvider }

func (*kitOnlyProvider) ConfigureKit(*Config, []contract.CatalogImage) {}

func TestChangedKeys(t *testing.T) {
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	for _, tc := range []struct {
		a, b map[string]json.RawMessage
		want []string
	}{
		{nil, nil, nil},
		{map[string]json.RawMessage{"x": raw(`{"a":1,"b":2}`)}, map[string]json.RawMessage{"x": raw(`{ "b": 2, "a": 1 }`)}, nil},
		{map[string]json.RawMessage{"x": raw(`1`)}, map[string]json.RawMessage{"x": raw(`1.0`)}, nil},
		{map[string]json.RawMessage{"x": raw(`1`), "y": raw(`"a"`)}, map[string]json.RawMessage{"x": raw(`2`), "z": raw(`"a"`)}, []string{"x", "y", "z"}},
		{map[string]json.RawMessage{"x": raw(`[1,2]`)}, map[string]json.RawMessage{"x": raw(`[2,1]`)}, []string{"x"}},
	} {
		assert.DeepEqual(t, ChangedKeys(tc.a, tc.b), tc.want)
	}
}

func TestChangedKitKeys(t *testing.T) {
	a := DefaultConfig()
	b := DefaultConfig()
	assert.Check(t, is.Len(ChangedKitKeys(&a, &b), 0))
	b.ImageAllowlist = []string{}
	assert.Check(t, is.Len(ChangedKitKeys(&a, &b), 0), "nil and empty lists are the same")
	b.MaxConcurrentSandboxes++
	b.IdleAction = IdlePause
	assert.DeepEqual(t, ChangedKitKeys(&a, &b), []string{KeyMaxConcurrentSandboxes, KeyIdleAction})
}
