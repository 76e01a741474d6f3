package lockfile

import (
	"bytes"
	"fmt"
	"slices"
	"sort"

	"gopkg.in/yaml.v3"
)

// header opens every lock Compose writes.
const header = "# worker-compose.lock: the packages Compose resolved for worker-compose.yaml.\n" +
	"# Written by iii compose; commit it with the compose file and do not edit it by hand.\n"

func str(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }

func mapping(kv ...*yaml.Node) *yaml.Node {
	return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: kv}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Encode renders the lock: a comment header, then the fields in the order
// of the format (version, containers, graphs; worker, requested, resolved;
// ...) and every map — containers, artifacts, graphs, default_config — with
// its keys sorted, so the same lock is always the same bytes.
func (l *Lock) Encode() []byte {
	containers := mapping()
	for _, key := range sortedKeys(l.Containers) {
		e := l.Containers[key]
		arts := mapping()
		for _, t := range sortedKeys(e.Resolved.Artifacts) {
			a := e.Resolved.Artifacts[t]
			arts.Content = append(arts.Content, str(t), mapping(str("url"), str(a.URL), str("sha256"), str(a.SHA256)))
		}
		resolved := mapping(
			str("name"), str(e.Resolved.Name),
			str("version"), str(e.Resolved.Version),
			str("type"), str(e.Resolved.Type),
			str("artifacts"), arts,
			str("default_config"), valueNode(e.Resolved.DefaultConfig),
		)
		containers.Content = append(containers.Content, str(key),
			mapping(str("worker"), str(e.Worker), str("requested"), str(e.Requested), str("resolved"), resolved))
	}
	top := mapping(str("version"), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: fmt.Sprint(SchemaVersion)}, str("containers"), containers)
	if len(l.Graphs) > 0 {
		graphs := mapping()
		for _, root := range sortedKeys(l.Graphs) {
			nodes := slices.Clone(l.Graphs[root])
			slices.Sort(nodes)
			seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Style: yaml.FlowStyle}
			for _, n := range nodes {
				seq.Content = append(seq.Content, str(n))
			}
			graphs.Content = append(graphs.Content, str(root), seq)
		}
		top.Content = append(top.Content, str("graphs"), graphs)
	}

	var buf bytes.Buffer
	buf.WriteString(header)
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	// Encoding a tree built from plain values cannot fail; a failure here
	// would be a bug in this function, and it would show as an empty lock
	// that Decode refuses.
	_ = enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{top}})
	_ = enc.Close()
	return buf.Bytes()
}

// valueNode renders a default configuration with sorted keys and every
// string typed as a string (so "0123" or "true" stay strings).
func valueNode(v any) *yaml.Node {
	switch t := v.(type) {
	case nil:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
	case map[string]any:
		m := mapping()
		for _, k := range sortedKeys(t) {
			m.Content = append(m.Content, str(k), valueNode(t[k]))
		}
		return m
	case []any:
		s := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, x := range t {
			s.Content = append(s.Content, valueNode(x))
		}
		return s
	case string:
		return str(t)
	default:
		var n yaml.Node
		if err := n.Encode(t); err != nil {
			return str(fmt.Sprint(t))
		}
		return &n
	}
}
