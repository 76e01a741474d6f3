// Package config reads the engine's config.yaml (spec iii-0.26 §3): the
// engine workers it runs, the WebSocket listeners, the configuration
// worker's store, the sandbox binding and the namespace grace time.
//
// Parsing is strict: unknown and duplicate keys are errors, every error has
// a stable code and a message that says how to fix it, and nothing panics
// on input (FuzzLoad).
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/lazyre"
	"github.com/iii-sandbox/iii/internal/rbac"
	"github.com/iii-sandbox/iii/internal/yamlnode"
	"github.com/iii-sandbox/iii/protocol"
)

// Defaults of config.yaml.
const (
	DefaultHost             = "127.0.0.1"
	DefaultPort             = protocol.DefaultPort
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultConfigDirectory  = "./config"
	DefaultSandboxAdapter   = "sandbox-libkrun"
	DefaultSandboxNamespace = "default"

	// maxGraceMS and maxHandshakeMS bound values that are durations in
	// milliseconds: an hour is already far past any sensible setting, and
	// the bound keeps a typo from overflowing time.Duration.
	maxGraceMS     = 3_600_000
	maxHandshakeMS = 3_600_000
)

// Worker types config.yaml may declare in 0.26.
const (
	TypeConfiguration    = "configuration"
	TypeWorkerManager    = "iii-worker-manager"
	TypeHTTPFunctions    = "iii-http-functions"
	TypeStream           = "iii-stream"
	typeSandbox          = "iii-sandbox"
	typeEngineFunctions  = "iii-engine-functions"
	typeTelemetry        = "iii-telemetry"
	typeObservability    = "iii-observability"
	configurationAdapter = "fs"
)

// Config is a parsed, validated config.yaml.
type Config struct {
	// Dir is the directory relative paths resolve against: the config
	// file's directory.
	Dir string
	// NamespaceGrace is registration_namespace_grace_ms; 0 when the file
	// does not set it (the engine's default applies).
	NamespaceGrace time.Duration
	// Workers are the entries of workers: in file order.
	Workers []Worker
	// Listeners are the iii-worker-manager instances; one default listener
	// on 127.0.0.1:49134 when the file declares none.
	Listeners []Listener
	// Configuration is the configuration worker's settings (defaults when
	// the file does not declare it: the worker always runs).
	Configuration Configuration
	// Sandbox is the top-level sandbox: binding; nil when the section is
	// absent (no adapter bound, sandbox::* fails with S303).
	Sandbox *Sandbox
	// Stream is the iii-stream worker (stream.go); nil when the file does
	// not declare it.
	Stream *Stream
	// HTTPFunctions is the iii-http-functions worker (httpfunctions.go);
	// nil when the file does not declare it (HTTP-invocation
	// registrations are then refused).
	HTTPFunctions *HTTPFunctions
	// EngineToken is engine_token: when set, engine::adapters::start,
	// stop and restart require it (docs/project-token.md). The
	// environment's III_ENGINE_TOKEN wins over it (the server decides).
	EngineToken string
}

// Worker is one entry of workers:.
type Worker struct {
	Name     string // as written: "iii-worker-manager#rbac"
	Type     string // "iii-worker-manager"
	Instance string // "rbac"; empty without a # suffix
	Line     int
}

// Listener is one iii-worker-manager instance.
type Listener struct {
	Name             string // the worker entry's name, e.g. "iii-worker-manager#rbac"
	Host             string
	Port             int // 0 lets the system pick a free port
	HandshakeTimeout time.Duration
	// MiddlewareFunctionID is middleware_function_id: the function that
	// sees every non-engine invoke of the listener's connections.
	MiddlewareFunctionID string
	// RBAC is the rbac block as canonical JSON (internal/rbac.Config), "" when
	// the listener has none. A string keeps Listener comparable, so a
	// reload sees a changed block as a changed listener.
	RBAC string
	// Limits are the listener's caps (this engine's extension, under
	// limits:); zero fields take the engine's defaults.
	Limits ListenerLimits
}

// ListenerLimits is a listener's limits: block (docs/security.md, "Limits").
type ListenerLimits struct {
	FrameBytes                 int64
	Connections                int64
	RegistrationsPerConnection int64
	QueuedBytesPerConnection   int64
	// What a caller can make the engine hold (docs/security.md, "Limits").
	IDBytes                        int64
	InflightPerConnection          int64
	InflightBytesPerConnection     int64
	RegistrationBytes              int64
	RegistrationBytesPerConnection int64
}

