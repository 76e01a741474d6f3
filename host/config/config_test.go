package config

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"
)

const testDir = "/srv/engine"

// envOf is a LookupFunc over m.
func envOf(m map[string]string) LookupFunc {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func parse(t *testing.T, src string, env map[string]string) (*Config, error) {
	t.Helper()
	return Parse([]byte(src), ParseOptions{Name: "config.yaml", Dir: testDir, Lookup: envOf(env)})
}

// TestParseErrors pins every message a user can see: each case's
// "CODE: message" is compared with testdata/<name>.golden (go test -update
// rewrites them after a deliberate change).
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		env  map[string]string
		code string
	}{
		{name: "invalid_yaml", src: "workers: [\n", code: CodeInvalidConfig},
		{name: "tab_indent", src: "workers:\n\t- name: configuration\n", code: CodeInvalidConfig},
		{name: "two_documents", src: "workers: []\n---\nworkers: []\n", code: CodeInvalidConfig},
		{name: "top_not_mapping", src: "- name: configuration\n", code: CodeInvalidConfig},
		{name: "unknown_top_key", src: "port: 49134\nworkers: []\n", code: CodeInvalidConfig},
		{name: "duplicate_top_key", src: "workers: []\nsandbox: {}\nworkers: []\n", code: CodeInvalidConfig},
		{name: "duplicate_nested_key", src: "workers:\n  - name: iii-worker-manager\n    config:\n      port: 1\n      port: 2\n", code: CodeInvalidConfig},
		{name: "non_scalar_key", src: "? [a, b]\n: c\n", code: CodeInvalidConfig},
		{name: "workers_map_form", src: "workers:\n  configuration: {}\n", code: CodeInvalidConfig},
		{name: "workers_scalar", src: "workers: configuration\n", code: CodeInvalidConfig},
		{name: "worker_item_scalar", src: "workers:\n  - configuration\n", code: CodeInvalidConfig},
		{name: "worker_unknown_key", src: "workers:\n  - name: configuration\n    class: modules::Config\n", code: CodeInvalidConfig},
		{name: "worker_no_name", src: "workers:\n  - config: {}\n", code: CodeInvalidConfig},
		{name: "worker_name_not_string", src: "workers:\n  - name: [a]\n", code: CodeInvalidConfig},
		{name: "worker_empty_instance", src: "workers:\n  - name: iii-worker-manager#\n", code: CodeInvalidConfig},
		{name: "worker_two_hashes", src: "workers:\n  - name: iii-worker-manager#a#b\n", code: CodeInvalidConfig},
		{name: "worker_no_type", src: "workers:\n  - name: '#rbac'\n", code: CodeInvalidConfig},
		{name: "worker_declared_twice", src: "workers:\n  - name: iii-worker-manager\n  - name: iii-worker-manager\n", code: CodeInvalidConfig},
		{name: "unsupported_workers", src: "workers:\n  - name: configuration\n  - name: my-api\n    config: {port: 3000}\n  - name: iii-telemetry\n  - name: iii-engine-functions\n  - name: iii-observability#x\n", code: CodeUnsupportedConfigWorkers},
		{
			name: "unsupported_iii_sandbox",
			src:  "workers:\n  - name: iii-sandbox\n    config:\n      image_allowlist:\n        - python\n        - node\n      default_memory_mb: ${MEM}\n",
			code: CodeUnsupportedConfigWorkers,
		},
		{name: "unsupported_iii_sandbox_instance", src: "workers:\n  - name: iii-sandbox#second\n", code: CodeUnsupportedConfigWorkers},
		{name: "unset_variable", src: "workers:\n  - name: iii-worker-manager\n    config:\n      port: ${WM_PORT}\n", code: CodeUnsetVariable},
		{name: "unset_variable_embedded", src: "sandbox:\n  namespace: ns-${TEAM}\n", code: CodeUnsetVariable},
		{name: "grace_not_integer", src: "registration_namespace_grace_ms: soon\n", code: CodeInvalidConfig},
		{name: "grace_zero", src: "registration_namespace_grace_ms: 0\n", code: CodeInvalidConfig},
		{name: "grace_float", src: "registration_namespace_grace_ms: 1.5\n", code: CodeInvalidConfig},
		{name: "grace_quoted", src: "registration_namespace_grace_ms: \"5000\"\n", code: CodeInvalidConfig},
		{name: "sandbox_not_mapping", src: "sandbox: sandbox-libkrun\n", code: CodeInvalidConfig},
		{name: "sandbox_bad_namespace", src: "sandbox:\n  namespace: Dev\n", code: CodeInvalidNamespace},
		{name: "sandbox_blank_namespace", src: "sandbox:\n  namespace: ''\n", code: CodeInvalidNamespace},
		{name: "sandbox_namespace_from_env", src: "sandbox:\n  namespace: ${NS}\n", env: map[string]string{"NS": "My Team"}, code: CodeInvalidNamespace},
		{name: "sandbox_bad_adapter", src: "sandbox:\n  adapter: Sandbox::libkrun\n", code: CodeInvalidConfig},
		{name: "sandbox_adapter_list", src: "sandbox:\n  adapter: [a]\n", code: CodeInvalidConfig},
		{name: "sandbox_unknown_key", src: "sandbox:\n  adapter: sandbox-libkrun\n  image_allowlist: [python]\n", code: CodeInvalidConfig},
		{name: "sandbox_config_list", src: "sandbox:\n  config: [python]\n", code: CodeInvalidConfig},
		{name: "sandbox_hosts_bad_name", src: "sandbox:\n  hosts: [H1]\n", code: CodeInvalidConfig},
		{name: "sandbox_hosts_empty", src: "sandbox:\n  hosts: []\n", code: CodeInvalidConfig},
		{name: "sandbox_hosts_word", src: "sandbox:\n  hosts: all\n", code: CodeInvalidConfig},
		{name: "sandbox_config_scalar", src: "sandbox:\n  config: python\n", code: CodeInvalidConfig},
		{name: "sandbox_config_int_key", src: "sandbox:\n  config: {1: a}\n", code: CodeInvalidConfig},
		{name: "sandbox_config_dup_key", src: "sandbox:\n  config: {a: 1, a: 2}\n", code: CodeInvalidConfig},
		{name: "sandbox_config_unset", src: "sandbox:\n  config: {a: ${NOPE}}\n", code: CodeUnsetVariable},
		{name: "listener_unknown_key", src: "workers:\n  - name: iii-worker-manager#rbac\n    config: { port: 49135, middleware: auth::middleware }\n", code: CodeInvalidConfig},
		{name: "listener_rbac_unknown_key", src: "workers:\n  - name: iii-worker-manager\n    config: { rbac: { auth_function: a::b } }\n", code: CodeInvalidConfig},
		{name: "listener_rbac_bad_filter", src: "workers:\n  - name: iii-worker-manager\n    config: { rbac: { expose_functions: ['svc::*'] } }\n", code: CodeInvalidConfig},
		{name: "listener_rbac_filter_typo", src: "workers:\n  - name: iii-worker-manager\n    config: { rbac: { expose_functions: [{ match: 'a::*', namesapce: x }] } }\n", code: CodeInvalidConfig},
		{name: "listener_limits_unknown", src: "workers:\n  - name: iii-worker-manager\n    config: { limits: { conns: 5 } }\n", code: CodeInvalidConfig},
		{name: "listener_limits_zero", src: "workers:\n  - name: iii-worker-manager\n    config: { limits: { connections: 0 } }\n", code: CodeInvalidConfig},
		{name: "listener_rbac_list", src: "workers:\n  - name: iii-worker-manager\n    config: { rbac: [1] }\n", code: CodeInvalidConfig},
		{name: "listener_middleware_blank", src: "workers:\n  - name: iii-worker-manager\n    config: { middleware_function_id: ' ' }\n", code: CodeInvalidConfig},
		{name: "listener_config_list", src: "workers:\n  - name: iii-worker-manager\n    config: [1]\n", code: CodeInvalidConfig},
		{name: "listener_port_range", src: "workers:\n  - name: iii-worker-manager\n    config: { port: 70000 }\n", code: CodeInvalidConfig},
		{name: "listener_port_text", src: "workers:\n  - name: iii-worker-manager\n    config: { port: http }\n", code: CodeInvalidConfig},
		{name: "listener_port_env_text", src: "workers:\n  - name: iii-worker-manager\n    config: { port: '${P:49134}' }\n", code: CodeInvalidConfig},
		{name: "listener_bad_host", src: "workers:\n  - name: iii-worker-manager\n    config: { host: 'not a host' }\n", code: CodeInvalidConfig},
		{name: "listener_handshake_zero", src: "workers:\n  - name: iii-worker-manager\n    config: { handshake_timeout_ms: 0 }\n", code: CodeInvalidConfig},
		{name: "listener_port_clash", src: "workers:\n  - name: iii-worker-manager\n  - name: iii-worker-manager#rbac\n    config: { port: 49134 }\n", code: CodeInvalidConfig},
		{name: "listener_wildcard_clash", src: "workers:\n  - name: iii-worker-manager\n    config: { host: 0.0.0.0, port: 5000 }\n  - name: iii-worker-manager#b\n    config: { host: 127.0.0.1, port: 5000 }\n", code: CodeInvalidConfig},
		{name: "second_configuration", src: "workers:\n  - name: configuration\n  - name: configuration#other\n", code: CodeInvalidConfig},
		{name: "configuration_bridge", src: "workers:\n  - name: configuration\n    config:\n      adapter: { name: bridge, config: { bridge_url: 'ws://localhost:49134' } }\n", code: CodeInvalidConfig},
		{name: "configuration_unknown_key", src: "workers:\n  - name: configuration\n    config: { directory: ./config }\n", code: CodeInvalidConfig},
		{name: "configuration_adapter_string", src: "workers:\n  - name: configuration\n    config: { adapter: fs }\n", code: CodeInvalidConfig},
		{name: "configuration_store_unknown_key", src: "workers:\n  - name: configuration\n    config: { adapter: { config: { dir: x } } }\n", code: CodeInvalidConfig},
		{name: "configuration_blank_directory", src: "workers:\n  - name: configuration\n    config: { adapter: { config: { directory: ' ' } } }\n", code: CodeInvalidConfig},
		{name: "configuration_negative_ttl", src: "workers:\n  - name: configuration\n    config: { ttl_seconds: -1 }\n", code: CodeInvalidConfig},
		{
			name: "alias_bomb",
			src:  "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n",
			code: CodeInvalidConfig,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parse(t, tc.src, tc.env)
			assert.Assert(t, cfg == nil)
			var ce *Error
			assert.Assert(t, errors.As(err, &ce), "got %v", err)
			assert.Equal(t, ce.Code, tc.code)
			golden.Assert(t, err.Error()+"\n", tc.name+".golden")
		})
	}
}

