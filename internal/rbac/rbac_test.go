package rbac

import (
	"encoding/json"
	"testing"

	"gotest.tools/v3/assert"
)

func TestWildcard(t *testing.T) {
	for _, tc := range []struct {
		pattern, value string
		want           bool
	}{
		{"hello::world", "hello::world", true},
		{"hello::world", "hello::worl", false},
		{"engine::*", "engine::foo", true},
		{"engine::*", "engine::bar::baz", true},
		{"engine::*", "other::foo", false},
		{"*::public", "api::public", true},
		{"*::public", "api::private", false},
		{"*public*", "public", true},
		{"*public*", "mypublicfn", true},
		{"*public*", "private", false},
		{"*", "", true},
		{"api::*::read", "api::users::read", true},
		{"api::*::read", "api::users::write", false},
		{"a*a", "a", false},
		{"a*a", "aa", true},
		{"**", "x", true},
	} {
		assert.Equal(t, Wildcard(tc.pattern, tc.value), tc.want, "%q %q", tc.pattern, tc.value)
	}
}

func TestAllowed(t *testing.T) {
	expose := &Config{ExposeFunctions: []Filter{{Match: "api::*"}, {Match: "svc::*", Namespace: "orders"},
		{Metadata: map[string]any{"public": true}}}}
	alice := &Session{
		Namespaces:         map[string][]string{"orders": {"orders::*", `match("billing::get")`}},
		AllowedFunctions:   []string{"other::fn"},
		ForbiddenFunctions: []string{"api::secret", "engine::log::info"},
	}
	for _, tc := range []struct {
		name     string
		id, ns   string
		cfg      *Config
		s        *Session
		metadata string
		want     bool
	}{
		{"no rbac allows", "anything::x", "default", nil, Open(), "", true},
		{"no rbac still denies the forbidden", "api::secret", "default", nil, alice, "", false},
		{"exposed in default", "api::get", "default", expose, alice, "", true},
		{"rule without namespace is default only", "api::get", "orders", expose, alice, "", false},
		{"namespaced rule", "svc::get", "orders", expose, alice, "", true},
		{"namespaced rule elsewhere", "svc::get", "default", expose, alice, "", false},
		{"forbidden wins over expose", "api::secret", "default", expose, alice, "", false},
		{"forbidden wins over infrastructure", "engine::log::info", "default", expose, alice, "", false},
		{"infrastructure allowed", "engine::workers::register", "orders", expose, alice, "", true},
		{"discovery is not infrastructure", "engine::functions::list", "default", expose, alice, "", false},
		{"scoped grant", "orders::place", "orders", expose, alice, "", true},
		{"scoped grant wrapped", "billing::get", "orders", expose, alice, "", true},
		{"scoped grant only in its namespace", "orders::place", "default", expose, alice, "", false},
		{"unscoped grant in default", "other::fn", "default", expose, alice, "", true},
		{"unscoped grant not elsewhere", "other::fn", "orders", expose, alice, "", false},
		{"metadata rule", "x::y", "default", expose, alice, `{"public":true}`, true},
		{"metadata rule mismatch", "x::y", "default", expose, alice, `{"public":false}`, false},
		{"empty rules deny", "x::y", "default", &Config{}, Open(), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var meta json.RawMessage
			if tc.metadata != "" {
				meta = json.RawMessage(tc.metadata)
			}
			assert.Equal(t, Allowed(tc.id, tc.ns, tc.cfg, tc.s, meta), tc.want)
		})
	}
}

