package composefile

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/envexpand"
	"github.com/iii-sandbox/iii/internal/yamlnode"
	"github.com/iii-sandbox/iii/protocol"
)

// The sandbox adapter package and the selector Compose pins it to: the
// sandbox contract major this engine serves (SANDBOX_CONFIG_MOVED prints
// it, and compose::add worker=iii-sandbox writes it).
const (
	AdapterPackage  = "sandbox-libkrun"
	AdapterSelector = "^0.3"
)

// Engine worker types a compose file may configure under engine.workers
// in 0.26, and the ones the engine injects by itself.
const (
	EngineWorkerConfiguration = "configuration"
	EngineWorkerManager       = "iii-worker-manager"
	EngineWorkerHTTPFunctions = "iii-http-functions"
	EngineWorkerStream        = "iii-stream"
	engineWorkerSandbox       = "iii-sandbox"
)

var injectedEngineWorkers = []string{"iii-engine-functions", "iii-telemetry", "iii-observability"}

// maxGraceMS bounds registration_namespace_grace_ms as config.yaml does.
const maxGraceMS = 3_600_000

// Type is the engine worker type without its #instance suffix.
func (w EngineWorker) Type() string {
	t, _, _ := strings.Cut(w.Name, "#")
	return t
}

// EngineNode returns a copy of the worker's settings for the generated
// engine config.yaml. Mappings and lists are switched to block style,
// because in flow style YAML must quote a scalar holding "{" or "}", and
// the engine reads a quoted ${PORT:3112} as a string where the user wrote
// a plain one that it reads as a number. Scalars keep their own quoting.
func (w EngineWorker) EngineNode() *yaml.Node {
	if w.Node == nil {
		return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	}
	return blockCopy(w.Node)
}

func blockCopy(n *yaml.Node) *yaml.Node {
	c := *n
	c.Anchor = ""
	c.HeadComment, c.LineComment, c.FootComment = "", "", ""
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		c.Style &^= yaml.FlowStyle
	}
	c.Content = nil
	for _, child := range n.Content {
		c.Content = append(c.Content, blockCopy(child))
	}
	return &c
}

// URLPort returns the port of engine.url (always explicit: Parse refuses a
// URL without one).
func (e *Engine) URLPort() int {
	u, err := url.Parse(e.URL)
	if err != nil {
		return 0
	}
	port, _ := strconv.Atoi(u.Port())
	return port
}

func (p *parser) engine(n, top *yaml.Node) (*Engine, error) {
	if yamlnode.IsNull(n) {
		// Nothing under engine: attach to whatever engine holds the
		// default address instead of starting one (0.26 upgrade guide).
		return &Engine{Empty: true, URL: DefaultEngineURL}, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, p.fail(compose.CodeInvalidComposeFile, n, "engine must be a mapping with url, registration_namespace_grace_ms, workers and sandbox, not %s", aKind(n))
	}
	e := &Engine{URL: DefaultEngineURL, Workers: []EngineWorker{}}
	var urlNode *yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch k.Value {
		case "url":
			u, err := p.engineURL(v)
			if err != nil {
				return nil, err
			}
			e.URL, urlNode = u, v
		case "registration_namespace_grace_ms":
			ms, err := p.intValue(v, "engine.registration_namespace_grace_ms", 1, maxGraceMS)
			if err != nil {
				return nil, err
			}
			e.RegistrationNamespaceGraceMS = &ms
		case "workers":
			ws, err := p.engineWorkers(v, top)
			if err != nil {
				return nil, err
			}
			e.Workers = ws
		case "sandbox":
			sb, err := p.sandbox(v)
			if err != nil {
				return nil, err
			}
			e.Sandbox = sb
		default:
			hint := ""
			switch k.Value {
			case "port", "host":
				hint = " (set the address in engine.url and the listener in engine.workers.iii-worker-manager)"
			case "namespace":
				hint = " (the project namespace is the top-level namespace:; the sandbox adapter's is engine.sandbox.namespace)"
			}
			return nil, p.fail(compose.CodeInvalidComposeFile, k, "unknown key %q in engine; it has url, registration_namespace_grace_ms, workers and sandbox%s", k.Value, hint)
		}
	}
	if err := p.checkEndpoint(e, urlNode); err != nil {
		return nil, err
	}
	return e, nil
}