func TestParseDefaults(t *testing.T) {
	for _, src := range []string{"", "# only a comment\n", "workers: []\n", "workers:\n", "{}\n"} {
		cfg, err := parse(t, src, nil)
		assert.NilError(t, err, "%q", src)
		assert.DeepEqual(t, cfg, &Config{
			Dir:           testDir,
			Listeners:     []Listener{{Name: "iii-worker-manager", Host: "127.0.0.1", Port: 49134, HandshakeTimeout: 10 * time.Second}},
			Configuration: Configuration{Name: "configuration", Adapter: "fs", Directory: filepath.Join(testDir, "config")},
		})
	}
}

func TestParseFull(t *testing.T) {
	src := `
registration_namespace_grace_ms: ${GRACE:250}
workers:
  - name: configuration
    config:
      adapter: { name: fs, config: { directory: ${CFG_DIR:./settings} } }
      ttl_seconds: 30
  - name: iii-worker-manager
    config: { host: ${HOST:127.0.0.1}, port: ${WM_PORT:49134}, handshake_timeout_ms: 2500 }
  - name: iii-worker-manager#rbac
    config: { port: ${RBAC_PORT:49135} }
sandbox:
  adapter: my-adapter
  namespace: ${SANDBOX_NS:default}
`
	cfg, err := parse(t, src, map[string]string{"WM_PORT": "5000", "SANDBOX_NS": "dev"})
	assert.NilError(t, err)
	assert.DeepEqual(t, cfg, &Config{
		Dir:            testDir,
		NamespaceGrace: 250 * time.Millisecond,
		Workers: []Worker{
			{Name: "configuration", Type: "configuration", Line: 4},
			{Name: "iii-worker-manager", Type: "iii-worker-manager", Line: 8},
			{Name: "iii-worker-manager#rbac", Type: "iii-worker-manager", Instance: "rbac", Line: 10},
		},
		Listeners: []Listener{
			{Name: "iii-worker-manager", Host: "127.0.0.1", Port: 5000, HandshakeTimeout: 2500 * time.Millisecond},
			{Name: "iii-worker-manager#rbac", Host: "127.0.0.1", Port: 49135, HandshakeTimeout: 10 * time.Second},
		},
		Configuration: Configuration{Name: "configuration", Adapter: "fs", Directory: filepath.Join(testDir, "settings"), TTL: 30 * time.Second},
		Sandbox:       &Sandbox{Adapter: "my-adapter", Namespace: "dev"},
	})
	assert.Equal(t, cfg.Listeners[1].Addr(), "127.0.0.1:49135")
}