func TestDecodeAuthResult(t *testing.T) {
	s, err := DecodeAuthResult(json.RawMessage(`{}`))
	assert.NilError(t, err)
	assert.Assert(t, s.AllowFunctionRegistration, "registration defaults to allowed")
	assert.Assert(t, !s.AllowTriggerTypeRegistration)
	assert.Equal(t, string(s.Context), "{}")

	s, err = DecodeAuthResult(json.RawMessage(`{"namespaces":{"orders":["a::*"]},"allow_function_registration":false,"function_registration_prefix":"t1","context":{"u":1},"newer_field":true}`))
	assert.NilError(t, err)
	assert.Assert(t, !s.AllowFunctionRegistration)
	assert.Equal(t, s.FunctionRegistrationPrefix, "t1")
	assert.Assert(t, s.MayDeclare("orders") && !s.MayDeclare("default"))

	for _, bad := range []string{``, `null`, `[]`, `"x"`, `{"namespaces":{" ":[]}}`, `{"function_registration_prefix":" "}`, `{"allowed_functions":"x"}`} {
		_, err := DecodeAuthResult(json.RawMessage(bad))
		assert.Assert(t, err != nil, "%q", bad)
	}
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig([]byte(`{"auth_function_id":"a::b","expose_functions":["match(\"api::*\")","match('x::*')",{"match":"o::*","namespace":"orders"},{"metadata":{"tier":"match(\"gold*\")"}}]}`))
	assert.NilError(t, err)
	assert.Equal(t, len(c.ExposeFunctions), 4)
	assert.Assert(t, c.ExposeFunctions[1].Matches("x::y", "default", nil))
	assert.Assert(t, c.ExposeFunctions[3].Matches("z", "default", json.RawMessage(`{"tier":"golden"}`)))
	// It round-trips.
	raw, err := json.Marshal(c)
	assert.NilError(t, err)
	back, err := ParseConfig(raw)
	assert.NilError(t, err)
	assert.DeepEqual(t, back, c)

	for _, bad := range []string{`{"auth_function":"x"}`, `{"expose_functions":["api::*"]}`, `{"expose_functions":[{"match":"a","metadata":{"x":1}}]}`,
		`{"expose_functions":[{}]}`, `{"expose_functions":[{"match":"a","namesapce":"x"}]}`, `{"expose_functions":[{"namespace":" ","match":"a"}]}`, `[]`, `{} {}`} {
		_, err := ParseConfig([]byte(bad))
		assert.Assert(t, err != nil, "%q", bad)
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"auth_function_id":"a","expose_functions":["match(\"*\")",{"metadata":{"a":"match(\"b*\")"}}]}`))
	f.Add([]byte(`{"expose_functions":[{"match":"x","namespace":"y"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err != nil {
			return
		}
		raw, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		if _, err := ParseConfig(raw); err != nil {
			t.Fatalf("a parsed block does not parse back: %v (%s)", err, raw)
		}
		for _, r := range c.ExposeFunctions {
			_ = r.Matches("a::b", "default", json.RawMessage(`{"a":"bc"}`))
		}
	})
}

func FuzzDecodeAuthResult(f *testing.F) {
	f.Add([]byte(`{"namespaces":{"o":["a::*"]},"allowed_functions":["x"],"forbidden_functions":["y"],"allowed_trigger_types":["cron"],"context":{}}`), "y", "o")
	f.Add([]byte(`{"function_registration_prefix":"p","allow_function_registration":false}`), "x", "default")
	f.Fuzz(func(t *testing.T, b []byte, id, ns string) {
		s, err := DecodeAuthResult(b)
		if err != nil {
			return
		}
		_ = Allowed(id, ns, &Config{}, s, nil)
		_ = s.MayDeclare(ns)
		if s.Forbids(id) && Allowed(id, ns, nil, s, nil) {
			t.Fatalf("a forbidden id was allowed: %q", id)
		}
	})
}

func FuzzWildcard(f *testing.F) {
	f.Add("a*b*c", "axxbyyc")
	f.Fuzz(func(t *testing.T, pattern, value string) {
		got := Wildcard(pattern, value)
		if pattern == value && !got {
			t.Fatalf("%q does not match itself", pattern)
		}
	})
}

// BenchmarkAllowed is the RBAC decision on the call path: an exposed id
// matched by the second of three rules, with a session holding grants.
func BenchmarkAllowed(b *testing.B) {
	cfg := &Config{ExposeFunctions: []Filter{{Match: "other::*"}, {Match: "bench::*"}, {Match: "x::*", Namespace: "orders"}}}
	s := &Session{Namespaces: map[string][]string{"orders": {"orders::*"}}, AllowedFunctions: []string{"a::b"}, ForbiddenFunctions: []string{"c::d"}}
	for b.Loop() {
		if !Allowed("bench::echo", DefaultNamespace, cfg, s, nil) {
			b.Fatal("denied")
		}
	}
}

// TestInfrastructure: the builtins every session may call are those that
// reach only the caller's own worker and channels; discovery and
// privileged builtins are not among them.
func TestInfrastructure(t *testing.T) {
	for id, want := range map[string]bool{
		"engine::channels::create":   true,
		"engine::channels::lease":    true,
		"engine::channels::watch":    true,
		"engine::workers::register":  true,
		"engine::log::info":          true,
		"engine::functions::list":    false,
		"engine::channels::drop":     false,
		"engine::adapters::start":    false,
		"engine::credentials::issue": false,
	} {
		assert.Equal(t, IsInfrastructure(id), want, id)
	}
}
