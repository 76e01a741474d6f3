package composefile

import (
	"fmt"
	"math"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/internal/yamlnode"
)

// maxFileSize bounds what Compose reads; a real compose file is a few KiB.
const maxFileSize = 4 << 20

// shieldRefs hides every "${...}" in data from the YAML parser behind a
// token (see yamlnode.Shield). A span ends at the first "}" on the same
// line. Spans holding quote characters or a backslash are left alone:
// inside a quoted scalar YAML must decode those itself, and outside one
// they cannot be a well-formed reference anyway.
func shieldRefs(data []byte) (string, *yamlnode.Shield) {
	src := string(data)
	var spans []yamlnode.Span
	for i := 0; i < len(src); {
		j := strings.Index(src[i:], "${")
		if j < 0 {
			break
		}
		start := i + j
		end := -1
		for k := start + 2; k < len(src); k++ {
			c := src[k]
			if c == '}' {
				end = k + 1
				break
			}
			if c == '\n' || c == '\r' || c == '"' || c == '\'' || c == '\\' {
				break
			}
		}
		if end < 0 {
			i = start + 2
			continue
		}
		spans = append(spans, yamlnode.Span{Start: start, End: end})
		i = end
	}
	return yamlnode.NewShield(src, "iiiref", spans)
}

// restoreTree puts the references back in every scalar of n, as written.
// A plain scalar that held a token was typed by YAML as a string; with its
// text restored it stays a string, which is what a reference is until it
// is expanded.
func restoreTree(sh *yamlnode.Shield, n *yaml.Node) {
	if n == nil {
		return
	}
	if n.Kind == yaml.ScalarNode {
		n.Value = sh.Restore(n.Value)
		return
	}
	for _, c := range n.Content {
		restoreTree(sh, c)
	}
}

// aKind is kindName with its article, for "must be X, not a list".
func aKind(n *yaml.Node) string {
	k := yamlnode.KindName(n)
	switch k {
	case "null":
		return k
	case "integer", "alias":
		return "an " + k
	}
	return "a " + k
}

// toValue converts an opaque subtree (config_override, engine.workers
// values) to plain Go values with YAML types kept: mappings become
// map[string]any, sequences []any, integers int (int64 range) or float64
// beyond it, floats float64, booleans bool, null nil, and everything else
// (strings, timestamps, binary) its text. The result always encodes to
// JSON, so it can travel in compose::* payloads.
func toValue(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			v, err := toValue(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			m[n.Content[i].Value] = v
		}
		return m, nil
	case yaml.SequenceNode:
		l := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := toValue(c)
			if err != nil {
				return nil, err
			}
			l = append(l, v)
		}
		return l, nil
	case yaml.ScalarNode:
		return scalarValue(n)
	}
	return nil, fmt.Errorf("unexpected %s", yamlnode.KindName(n))
}

func scalarValue(n *yaml.Node) (any, error) {
	switch n.ShortTag() {
	case yamlnode.TagNull:
		return nil, nil
	case yamlnode.TagBool:
		var b bool
		if err := n.Decode(&b); err != nil {
			return nil, err
		}
		return b, nil
	case yamlnode.TagInt:
		var i int64
		if err := n.Decode(&i); err == nil && i >= math.MinInt && i <= math.MaxInt {
			return int(i), nil
		}
		// Beyond int64: keep the magnitude as a float rather than fail;
		// the receiving worker decides whether it accepts it.
		var u uint64
		if err := n.Decode(&u); err == nil {
			return float64(u), nil
		}
		return n.Value, nil
	case yamlnode.TagFloat:
		var f float64
		if err := n.Decode(&f); err != nil {
			return nil, err
		}
		// NaN and infinities do not exist in JSON; keep them as written.
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return n.Value, nil
		}
		return f, nil
	}
	return n.Value, nil
}