func TestParseSandboxDefaults(t *testing.T) {
	tests := []struct {
		name, src string
		want      *Sandbox
	}{
		{name: "absent", src: "workers: []\n", want: nil},
		{name: "null", src: "sandbox:\n", want: &Sandbox{Adapter: "sandbox-libkrun", Namespace: "default"}},
		{name: "empty", src: "sandbox: {}\n", want: &Sandbox{Adapter: "sandbox-libkrun", Namespace: "default"}},
		{name: "namespace only", src: "sandbox: { namespace: dev }\n", want: &Sandbox{Adapter: "sandbox-libkrun", Namespace: "dev"}},
		{name: "adapter only", src: "sandbox: { adapter: other_adapter }\n", want: &Sandbox{Adapter: "other_adapter", Namespace: "default"}},
		{name: "every host", src: "sandbox: { hosts: '*' }\n", want: &Sandbox{Adapter: "sandbox-libkrun", Namespace: "default", Hosts: "*"}},
		{name: "named hosts", src: "sandbox: { hosts: [h2, h1, h2] }\n", want: &Sandbox{Adapter: "sandbox-libkrun", Namespace: "default", Hosts: "h1,h2"}},
		{name: "host heartbeat", src: "sandbox: { hosts: '*', host_heartbeat_ms: 1000 }\n", want: &Sandbox{Adapter: "sandbox-libkrun", Namespace: "default", Hosts: "*", HostHeartbeatMS: 1000}},
		{name: "heartbeat of a single adapter", src: "sandbox: { host_heartbeat_ms: 2000 }\n", want: &Sandbox{Adapter: "sandbox-libkrun", Namespace: "default", HostHeartbeatMS: 2000}},
		{name: "default from env", src: "sandbox: { namespace: '${NS:team-a}' }\n", want: &Sandbox{Adapter: "sandbox-libkrun", Namespace: "team-a"}},
		{name: "config null", src: "sandbox: { config: }\n", want: &Sandbox{Adapter: "sandbox-libkrun", Namespace: "default"}},
		{name: "config empty", src: "sandbox: { config: {} }\n", want: &Sandbox{Adapter: "sandbox-libkrun", Namespace: "default", Config: "{}"}},
		{
			name: "config",
			src:  "sandbox:\n  adapter: sandbox-hostdir\n  config:\n    image_allowlist: [python, node]\n    default_memory_mb: ${MEM:256}\n    root: '${ROOT:/srv}'\n",
			want: &Sandbox{Adapter: "sandbox-hostdir", Namespace: "default", Config: `{"default_memory_mb":256,"image_allowlist":["python","node"],"root":"/srv"}`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parse(t, tc.src, nil)
			assert.NilError(t, err)
			assert.DeepEqual(t, cfg.Sandbox, tc.want)
		})
	}
}

