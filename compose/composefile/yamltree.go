package composefile

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// maxNodes bounds the tree once aliases are unfolded, so a small file with
// nested aliases ("billion laughs") cannot make Compose build a huge tree.
const maxNodes = 100_000

// maxFileSize bounds what Compose reads; a real compose file is a few KiB.
const maxFileSize = 4 << 20

// YAML tags as yaml.v3 reports them in Node.ShortTag.
const (
	tagStr   = "!!str"
	tagInt   = "!!int"
	tagNull  = "!!null"
	tagBool  = "!!bool"
	tagFloat = "!!float"
	tagMerge = "!!merge"
)

// shield hides every "${...}" from the YAML parser. References are written
// inside flow mappings (`config_override: { key: ${SECRET} }`), where a raw
// "{" or "}" is YAML syntax; each one is swapped for an alphanumeric token
// before parsing and put back on the node tree after, so a reference reads
// the same in block and flow style. Working on nodes also means a
// variable's value can never add keys or lines to the document.
type shield struct {
	prefix string
	text   []string // token i stands for text[i]
}

// shieldRefs replaces "${...}" spans in data with tokens. A span ends at
// the first "}" on the same line. Spans holding quote characters or a
// backslash are left alone: inside a quoted scalar YAML must decode those
// itself, and outside one they cannot be a well-formed reference anyway.
func shieldRefs(data []byte) (string, *shield) {
	src := string(data)
	sh := &shield{}
	if !strings.Contains(src, "${") {
		return src, sh
	}
	// The prefix must not occur in the file, or user text could pass for a
	// token.
	for n := 0; ; n++ {
		sh.prefix = fmt.Sprintf("iiiref%dx", n)
		if !strings.Contains(src, sh.prefix) {
			break
		}
	}
	index := map[string]int{}
	var b strings.Builder
	b.Grow(len(src))
	for i := 0; i < len(src); {
		j := strings.Index(src[i:], "${")
		if j < 0 {
			b.WriteString(src[i:])
			break
		}
		start := i + j
		b.WriteString(src[i:start])
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
			b.WriteString("${")
			i = start + 2
			continue
		}
		text := src[start:end]
		t, ok := index[text]
		if !ok {
			t = len(sh.text)
			index[text] = t
			sh.text = append(sh.text, text)
		}
		fmt.Fprintf(&b, "%s%dz", sh.prefix, t)
		i = end
	}
	return b.String(), sh
}

// restore puts the shielded references of s back as written.
func (sh *shield) restore(s string) string {
	if sh.prefix == "" || !strings.Contains(s, sh.prefix) {
		return s
	}
	var b strings.Builder
	for {
		j := strings.Index(s, sh.prefix)
		if j < 0 {
			b.WriteString(s)
			return b.String()
		}
		k := j + len(sh.prefix)
		d := k
		for d < len(s) && s[d] >= '0' && s[d] <= '9' {
			d++
		}
		t, err := strconv.Atoi(s[k:d])
		if d == k || d >= len(s) || s[d] != 'z' || err != nil || t >= len(sh.text) {
			b.WriteString(s[:k])
			s = s[k:]
			continue
		}
		b.WriteString(s[:j])
		b.WriteString(sh.text[t])
		s = s[d+1:]
	}
}

// restoreTree puts the references back in every scalar of n, as written.
// A plain scalar that held a token was typed by YAML as a string; with its
// text restored it stays a string, which is what a reference is until it
// is expanded.
func (sh *shield) restoreTree(n *yaml.Node) {
	if n == nil || sh.prefix == "" {
		return
	}
	if n.Kind == yaml.ScalarNode {
		n.Value = sh.restore(n.Value)
		return
	}
	for _, c := range n.Content {
		sh.restoreTree(c)
	}
}

// unfold copies a node tree with every alias replaced by a copy of its
// anchor, so each later pass sees every node once and the tree size is
// bounded.
func unfold(n *yaml.Node, budget *int) (*yaml.Node, *yaml.Node, string) {
	if n == nil {
		return nil, nil, ""
	}
	*budget--
	if *budget < 0 {
		return nil, n, fmt.Sprintf("the document is too large once its aliases are unfolded (more than %d nodes)", maxNodes)
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			return nil, n, "alias without an anchor"
		}
		c, bad, msg := unfold(n.Alias, budget)
		if bad != nil {
			return nil, bad, msg
		}
		// Keep the alias's own position so errors point at the use.
		c.Line, c.Column = n.Line, n.Column
		c.Anchor = ""
		return c, nil, ""
	}
	c := *n
	c.Content = nil
	if len(n.Content) > 0 {
		c.Content = make([]*yaml.Node, 0, len(n.Content))
		for _, child := range n.Content {
			cc, bad, msg := unfold(child, budget)
			if bad != nil {
				return nil, bad, msg
			}
			c.Content = append(c.Content, cc)
		}
	}
	return &c, nil, ""
}

// isNull reports an explicit or implicit YAML null (`key:` with no value).
func isNull(n *yaml.Node) bool {
	return n == nil || (n.Kind == yaml.ScalarNode && n.ShortTag() == tagNull)
}

// aKind is kindName with its article, for "must be X, not a list".
func aKind(n *yaml.Node) string {
	k := kindName(n)
	switch k {
	case "null":
		return k
	case "integer", "alias":
		return "an " + k
	}
	return "a " + k
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case tagNull:
			return "null"
		case tagInt:
			return "integer"
		case tagFloat:
			return "number"
		case tagBool:
			return "boolean"
		}
		return "string"
	case yaml.AliasNode:
		return "alias"
	}
	return "document"
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
	return nil, fmt.Errorf("unexpected %s", kindName(n))
}

func scalarValue(n *yaml.Node) (any, error) {
	switch n.ShortTag() {
	case tagNull:
		return nil, nil
	case tagBool:
		var b bool
		if err := n.Decode(&b); err != nil {
			return nil, err
		}
		return b, nil
	case tagInt:
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
	case tagFloat:
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
