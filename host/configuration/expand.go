package configuration

import (
	"encoding/json"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/host/config"
)

// versionDefault is the default literal that stands for the engine version,
// so a worker's config can pin `${IMAGE_TAG:__III_ENGINE_VERSION__}`.
const versionDefault = "__III_ENGINE_VERSION__"

// expander expands ${VAR} / ${VAR:default} in the string leaves of a value
// against the live environment; it runs on every read, so a changed
// variable is seen without a restart.
type expander struct {
	lookup  config.LookupFunc
	version string
}

func (x expander) defaults(d string) string {
	if d == versionDefault {
		return x.version
	}
	return d
}

// expand returns the value with placeholders replaced, and the names of
// variables that were unset and had no default (those placeholders stay
// as written).
func (x expander) expand(raw json.RawMessage) (json.RawMessage, []string, error) {
	n, err := jsonToNode(raw)
	if err != nil {
		return nil, nil, err
	}
	var unresolved []string
	if !x.walk(n, &unresolved) {
		return raw, nil, nil
	}
	out, err := nodeToJSON(n)
	return out, unresolved, err
}

// walk reports whether anything changed.
func (x expander) walk(n *yaml.Node, unresolved *[]string) bool {
	changed := false
	switch n.Kind {
	case yaml.MappingNode:
		// Keys are names, never expanded.
		for i := 1; i < len(n.Content); i += 2 {
			changed = x.walk(n.Content[i], unresolved) || changed
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			changed = x.walk(c, unresolved) || changed
		}
	case yaml.ScalarNode:
		if n.Tag != "!!str" || len(config.Placeholders(n.Value)) == 0 {
			return false
		}
		single := config.IsSinglePlaceholder(n.Value)
		out, names := config.Expand(n.Value, x.lookup, x.defaults)
		*unresolved = append(*unresolved, names...)
		n.Value = out
		if single && len(names) == 0 {
			retype(n)
		}
		return true
	}
	return changed
}

// retype reads a string that was exactly one placeholder as a YAML scalar:
// "${PORT:3111}" becomes the number 3111, "true" a boolean, "" null.
// Anything that is not a plain scalar (a list, a mapping, NaN) stays a
// string: an environment variable never injects structure.
func retype(n *yaml.Node) {
	probe := yaml.Node{Kind: yaml.ScalarNode, Value: n.Value}
	switch tag := probe.ShortTag(); tag {
	case "!!int", "!!bool", "!!null":
		n.Tag = tag
	case "!!float":
		var f float64
		if probe.Decode(&f) == nil && f-f == 0 { // finite
			n.Tag = tag
		}
	}
}