func TestParseSandboxHostHeartbeatRefused(t *testing.T) {
	tests := []struct{ name, src, want string }{
		{name: "too small", src: "sandbox: { hosts: '*', host_heartbeat_ms: 10 }\n", want: "host_heartbeat_ms"},
		{name: "not a number", src: "sandbox: { hosts: '*', host_heartbeat_ms: soon }\n", want: "host_heartbeat_ms"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.src, nil)
			assert.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, CodeInvalidConfig)
		})
	}
}

func TestParseExpansionTyping(t *testing.T) {
	tests := []struct {
		name string
		src  string
		env  map[string]string
		port int
		host string
	}{
		{name: "plain placeholder becomes an integer", src: "port: ${P:6000}", port: 6000, host: "127.0.0.1"},
		{name: "env value becomes an integer", src: "port: ${P:6000}", env: map[string]string{"P": "7000"}, port: 7000, host: "127.0.0.1"},
		{name: "hex integer", src: "port: ${P:0x1770}", port: 6000, host: "127.0.0.1"},
		{name: "empty default means absent", src: "port: ${P:}", port: 49134, host: "127.0.0.1"},
		{name: "numeric-looking host stays usable", src: "host: ${H:127.0.0.2}", port: 49134, host: "127.0.0.2"},
		{name: "value is not YAML structure", src: "host: ${H}", env: map[string]string{"H": "localhost"}, port: 49134, host: "localhost"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := "workers:\n  - name: iii-worker-manager\n    config:\n      " + tc.src + "\n"
			cfg, err := parse(t, src, tc.env)
			assert.NilError(t, err)
			assert.Equal(t, cfg.Listeners[0].Port, tc.port)
			assert.Equal(t, cfg.Listeners[0].Host, tc.host)
		})
	}
	// An env value that looks like YAML structure must not inject keys.
	_, err := parse(t, "workers:\n  - name: iii-worker-manager\n    config:\n      port: ${P}\n", map[string]string{"P": "{a: 1}"})
	assert.ErrorContains(t, err, "must be a whole number")
}