func (p *parser) engineURL(n *yaml.Node) (string, error) {
	const fix = "write a WebSocket URL with a port, such as url: ws://127.0.0.1:49134, or remove the key for that default"
	if yamlnode.IsNull(n) {
		return "", p.fail(compose.CodeInvalidManagedEngineURL, n, "engine.url is blank; %s", fix)
	}
	s, err := p.str(n, "engine.url")
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(s) == "" {
		return "", p.fail(compose.CodeInvalidManagedEngineURL, n, "engine.url is blank; %s", fix)
	}
	u, err := url.Parse(s)
	var why string
	switch {
	case err != nil:
		why = "it does not parse as a URL"
	case !strings.HasPrefix(s, "ws://") && !strings.HasPrefix(s, "wss://"):
		why = "the scheme must be ws:// (or wss://)"
	case u.Hostname() == "":
		why = "it names no host"
	case u.Port() == "":
		why = "it names no port"
	case u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/"):
		why = "it must be only scheme, host and port"
	default:
		port, perr := strconv.Atoi(u.Port())
		if perr != nil || len(u.Port()) > 5 || port < 1 || port > 65535 {
			why = "the port must be between 1 and 65535"
		}
	}
	if why != "" {
		return "", p.fail(compose.CodeInvalidManagedEngineURL, n, "engine.url %q is not a usable engine address: %s; %s", clip(s, 80), why, fix)
	}
	return s, nil
}

// checkEndpoint makes sure Compose and its workers, which dial engine.url,
// reach the listener the generated engine config opens.
func (p *parser) checkEndpoint(e *Engine, urlNode *yaml.Node) error {
	for _, w := range e.Workers {
		if w.Name != EngineWorkerManager {
			continue
		}
		port := protocol.DefaultPort
		if v, ok := w.Config["port"]; ok {
			resolved, ok := listenerPort(v, p.lookup)
			if !ok {
				// The engine reports a port it cannot read, with its own
				// code; Compose only compares what it can know.
				return nil
			}
			port = resolved
		}
		if port != e.URLPort() {
			if urlNode == nil {
				return p.fail(compose.CodeManagedEngineEndpointMismatch, &yaml.Node{Line: w.Line},
					"engine.workers.iii-worker-manager listens on port %d, but engine.url is not set and defaults to %s (port %d); Compose and its workers dial engine.url, so set url: ws://127.0.0.1:%d or listen on %d",
					port, DefaultEngineURL, e.URLPort(), port, e.URLPort())
			}
			return p.fail(compose.CodeManagedEngineEndpointMismatch, urlNode,
				"engine.url %s uses port %d, but engine.workers.iii-worker-manager (line %d) listens on port %d; Compose and its workers dial engine.url, so make the ports equal (e.g. url: ws://127.0.0.1:%d)",
				e.URL, e.URLPort(), w.Line, port, port)
		}
	}
	return nil
}

// listenerPort reads iii-worker-manager's port as the engine will: an
// integer, or a string of the engine's ${VAR:default} syntax expanded with
// the environment Compose passes on to the engine it starts.
func listenerPort(v any, lookup LookupFunc) (int, bool) {
	switch t := v.(type) {
	case int:
		return t, true
	case string:
		if lookup == nil {
			lookup = func(string) (string, bool) { return "", false }
		}
		s, unresolved := envexpand.Expand(t, lookup, nil)
		if len(unresolved) > 0 {
			return 0, false
		}
		port, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return 0, false
		}
		return port, true
	}
	return 0, false
}