// RBACConfig decodes RBAC; nil when the listener has none.
func (l Listener) RBACConfig() *rbac.Config {
	if l.RBAC == "" {
		return nil
	}
	c, err := rbac.ParseConfig([]byte(l.RBAC))
	if err != nil {
		return nil // validated at parse time; cannot happen
	}
	return c
}

// Loopback reports whether the listener binds only a loopback address.
func (l Listener) Loopback() bool {
	if strings.EqualFold(l.Host, "localhost") {
		return true
	}
	ip := net.ParseIP(l.Host)
	return ip != nil && ip.IsLoopback()
}

// Addr is host:port for net.Listen.
func (l Listener) Addr() string { return net.JoinHostPort(l.Host, strconv.Itoa(l.Port)) }

// Configuration holds the configuration worker's settings.
type Configuration struct {
	Name      string // the worker entry's name; "configuration" by default
	Adapter   string // always "fs" in this engine
	Directory string // absolute
	TTL       time.Duration
}

// Sandbox is the top-level sandbox: section.
type Sandbox struct {
	Adapter   string
	Namespace string
	// Config is sandbox.config, the adapter's configuration, as compact
	// JSON (an object); "" when the key is absent or null (the engine then
	// starts the adapter with {}). A string keeps Sandbox comparable, so a
	// reload sees a changed configuration as a changed binding.
	Config string
	// Hosts makes the binding a fleet (docs/scale-out.md): "*" routes to
	// every connected sandbox host of the adapter, otherwise the host
	// names allowed, sorted and joined by commas; "" is the single
	// adapter the engine runs. The engine starts no adapter of its own
	// for a fleet.
	Hosts string
	// HostHeartbeatMS is sandbox.host_heartbeat_ms: how often the engine
	// pings the connection of each adapter that serves sandboxes over
	// WebSocket, fleet hosts and single remote adapters alike (one silent
	// for about three heartbeats is cut, so its sandboxes answer S301);
	// 0 = the engine's default (250 ms). A change never restarts the
	// adapter.
	HostHeartbeatMS int64
}

// ParseOptions say how to read one document.
type ParseOptions struct {
	// Name is how messages refer to the file, e.g. "config.yaml".
	Name string
	// Dir is where relative paths resolve; it should be absolute.
	Dir string
	// Lookup reads environment variables for ${VAR:default}; nil means no
	// variable is set.
	Lookup LookupFunc
}