func TestParseDirectories(t *testing.T) {
	tests := []struct{ dir, want string }{
		{dir: "./data", want: filepath.Join(testDir, "data")},
		{dir: "data/cfg", want: filepath.Join(testDir, "data", "cfg")},
		{dir: "../shared", want: "/srv/shared"},
		{dir: "/var/lib/iii", want: "/var/lib/iii"},
	}
	for _, tc := range tests {
		t.Run(tc.dir, func(t *testing.T) {
			cfg, err := parse(t, "workers:\n  - name: configuration\n    config: { adapter: { config: { directory: '"+tc.dir+"' } } }\n", nil)
			assert.NilError(t, err)
			assert.Equal(t, cfg.Configuration.Directory, tc.want)
		})
	}
}

func TestParseAliases(t *testing.T) {
	src := "workers:\n  - name: iii-worker-manager\n    config: &wm { host: 127.0.0.1, port: ${P:7000} }\n  - name: iii-worker-manager#b\n    config: { port: 7001 }\n"
	cfg, err := parse(t, src, nil)
	assert.NilError(t, err)
	assert.Equal(t, cfg.Listeners[0].Port, 7000)

	// An alias is a copy: expanding its anchor's placeholder once must not
	// change what the alias sees.
	src = "workers:\n  - name: iii-worker-manager\n    config: { port: &p '${P:7000}' }\nsandbox: { namespace: &ns dev, adapter: *ns }\n"
	_, err = parse(t, src, nil)
	assert.ErrorContains(t, err, "port must be a whole number")
}

func TestParseInstancesAndPortZero(t *testing.T) {
	src := "workers:\n  - name: iii-worker-manager#a\n    config: { port: 0 }\n  - name: iii-worker-manager#b\n    config: { port: 0 }\n"
	cfg, err := parse(t, src, nil)
	assert.NilError(t, err)
	assert.Equal(t, len(cfg.Listeners), 2)
	assert.Equal(t, cfg.Listeners[0].Addr(), "127.0.0.1:0")
	assert.Equal(t, cfg.Workers[1].Instance, "b")
}

func TestParseNamesFile(t *testing.T) {
	_, err := Parse([]byte("nope: 1\n"), ParseOptions{Name: "/etc/iii/engine.yaml"})
	assert.Assert(t, strings.HasPrefix(err.Error(), "INVALID_CONFIG: /etc/iii/engine.yaml:1: "), err.Error())
	_, err = Parse([]byte("nope: 1\n"), ParseOptions{})
	assert.Assert(t, strings.HasPrefix(err.Error(), "INVALID_CONFIG: config.yaml:1: "), err.Error())
}