func (p *parser) engineWorkers(n, top *yaml.Node) ([]EngineWorker, error) {
	if yamlnode.IsNull(n) {
		return nil, p.fail(compose.CodeInvalidComposeFile, n,
			"engine.workers has no value; write `workers: {}` for no engine workers (an `engine:` key with nothing under it is different: Compose then starts no engine)")
	}
	if n.Kind != yaml.MappingNode {
		hint := ""
		if n.Kind == yaml.SequenceNode {
			hint = " (the `- name:` list form belongs to config.yaml; here write `workers: { iii-worker-manager: { port: 49134 } }`)"
		}
		return nil, p.fail(compose.CodeInvalidComposeFile, n, "engine.workers must be a mapping from worker name to its settings, not %s%s", aKind(n), hint)
	}
	out := make([]EngineWorker, 0, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := k.Value
		path := "engine.workers." + name
		typ, inst, hasHash := strings.Cut(name, "#")
		if typ == "" || (hasHash && (inst == "" || strings.Contains(inst, "#"))) {
			return nil, p.fail(compose.CodeInvalidComposeFile, k, "engine worker name %q is malformed; write <type> or <type>#<instance> with a non-empty instance and a single #", name)
		}
		switch {
		case typ == engineWorkerSandbox:
			return nil, p.sandboxMoved(k, v, n, top)
		case contains(injectedEngineWorkers, typ):
			return nil, p.fail(compose.CodeEngineWorkerIsInjected, k, "%s: the engine starts %s by itself; delete this entry", path, typ)
		case typ == EngineWorkerConfiguration, typ == EngineWorkerManager, typ == EngineWorkerHTTPFunctions, typ == EngineWorkerStream:
		default:
			return nil, p.fail(compose.CodeUnsupportedEngineWorker, k,
				"%s: engine.workers configures only the engine's own workers (configuration, iii-worker-manager, iii-http-functions, iii-stream, each with an optional #instance suffix); a project worker goes under containers: with worker: path://<dir> or package://<name>",
				path)
		}
		if yamlnode.IsNull(v) {
			return nil, p.fail(compose.CodeInvalidEngineWorkerConfig, v, "%s has no value; write `%s: {}` for its defaults", path, name)
		}
		if v.Kind != yaml.MappingNode {
			return nil, p.fail(compose.CodeInvalidEngineWorkerConfig, v, "%s must be a mapping of the worker's settings ({} = defaults), not %s", path, aKind(v))
		}
		for j := 0; j+1 < len(v.Content); j += 2 {
			if v.Content[j].Value == "config" {
				return nil, p.fail(compose.CodeInvalidEngineWorkerConfig, v.Content[j],
					"%s has a nested config: key; in a compose file the settings go directly under %s (drop the config: level)", path, path)
			}
		}
		cfg, err := p.opaque(v, path)
		if err != nil {
			return nil, err
		}
		out = append(out, EngineWorker{Name: name, Config: cfg, Node: v, Line: k.Line})
	}
	return out, nil
}

func (p *parser) sandbox(n *yaml.Node) (*SandboxBinding, error) {
	if err := p.mapping(n, "engine.sandbox"); err != nil {
		return nil, err
	}
	sb := &SandboxBinding{Adapter: DefaultSandboxAdapter}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch k.Value {
		case "adapter":
			s, err := p.nonEmpty(v, "engine.sandbox.adapter")
			if err != nil {
				return nil, err
			}
			// The generated engine config carries this name, so the rule is
			// config.yaml's: contract.ValidAdapterName.
			if !contract.ValidAdapterName(s) {
				return nil, p.fail(compose.CodeInvalidComposeFile, v,
					"engine.sandbox.adapter %q is not a valid adapter worker name: use 1 to 64 characters from a-z, 0-9, _ and -, starting with a letter or digit (the default is sandbox-libkrun)", clip(s, 80))
			}
			sb.Adapter = s
		case "namespace":
			ns, err := p.namespace(v, "engine.sandbox.namespace")
			if err != nil {
				return nil, err
			}
			sb.Namespace, sb.NamespaceSet = ns, true
		default:
			return nil, p.fail(compose.CodeInvalidComposeFile, k, "unknown key %q in engine.sandbox; it has adapter and namespace (the adapter's settings go in containers.%s.config_override)", k.Value, DefaultSandboxAdapter)
		}
	}
	return sb, nil
}