var (
	namespaceRE = lazyre.New(`^[a-z0-9_-]+$`)
	hostRE      = lazyre.New(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$`)
)

type parser struct {
	name   string
	dir    string
	lookup LookupFunc
	ph     *yamlnode.Shield
	doc    yaml.Node // as parsed, placeholders still tokens
	// written holds, for each scalar whose placeholders expandTree
	// expanded, the text as written (placeholders restored): a secret
	// given as ${VAR} is seeded into a configuration entry as written.
	written map[*yaml.Node]string
}

// fail formats "<file>:<line>: message"; n may be nil for file-wide errors.
func (p *parser) fail(code string, n *yaml.Node, format string, args ...any) *Error {
	where := p.name
	if n != nil && n.Line > 0 {
		where = fmt.Sprintf("%s:%d", p.name, n.Line)
	}
	return &Error{Code: code, Message: where + ": " + fmt.Sprintf(format, args...)}
}

// Parse validates one config.yaml document. Every error is an *Error.
func Parse(data []byte, opts ParseOptions) (cfg *Config, err error) {
	p := &parser{name: opts.Name, dir: opts.Dir, lookup: opts.Lookup}
	if p.name == "" {
		p.name = "config.yaml"
	}
	if p.lookup == nil {
		p.lookup = func(string) (string, bool) { return "", false }
	}
	// yaml.v3 is third-party code fed with user input; a panic in it must
	// become an error here, never take the engine down.
	defer func() {
		if r := recover(); r != nil {
			cfg, err = nil, p.fail(CodeInvalidConfig, nil, "the YAML parser failed on this file (%v); check its syntax", r)
		}
	}()
	return p.parse(data)
}

func (p *parser) parse(data []byte) (*Config, error) {
	text, ph := tokenize(data)
	p.ph = ph
	dec := yaml.NewDecoder(strings.NewReader(text))
	if err := dec.Decode(&p.doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, p.fail(CodeInvalidConfig, nil, "not valid YAML: %s", ph.Restore(strings.TrimPrefix(err.Error(), "yaml: ")))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, p.fail(CodeInvalidConfig, nil, "holds more than one YAML document (a second \"---\"); config.yaml is one document")
	}
	budget := yamlnode.MaxNodes
	root, err := p.unfold(&p.doc, &budget)
	if err != nil {
		return nil, err
	}
	restoreKeys(ph, root)
	if err := p.checkDuplicateKeys(root, ""); err != nil {
		return nil, err
	}
	cfg := &Config{Dir: p.dir}
	top := documentTop(root)
	if yamlnode.IsNull(top) {
		// An empty file is a valid config: no workers, every default.
		return p.finish(cfg, nil, nil)
	}
	if top.Kind != yaml.MappingNode {
		return nil, p.fail(CodeInvalidConfig, top, "the top level must be a mapping with the keys registration_namespace_grace_ms, workers, sandbox and engine_token, not a %s", yamlnode.KindName(top))
	}
	var unresolved []unresolvedVar
	p.expandTree(top, "", &unresolved)
	var graceNode, workersNode, sandboxNode, tokenNode *yaml.Node
	sandboxSet := false
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		switch k.Value {
		case "registration_namespace_grace_ms":
			graceNode = v
		case "workers":
			workersNode = v
		case "sandbox":
			sandboxNode, sandboxSet = v, true
		case "engine_token":
			tokenNode = v
		default:
			return nil, p.fail(CodeInvalidConfig, k, "unknown key %q at the top level; config.yaml has only registration_namespace_grace_ms, workers, sandbox and engine_token", k.Value)
		}
	}
	entries, err := p.workerEntries(workersNode, unresolved)
	if err != nil {
		return nil, err
	}
	// The worker list is judged before unset variables are reported: an
	// entry that must go away should be reported as such, not as a
	// variable inside it.
	if err := p.checkWorkerTypes(entries); err != nil {
		return nil, err
	}
	if len(unresolved) > 0 {
		return nil, p.unsetError(unresolved[0])
	}
	if graceNode != nil && !yamlnode.IsNull(graceNode) {
		ms, err := p.intValue(graceNode, "registration_namespace_grace_ms", 1, maxGraceMS)
		if err != nil {
			return nil, err
		}
		cfg.NamespaceGrace = time.Duration(ms) * time.Millisecond
	}
	if tokenNode != nil && !yamlnode.IsNull(tokenNode) {
		if cfg.EngineToken, err = p.engineToken(tokenNode); err != nil {
			return nil, err
		}
	}
	var sandbox *Sandbox
	if sandboxSet {
		if sandbox, err = p.sandbox(sandboxNode); err != nil {
			return nil, err
		}
	}
	return p.finish(cfg, entries, sandbox)
}

func documentTop(root *yaml.Node) *yaml.Node {
	if root != nil && root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		return root.Content[0]
	}
	return nil
}

// entry is a workers: item before its config is decoded.
type entry struct {
	Worker
	index      int // position in workers:
	nameNode   *yaml.Node
	configNode *yaml.Node // nil when absent
}

func (p *parser) workerEntries(n *yaml.Node, unresolved []unresolvedVar) ([]entry, error) {
	if yamlnode.IsNull(n) {
		return nil, nil
	}
	if n.Kind == yaml.MappingNode {
		return nil, p.fail(CodeInvalidConfig, n, "workers must be a list of entries like `- name: iii-worker-manager`; the name-to-config map form belongs to engine.workers in worker-compose.yaml")
	}
	if n.Kind != yaml.SequenceNode {
		return nil, p.fail(CodeInvalidConfig, n, "workers must be a list of {name, config} entries, not a %s", yamlnode.KindName(n))
	}
	var out []entry
	seen := map[string]int{}
	for i, item := range n.Content {
		path := fmt.Sprintf("workers[%d]", i)
		if item.Kind != yaml.MappingNode {
			return nil, p.fail(CodeInvalidConfig, item, "%s must be a mapping with name and an optional config, not a %s", path, yamlnode.KindName(item))
		}
		e := entry{index: i}
		for j := 0; j+1 < len(item.Content); j += 2 {
			k, v := item.Content[j], item.Content[j+1]
			switch k.Value {
			case "name":
				e.nameNode = v
			case "config":
				e.configNode = v
			default:
				return nil, p.fail(CodeInvalidConfig, k, "unknown key %q in %s; an entry has only name and config", k.Value, path)
			}
		}
		if e.nameNode == nil || yamlnode.IsNull(e.nameNode) {
			return nil, p.fail(CodeInvalidConfig, item, "%s has no name; write `- name: <worker>`", path)
		}
		if e.nameNode.Kind != yaml.ScalarNode {
			return nil, p.fail(CodeInvalidConfig, e.nameNode, "%s.name must be a string, not a %s", path, yamlnode.KindName(e.nameNode))
		}
		for _, u := range unresolved {
			if u.node == e.nameNode {
				return nil, p.unsetError(u)
			}
		}
		e.Name, e.Line = e.nameNode.Value, e.nameNode.Line
		typ, inst, hasHash := strings.Cut(e.Name, "#")
		if typ == "" || (hasHash && (inst == "" || strings.Contains(inst, "#"))) {
			return nil, p.fail(CodeInvalidConfig, e.nameNode, "worker name %q is malformed; write <type> or <type>#<instance> with a non-empty instance and a single #", e.Name)
		}
		e.Type, e.Instance = typ, inst
		if first, dup := seen[e.Name]; dup {
			return nil, p.fail(CodeInvalidConfig, e.nameNode, "worker %q is declared twice (first at line %d); merge the entries or give the second an #instance suffix", e.Name, first)
		}
		seen[e.Name] = e.Line
		out = append(out, e)
	}
	return out, nil
}

// checkWorkerTypes applies the 0.26 allow-list. Everything not allowed is
// reported in one error, so a user migrating an old file sees all of it at
// once.
func (p *parser) checkWorkerTypes(entries []entry) error {
	var unsupported []string
	for _, e := range entries {
		switch e.Type {
		case TypeConfiguration, TypeWorkerManager, TypeStream, TypeHTTPFunctions:
		case typeSandbox:
			unsupported = append(unsupported, p.sandboxFix(e))
		case typeEngineFunctions, typeTelemetry, typeObservability:
			unsupported = append(unsupported, fmt.Sprintf("  - line %d: %s: the engine runs %s by itself; delete this entry.", e.Line, e.Name, e.Type))
		default:
			unsupported = append(unsupported, fmt.Sprintf("  - line %d: %s: project workers belong in worker-compose.yaml and are started by iii compose; move this entry there as a container.", e.Line, e.Name))
		}
	}
	if len(unsupported) > 0 {
		return &Error{Code: CodeUnsupportedConfigWorkers, Message: fmt.Sprintf(
			"%s declares workers that config.yaml does not run in iii 0.26:\n%s\nconfig.yaml may declare only configuration, iii-worker-manager, iii-http-functions and iii-stream, each with an optional #instance suffix. See docs/config-yaml.md and the 0.26 upgrade guide (workers moved to Compose).",
			p.name, strings.Join(unsupported, "\n"))}
	}
	return nil
}

// sandboxFix explains where a 0.25-style iii-sandbox entry goes, printing
// the YAML to write with the old settings filled in.
func (p *parser) sandboxFix(e entry) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  - line %d: %s: iii 0.26 injects the iii-sandbox router itself. Delete this entry and bind the router with the top-level sandbox: section:\n\n", e.Line, e.Name)
	b.WriteString("        sandbox:\n          adapter: sandbox-libkrun\n          namespace: default\n\n")
	b.WriteString("    Sandbox settings go to the adapter, in worker-compose.yaml:\n\n")
	b.WriteString("        containers:\n          sandbox-libkrun:\n            worker: package://sandbox-libkrun\n            version: '^0.3'\n")
	if block := p.asWritten(e); block != "" {
		b.WriteString("            config_override:\n")
		b.WriteString(indent(block, "              "))
	}
	return strings.TrimRight(b.String(), "\n")
}

// asWritten renders an entry's config block as the user wrote it:
// config_override is never interpolated, so placeholders must survive.
func (p *parser) asWritten(e entry) string {
	budget := yamlnode.MaxNodes
	root, err := p.unfold(&p.doc, &budget)
	if err != nil {
		return ""
	}
	top := documentTop(root)
	if top == nil || top.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value != "workers" {
			continue
		}
		list := top.Content[i+1]
		if list.Kind != yaml.SequenceNode || e.index >= len(list.Content) {
			return ""
		}
		item := list.Content[e.index]
		for j := 0; j+1 < len(item.Content); j += 2 {
			if item.Content[j].Value == "config" && !yamlnode.IsNull(item.Content[j+1]) {
				block, err := encodeNode(item.Content[j+1])
				if err != nil {
					return ""
				}
				return p.ph.Restore(block)
			}
		}
	}
	return ""
}

func encodeNode(n *yaml.Node) (string, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(n); err != nil {
		return "", err
	}
	if err := enc.Close(); err != nil {
		return "", err
	}
	return buf.String(), nil
}

func indent(s, prefix string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		if line == "" {
			continue
		}
		b.WriteString(prefix)
		b.WriteString(line)
	}
	return b.String()
}

// engineToken reads engine_token: a non-empty string without whitespace
// or control characters (it travels in JSON payloads and environment
// variables, where such bytes only cause trouble).
func (p *parser) engineToken(n *yaml.Node) (string, error) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		return "", p.fail(CodeInvalidConfig, n, "engine_token must be a string, not a %s", yamlnode.KindName(n))
	}
	tok := n.Value
	if tok == "" {
		return "", p.fail(CodeInvalidConfig, n, "engine_token is empty; remove the key to run without an engine token")
	}
	for _, r := range tok {
		if r <= ' ' || r == 0x7f {
			return "", p.fail(CodeInvalidConfig, n, "engine_token holds whitespace or a control character; use printable characters only")
		}
	}
	return tok, nil
}

func (p *parser) sandbox(n *yaml.Node) (*Sandbox, error) {
	s := &Sandbox{Adapter: DefaultSandboxAdapter, Namespace: DefaultSandboxNamespace}
	if yamlnode.IsNull(n) {
		return s, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, p.fail(CodeInvalidConfig, n, "sandbox must be a mapping, not a %s; write:\n\n    sandbox:\n      adapter: sandbox-libkrun\n      namespace: default", yamlnode.KindName(n))
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch k.Value {
		case "adapter":
			if yamlnode.IsNull(v) {
				continue
			}
			name, err := p.stringValue(v, "sandbox.adapter")
			if err != nil {
				return nil, err
			}
			if !contract.ValidAdapterName(name) {
				return nil, p.fail(CodeInvalidConfig, v, "sandbox.adapter %q is not a valid adapter worker name: use 1 to 64 characters from a-z, 0-9, _ and -, starting with a letter or digit (the default is sandbox-libkrun)", name)
			}
			s.Adapter = name
		case "namespace":
			if yamlnode.IsNull(v) {
				continue
			}
			ns, err := p.stringValue(v, "sandbox.namespace")
			if err != nil {
				return nil, err
			}
			if !namespaceRE.MatchString(ns) {
				return nil, p.fail(CodeInvalidNamespace, v, "sandbox.namespace %q is not a valid namespace: use only a-z, 0-9, _ and - (no upper case, no blank); leave it out for default", ns)
			}
			s.Namespace = ns
		case "config":
			if yamlnode.IsNull(v) {
				continue
			}
			c, err := p.adapterConfig(v)
			if err != nil {
				return nil, err
			}
			s.Config = c
		case "hosts":
			if yamlnode.IsNull(v) {
				continue
			}
			h, err := p.sandboxHosts(v)
			if err != nil {
				return nil, err
			}
			s.Hosts = h
		case "host_heartbeat_ms":
			if yamlnode.IsNull(v) {
				continue
			}
			ms, err := p.intValue(v, "sandbox.host_heartbeat_ms", 50, 60000)
			if err != nil {
				return nil, err
			}
			s.HostHeartbeatMS = ms
		default:
			return nil, p.fail(CodeInvalidConfig, k, "unknown key %q in sandbox; it has only adapter, namespace, config, hosts and host_heartbeat_ms", k.Value)
		}
	}
	return s, nil
}

// sandboxHosts reads sandbox.hosts: "*" (every connected host), or a
// list of host names (1 to 63 of a-z, 0-9, -).
func (p *parser) sandboxHosts(v *yaml.Node) (string, error) {
	bad := func(n *yaml.Node) error {
		return p.fail(CodeInvalidConfig, n, "sandbox.hosts must be \"*\" (every sandbox host of the adapter that connects) or a list of host names (1 to 63 of a-z, 0-9 and -), e.g. hosts: [h1, h2]")
	}
	switch v.Kind {
	case yaml.ScalarNode:
		if v.Value != "*" {
			return "", bad(v)
		}
		return "*", nil
	case yaml.SequenceNode:
		if len(v.Content) == 0 || len(v.Content) > 1024 {
			return "", bad(v)
		}
		seen := map[string]bool{}
		var names []string
		for _, e := range v.Content {
			if e.Kind != yaml.ScalarNode || !contract.ValidHostName(e.Value) {
				return "", bad(e)
			}
			if !seen[e.Value] {
				seen[e.Value] = true
				names = append(names, e.Value)
			}
		}
		sort.Strings(names)
		return strings.Join(names, ","), nil
	}
	return "", bad(v)
}

// adapterConfig reads sandbox.config: a mapping, handed to the adapter as
// JSON. Its keys are the adapter's to judge (the adapter refuses what it
// does not know when it starts), so only the shape is checked here.
func (p *parser) adapterConfig(v *yaml.Node) (string, error) {
	if v.Kind != yaml.MappingNode {
		return "", p.fail(CodeInvalidConfig, v, "sandbox.config must be a mapping (the adapter's configuration, e.g. config: {image_allowlist: [python]}), not a %s", yamlnode.KindName(v))
	}
	var tree any
	if err := v.Decode(&tree); err != nil {
		return "", p.fail(CodeInvalidConfig, v, "sandbox.config: %v", err)
	}
	raw, err := json.Marshal(tree)
	if err != nil {
		return "", p.fail(CodeInvalidConfig, v, "sandbox.config cannot be handed to the adapter as JSON (%v); use string keys and plain values", err)
	}
	return string(raw), nil
}

// finish decodes each worker's config and fills in defaults.
func (p *parser) finish(cfg *Config, entries []entry, sandbox *Sandbox) (*Config, error) {
	cfg.Sandbox = sandbox
	cfg.Configuration = Configuration{
		Name:      TypeConfiguration,
		Adapter:   configurationAdapter,
		Directory: p.resolve(DefaultConfigDirectory),
	}
	var configurationLine int
	for _, e := range entries {
		cfg.Workers = append(cfg.Workers, e.Worker)
		switch e.Type {
		case TypeWorkerManager:
			l, err := p.listener(e)
			if err != nil {
				return nil, err
			}
			cfg.Listeners = append(cfg.Listeners, l)
		case TypeHTTPFunctions:
			h, err := p.httpFunctions(e, cfg.HTTPFunctions)
			if err != nil {
				return nil, err
			}
			cfg.HTTPFunctions = h
		case TypeConfiguration:
			if configurationLine != 0 {
				return nil, p.fail(CodeInvalidConfig, e.nameNode, "a second configuration worker (%s; the first is at line %d): there is one configuration worker, it serves configuration::* in the default namespace", e.Name, configurationLine)
			}
			configurationLine = e.Line
			c, err := p.configuration(e)
			if err != nil {
				return nil, err
			}
			cfg.Configuration = c
		case TypeStream:
			st, err := p.stream(e, cfg.Stream)
			if err != nil {
				return nil, err
			}
			cfg.Stream = st
		}
	}
	if len(cfg.Listeners) == 0 {
		cfg.Listeners = []Listener{{Name: TypeWorkerManager, Host: DefaultHost, Port: DefaultPort, HandshakeTimeout: DefaultHandshakeTimeout}}
	}
	if err := p.checkListenerClash(cfg.Listeners, entries); err != nil {
		return nil, err
	}
	if err := p.checkStreamClash(cfg, entries); err != nil {
		return nil, err
	}
	return cfg, nil
}

func (p *parser) listener(e entry) (Listener, error) {
	l := Listener{Name: e.Name, Host: DefaultHost, Port: DefaultPort, HandshakeTimeout: DefaultHandshakeTimeout}
	fields, err := p.mapping(e.configNode, e.Name+".config", "host", "port", "handshake_timeout_ms", "middleware_function_id", "rbac", "limits")
	if err != nil {
		return l, err
	}
	path := e.Name + ".config"
	if v := fields["host"]; !yamlnode.IsNull(v) {
		h, err := p.stringValue(v, path+".host")
		if err != nil {
			return l, err
		}
		if !validHost(h) {
			return l, p.fail(CodeInvalidConfig, v, "%s.host %q is not an IP address or host name", path, h)
		}
		l.Host = h
	}
	if v := fields["port"]; !yamlnode.IsNull(v) {
		port, err := p.intValue(v, path+".port", 0, 65535)
		if err != nil {
			return l, err
		}
		l.Port = int(port)
	}
	if v := fields["handshake_timeout_ms"]; !yamlnode.IsNull(v) {
		ms, err := p.intValue(v, path+".handshake_timeout_ms", 1, maxHandshakeMS)
		if err != nil {
			return l, err
		}
		l.HandshakeTimeout = time.Duration(ms) * time.Millisecond
	}
	if v := fields["middleware_function_id"]; !yamlnode.IsNull(v) {
		id, err := p.stringValue(v, path+".middleware_function_id")
		if err != nil {
			return l, err
		}
		if strings.TrimSpace(id) == "" {
			return l, p.fail(CodeInvalidConfig, v, "%s.middleware_function_id is blank; name a function or leave the key out", path)
		}
		l.MiddlewareFunctionID = id
	}
	if v := fields["rbac"]; !yamlnode.IsNull(v) {
		if v.Kind != yaml.MappingNode {
			return l, p.fail(CodeInvalidConfig, v, "%s.rbac must be a mapping (auth_function_id, expose_functions, on_*_registration_function_id), not a %s", path, yamlnode.KindName(v))
		}
		var tree any
		if err := v.Decode(&tree); err != nil {
			return l, p.fail(CodeInvalidConfig, v, "%s.rbac: %v", path, err)
		}
		raw, err := json.Marshal(tree)
		if err != nil {
			return l, p.fail(CodeInvalidConfig, v, "%s.rbac: %v", path, err)
		}
		c, err := rbac.ParseConfig(raw)
		if err != nil {
			return l, p.fail(CodeInvalidConfig, v, "%s.%v (docs/security.md#rbac-and-middleware)", path, err)
		}
		canon, _ := json.Marshal(c)
		l.RBAC = string(canon)
	}
	if v := fields["limits"]; !yamlnode.IsNull(v) {
		lf, err := p.mapping(v, path+".limits", "frame_bytes", "connections", "registrations_per_connection", "queued_bytes_per_connection",
			"id_bytes", "inflight_per_connection", "inflight_bytes_per_connection", "registration_bytes", "registration_bytes_per_connection")
		if err != nil {
			return l, err
		}
		for key, dst := range map[string]*int64{
			"frame_bytes": &l.Limits.FrameBytes, "connections": &l.Limits.Connections,
			"registrations_per_connection": &l.Limits.RegistrationsPerConnection, "queued_bytes_per_connection": &l.Limits.QueuedBytesPerConnection,
			"id_bytes": &l.Limits.IDBytes, "inflight_per_connection": &l.Limits.InflightPerConnection,
			"inflight_bytes_per_connection": &l.Limits.InflightBytesPerConnection, "registration_bytes": &l.Limits.RegistrationBytes,
			"registration_bytes_per_connection": &l.Limits.RegistrationBytesPerConnection,
		} {
			if n := lf[key]; !yamlnode.IsNull(n) {
				if *dst, err = p.intValue(n, path+".limits."+key, 1, 1<<40); err != nil {
					return l, err
				}
			}
		}
	}
	return l, nil
}

func validHost(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	return hostRE.MatchString(h)
}

// checkListenerClash refuses two listeners that cannot both bind: the same
// port on the same host, or on a wildcard host. Port 0 never clashes.
func (p *parser) checkListenerClash(ls []Listener, entries []entry) error {
	line := map[string]*yaml.Node{}
	for _, e := range entries {
		line[e.Name] = e.nameNode
	}
	for i := range ls {
		for j := 0; j < i; j++ {
			a, b := ls[j], ls[i]
			if a.Port == 0 || a.Port != b.Port {
				continue
			}
			if a.Host == b.Host || isWildcard(a.Host) || isWildcard(b.Host) {
				return p.fail(CodeInvalidConfig, line[b.Name], "%s and %s both listen on port %d (%s and %s); give each instance its own port", a.Name, b.Name, b.Port, a.Host, b.Host)
			}
		}
	}
	return nil
}

func isWildcard(h string) bool {
	ip := net.ParseIP(h)
	return ip != nil && ip.IsUnspecified()
}

func (p *parser) configuration(e entry) (Configuration, error) {
	c := Configuration{Name: e.Name, Adapter: configurationAdapter, Directory: p.resolve(DefaultConfigDirectory)}
	path := e.Name + ".config"
	fields, err := p.mapping(e.configNode, path, "adapter", "ttl_seconds")
	if err != nil {
		return c, err
	}
	if v := fields["ttl_seconds"]; !yamlnode.IsNull(v) {
		ttl, err := p.intValue(v, path+".ttl_seconds", 0, 365*24*3600)
		if err != nil {
			return c, err
		}
		c.TTL = time.Duration(ttl) * time.Second
	}
	adapter, err := p.mapping(fields["adapter"], path+".adapter", "name", "config")
	if err != nil {
		return c, err
	}
	if v := adapter["name"]; !yamlnode.IsNull(v) {
		name, err := p.stringValue(v, path+".adapter.name")
		if err != nil {
			return c, err
		}
		if name != configurationAdapter {
			return c, p.fail(CodeInvalidConfig, v, "%s.adapter.name %q is not supported by this engine; the only adapter is fs (one YAML file per entry in a directory)", path, name)
		}
	}
	store, err := p.mapping(adapter["config"], path+".adapter.config", "directory")
	if err != nil {
		return c, err
	}
	if v := store["directory"]; !yamlnode.IsNull(v) {
		dir, err := p.stringValue(v, path+".adapter.config.directory")
		if err != nil {
			return c, err
		}
		if strings.TrimSpace(dir) == "" {
			return c, p.fail(CodeInvalidConfig, v, "%s.adapter.config.directory is blank; leave it out for ./config", path)
		}
		c.Directory = p.resolve(dir)
	}
	return c, nil
}

func (p *parser) resolve(dir string) string {
	if filepath.IsAbs(dir) || p.dir == "" {
		return filepath.Clean(dir)
	}
	return filepath.Join(p.dir, dir)
}

// mapping returns the values of a mapping node by key, refusing keys not in
// allowed. A nil or null node is an empty mapping.
func (p *parser) mapping(n *yaml.Node, path string, allowed ...string) (map[string]*yaml.Node, error) {
	out := map[string]*yaml.Node{}
	if yamlnode.IsNull(n) {
		return out, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, p.fail(CodeInvalidConfig, n, "%s must be a mapping, not a %s", path, yamlnode.KindName(n))
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		ok := false
		for _, a := range allowed {
			if k.Value == a {
				ok = true
				break
			}
		}
		if !ok {
			sorted := append([]string(nil), allowed...)
			sort.Strings(sorted)
			return nil, p.fail(CodeInvalidConfig, k, "unknown key %q in %s; allowed keys: %s", k.Value, path, strings.Join(sorted, ", "))
		}
		out[k.Value] = n.Content[i+1]
	}
	return out, nil
}

func (p *parser) stringValue(n *yaml.Node, path string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", p.fail(CodeInvalidConfig, n, "%s must be a string, not a %s", path, yamlnode.KindName(n))
	}
	return n.Value, nil
}

func (p *parser) intValue(n *yaml.Node, path string, lo, hi int64) (int64, error) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != yamlnode.TagInt {
		return 0, p.fail(CodeInvalidConfig, n, "%s must be a whole number from %d to %d, not a %s", path, lo, hi, yamlnode.KindName(n))
	}
	var v int64
	if err := n.Decode(&v); err != nil || v < lo || v > hi {
		return 0, p.fail(CodeInvalidConfig, n, "%s is %s; it must be a whole number from %d to %d", path, n.Value, lo, hi)
	}
	return v, nil
}