// FuzzLoad: any file content gives a config or an *Error, never a panic,
// and an accepted config always has what the server relies on.
func FuzzLoad(f *testing.F) {
	seeds := []string{
		"",
		"workers: []\n",
		"registration_namespace_grace_ms: 5000\nworkers:\n  - name: configuration\n    config:\n      adapter: { name: fs, config: { directory: ./config } }\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: ${PORT:49134} }\nsandbox:\n  adapter: sandbox-libkrun\n  namespace: default\n",
		"workers:\n  - name: iii-sandbox\n    config: { image_allowlist: [python] }\n",
		"a: &a [x, *a]\n",
		"workers: [{name: iii-stream}]\n",
		"workers:\n  - name: iii-stream\n    config: { port: ${PORT:3112}, host: 127.0.0.1, adapter: { name: kv, config: { store_method: file_based, file_path: ./s, save_interval_ms: 100, channel_size: 8 } } }\n",
		"sandbox: {namespace: ${NS}}\n",
		"? [a]\n: b\n",
		"workers:\n  - name: iii-worker-manager#x\n    config: { port: 0x10 }\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	env := envOf(map[string]string{"PORT": "5000", "NS": "dev"})
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseFile("/srv/engine/config.yaml", data, env)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || ce.Code == "" || cfg != nil {
				t.Fatalf("error without a code or with a config: %v", err)
			}
			return
		}
		if len(cfg.Listeners) == 0 {
			t.Fatal("accepted config without a listener")
		}
		for _, l := range cfg.Listeners {
			if l.Port < 0 || l.Port > 65535 || l.HandshakeTimeout <= 0 || l.Host == "" {
				t.Fatalf("bad listener %+v", l)
			}
		}
		if cfg.Configuration.Directory == "" || !filepath.IsAbs(cfg.Configuration.Directory) {
			t.Fatalf("bad configuration directory %q", cfg.Configuration.Directory)
		}
		if cfg.Sandbox != nil && (cfg.Sandbox.Namespace == "" || cfg.Sandbox.Adapter == "") {
			t.Fatalf("bad sandbox binding %+v", cfg.Sandbox)
		}
		if st := cfg.Stream; st != nil && (st.Host == "" || st.Port < 0 || st.Port > 65535 || st.Adapter != "kv" ||
			(st.StoreMethod != StoreFileBased && st.StoreMethod != StoreInMemory) || !filepath.IsAbs(st.FilePath) ||
			st.SaveInterval < 100*time.Millisecond || st.ChannelSize < 1) {
			t.Fatalf("bad stream worker %+v", st)
		}
	})
}