// sandboxMoved builds SANDBOX_CONFIG_MOVED: the message prints the
// container that replaces engine.workers.iii-sandbox with the old settings
// filled in, so the fix is a copy and paste.
func (p *parser) sandboxMoved(k, v, workers, top *yaml.Node) error {
	var b strings.Builder
	fmt.Fprintf(&b, "engine.workers.%s: in iii 0.26 the engine no longer runs sandboxes; the %s worker does, as a container of your project. ", k.Value, AdapterPackage)
	declared := hasContainer(top, AdapterPackage)
	if declared {
		fmt.Fprintf(&b, "Delete the %s entry and move its settings under the config_override of the containers.%s you already declare:\n\n", k.Value, AdapterPackage)
	} else {
		fmt.Fprintf(&b, "Delete the %s entry and declare the adapter with your old settings under config_override:\n\n", k.Value)
	}
	b.WriteString("containers:\n")
	fmt.Fprintf(&b, "  %s:\n", AdapterPackage)
	fmt.Fprintf(&b, "    worker: package://%s\n", AdapterPackage)
	fmt.Fprintf(&b, "    version: '%s'\n", AdapterSelector)
	if v != nil && v.Kind == yaml.MappingNode && len(v.Content) > 0 {
		b.WriteString("    config_override:\n")
		writeBlockMapping(&b, v, 6)
	}
	fmt.Fprintf(&b, "\nengine.sandbox binds the engine's sandbox router to the adapter; adapter defaults to %s and namespace to the project namespace, so you can leave it out.", DefaultSandboxAdapter)
	if len(workers.Content) == 2 {
		b.WriteString("\n" + k.Value + " was the only entry under engine.workers: write `workers: {}` (an empty `workers:` fails with INVALID_COMPOSE_FILE, and `engine:` with nothing under it starts no engine).")
	}
	return p.fail(compose.CodeSandboxConfigMoved, k, "%s", b.String())
}

func hasContainer(top *yaml.Node, key string) bool {
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value != "containers" {
			continue
		}
		cs := top.Content[i+1]
		if cs.Kind != yaml.MappingNode {
			return false
		}
		for j := 0; j+1 < len(cs.Content); j += 2 {
			if cs.Content[j].Value == key {
				return true
			}
		}
	}
	return false
}

// writeBlockMapping writes n in block style at indent, with list items at
// their key's indent (the shape the upgrade guide shows), whatever style
// the user wrote it in.
func writeBlockMapping(b *strings.Builder, n *yaml.Node, indent int) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		b.WriteString(strings.Repeat(" ", indent))
		b.WriteString(renderScalar(n.Content[i]))
		writeAfterKey(b, n.Content[i+1], indent)
	}
}

func writeAfterKey(b *strings.Builder, v *yaml.Node, indent int) {
	switch {
	case v.Kind == yaml.MappingNode && len(v.Content) > 0:
		b.WriteString(":\n")
		writeBlockMapping(b, v, indent+2)
	case v.Kind == yaml.SequenceNode && len(v.Content) > 0:
		b.WriteString(":\n")
		writeBlockSequence(b, v, indent)
	default:
		b.WriteString(": " + renderInline(v) + "\n")
	}
}

func writeBlockSequence(b *strings.Builder, n *yaml.Node, indent int) {
	for _, item := range n.Content {
		var sub strings.Builder
		switch {
		case item.Kind == yaml.MappingNode && len(item.Content) > 0:
			writeBlockMapping(&sub, item, indent+2)
		case item.Kind == yaml.SequenceNode && len(item.Content) > 0:
			writeBlockSequence(&sub, item, indent+2)
		default:
			b.WriteString(strings.Repeat(" ", indent) + "- " + renderInline(item) + "\n")
			continue
		}
		s := sub.String()
		b.WriteString(strings.Repeat(" ", indent) + "- " + s[indent+2:])
	}
}

func renderInline(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "{}"
	case yaml.SequenceNode:
		return "[]"
	}
	return renderScalar(n)
}

// renderScalar writes a scalar on one line with the quoting YAML needs to
// read it back as the same value.
func renderScalar(n *yaml.Node) string {
	style := n.Style & (yaml.DoubleQuotedStyle | yaml.SingleQuotedStyle)
	c := &yaml.Node{Kind: yaml.ScalarNode, Tag: n.ShortTag(), Value: n.Value, Style: style}
	out, err := yaml.Marshal(c)
	s := strings.TrimSuffix(string(out), "\n")
	if err != nil || strings.Contains(s, "\n") || s == "" {
		// Long or multi-line text: a JSON string is valid YAML and stays
		// on one line.
		j, _ := json.Marshal(n.Value)
		return string(j)
	}
	return s
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