func TestParsePlaceholderEdges(t *testing.T) {
	t.Run("flow mapping from the spec", func(t *testing.T) {
		cfg, err := parse(t, "workers:\n  - name: iii-worker-manager\n    config: { port: ${WM_PORT:3112}, host: 127.0.0.1 }\n", nil)
		assert.NilError(t, err)
		assert.Equal(t, cfg.Listeners[0].Port, 3112)
	})
	t.Run("comments are not expanded", func(t *testing.T) {
		_, err := parse(t, "# port: ${NOT_SET}\nworkers: [] # ${ALSO_NOT_SET}\n", nil)
		assert.NilError(t, err)
	})
	t.Run("a value cannot add lines or keys", func(t *testing.T) {
		cfg, err := parse(t, "sandbox: { adapter: ${A} }\n", map[string]string{"A": "x\nnamespace: Bad"})
		assert.ErrorContains(t, err, `sandbox.adapter "x\nnamespace: Bad" is not a valid adapter worker name`)
		assert.Assert(t, cfg == nil)
	})
	t.Run("a comment marker in a value stays text", func(t *testing.T) {
		_, err := parse(t, "sandbox: { namespace: ${NS} }\n", map[string]string{"NS": "dev # x"})
		assert.ErrorContains(t, err, `"dev # x" is not a valid namespace`)
	})
	t.Run("plain value with two placeholders is re-typed", func(t *testing.T) {
		cfg, err := parse(t, "workers:\n  - name: iii-worker-manager\n    config: { port: ${A}${B} }\n", map[string]string{"A": "50", "B": "00"})
		assert.NilError(t, err)
		assert.Equal(t, cfg.Listeners[0].Port, 5000)
	})
	t.Run("an explicit tag is kept", func(t *testing.T) {
		_, err := parse(t, "workers:\n  - name: iii-worker-manager\n    config: { port: !!str ${P:80} }\n", nil)
		assert.ErrorContains(t, err, "port must be a whole number from 0 to 65535, not a string")
	})
	t.Run("worker names expand", func(t *testing.T) {
		cfg, err := parse(t, "workers:\n  - name: iii-worker-manager#${SITE:eu}\n", nil)
		assert.NilError(t, err)
		assert.Equal(t, cfg.Listeners[0].Name, "iii-worker-manager#eu")
	})
	t.Run("unset variable in a worker name", func(t *testing.T) {
		_, err := parse(t, "workers:\n  - name: ${WORKER}\n", nil)
		assert.Error(t, err, "UNSET_VARIABLE: config.yaml:2: workers[0].name: ${WORKER} is not set and has no default; set the variable in the engine's environment or give a default: ${WORKER:value}")
	})
	t.Run("keys are not expanded", func(t *testing.T) {
		_, err := parse(t, "sandbox: { ${K:adapter}: x }\n", nil)
		assert.ErrorContains(t, err, `unknown key "${K:adapter}" in sandbox`)
	})
	t.Run("equal placeholder keys are duplicates", func(t *testing.T) {
		_, err := parse(t, "sandbox: { ${K}: a, ${K}: b }\n", nil)
		assert.ErrorContains(t, err, `key "${K}" appears twice`)
	})
	t.Run("text that looks like a token", func(t *testing.T) {
		cfg, err := parse(t, "sandbox: { adapter: iiiph0x0z, namespace: ${NS:dev} }\n", nil)
		assert.NilError(t, err)
		assert.DeepEqual(t, cfg.Sandbox, &Sandbox{Adapter: "iiiph0x0z", Namespace: "dev"})
	})
	t.Run("unsupported entry wins over its unset variable", func(t *testing.T) {
		_, err := parse(t, "workers:\n  - name: my-api\n    config: { port: ${PORT} }\n", nil)
		assert.ErrorContains(t, err, CodeUnsupportedConfigWorkers)
	})
}

// A 0.26 config.yaml with RBAC and middleware on a second listener runs
// unchanged (the upgrade guide's example, with an rbac block as iii reads it).
func TestParseRBACListener(t *testing.T) {
	src := `
workers:
  - name: iii-worker-manager
    config: { host: 127.0.0.1, port: 49134 }
  - name: iii-worker-manager#rbac
    config:
      host: 127.0.0.1
      port: 49135
      middleware_function_id: auth::middleware
      rbac:
        auth_function_id: auth::authenticate
        expose_functions:
          - match("api::*")
          - { match: "orders::*", namespace: orders }
          - metadata: { public: true, scope: match("team-*") }
        on_function_registration_function_id: auth::on_register
      limits: { connections: 64, frame_bytes: 1048576 }
`
	cfg, err := parse(t, src, nil)
	assert.NilError(t, err)
	assert.Equal(t, len(cfg.Listeners), 2)
	l := cfg.Listeners[1]
	assert.Equal(t, l.MiddlewareFunctionID, "auth::middleware")
	rc := l.RBACConfig()
	assert.Assert(t, rc != nil)
	assert.Equal(t, rc.AuthFunctionID, "auth::authenticate")
	assert.Equal(t, rc.OnFunctionRegistrationFunctionID, "auth::on_register")
	assert.Equal(t, len(rc.ExposeFunctions), 3)
	assert.Assert(t, rc.ExposeFunctions[0].Matches("api::get", "default", nil))
	assert.Assert(t, !rc.ExposeFunctions[0].Matches("api::get", "orders", nil))
	assert.Assert(t, rc.ExposeFunctions[1].Matches("orders::place", "orders", nil))
	assert.Assert(t, rc.ExposeFunctions[2].Matches("x::y", "default", []byte(`{"public":true,"scope":"team-a"}`)))
	assert.Equal(t, cfg.Listeners[0].RBAC, "")
	assert.Equal(t, l.Limits, ListenerLimits{Connections: 64, FrameBytes: 1 << 20})
}
