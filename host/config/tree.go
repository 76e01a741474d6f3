package config

import (
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// maxNodes bounds the node count after aliases are unfolded, so a small
// file with nested aliases ("billion laughs") cannot make the engine build
// a huge tree.
const maxNodes = 100_000

// YAML tags as yaml.v3 reports them in Node.ShortTag.
const (
	tagStr   = "!!str"
	tagInt   = "!!int"
	tagNull  = "!!null"
	tagBool  = "!!bool"
	tagFloat = "!!float"
)

// unfold copies a node tree with every alias replaced by a copy of its
// anchor. Later passes mutate scalars (placeholder expansion) and must not
// see one node twice through an alias.
func (p *parser) unfold(n *yaml.Node, budget *int) (*yaml.Node, error) {
	if n == nil {
		return nil, nil
	}
	*budget--
	if *budget < 0 {
		return nil, p.fail(CodeInvalidConfig, n, "the document is too large once its aliases are unfolded (more than %d nodes)", maxNodes)
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			return nil, p.fail(CodeInvalidConfig, n, "alias without an anchor")
		}
		c, err := p.unfold(n.Alias, budget)
		if err != nil {
			return nil, err
		}
		// Keep the alias's own position so errors point at the use.
		c.Line, c.Column = n.Line, n.Column
		c.Anchor = ""
		return c, nil
	}
	c := *n
	c.Content = nil
	if len(n.Content) > 0 {
		c.Content = make([]*yaml.Node, 0, len(n.Content))
		for _, child := range n.Content {
			cc, err := p.unfold(child, budget)
			if err != nil {
				return nil, err
			}
			c.Content = append(c.Content, cc)
		}
	}
	return &c, nil
}

// checkDuplicateKeys walks every mapping: yaml.v3 decodes into a Node
// without complaining about repeated keys, and a repeated key silently
// dropping the first value is exactly the kind of surprise config.yaml
// must refuse.
func (p *parser) checkDuplicateKeys(n *yaml.Node, path string) error {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for i, c := range n.Content {
			if err := p.checkDuplicateKeys(c, itemPath(n, path, i)); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		seen := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			key := k.Value
			if k.Kind != yaml.ScalarNode {
				return p.fail(CodeInvalidConfig, k, "%s: a mapping key must be a plain value, not a %s", orTop(path), kindName(k))
			}
			if first, dup := seen[key]; dup {
				return p.fail(CodeInvalidConfig, k, "key %q appears twice in %s (first at line %d); keep one", key, orTop(path), first)
			}
			seen[key] = k.Line
			if err := p.checkDuplicateKeys(n.Content[i+1], joinPath(path, key)); err != nil {
				return err
			}
		}
	}
	return nil
}

// placeholders shields ${...} from the YAML parser. The engine syntax is
// written inside flow mappings (`config: { port: ${PORT:3112} }`), where
// a raw "{" or "}" is YAML syntax, so each placeholder is swapped for an
// alphanumeric token before parsing and expanded on the node tree after.
// Working on nodes, not text, also means a variable's value can never add
// keys or lines to the document, and placeholders in comments are ignored.
type placeholders struct {
	prefix string
	text   []string // token i stands for text[i]
}

// tokenize replaces every placeholder in data with a token. Equal
// placeholders share a token so duplicate-key checks still see equal keys.
func tokenize(data []byte) (string, *placeholders) {
	src := string(data)
	ph := &placeholders{}
	ps := Placeholders(src)
	if len(ps) == 0 {
		return src, ph
	}
	// The prefix must not occur in the file, or user text could pass for a
	// token.
	for n := 0; ; n++ {
		ph.prefix = fmt.Sprintf("iiiph%dx", n)
		if !strings.Contains(src, ph.prefix) {
			break
		}
	}
	index := map[string]int{}
	var b strings.Builder
	last := 0
	for _, p := range ps {
		text := src[p.Start:p.End]
		i, ok := index[text]
		if !ok {
			i = len(ph.text)
			index[text] = i
			ph.text = append(ph.text, text)
		}
		b.WriteString(src[last:p.Start])
		fmt.Fprintf(&b, "%s%dz", ph.prefix, i)
		last = p.End
	}
	b.WriteString(src[last:])
	return b.String(), ph
}

// replace rewrites each token in s with f(placeholder text).
func (ph *placeholders) replace(s string, f func(text string) string) (string, bool) {
	if ph.prefix == "" || !strings.Contains(s, ph.prefix) {
		return s, false
	}
	var b strings.Builder
	found := false
	for {
		j := strings.Index(s, ph.prefix)
		if j < 0 {
			b.WriteString(s)
			return b.String(), found
		}
		k := j + len(ph.prefix)
		d := k
		for d < len(s) && s[d] >= '0' && s[d] <= '9' {
			d++
		}
		i, err := strconv.Atoi(s[k:d])
		if d == k || d >= len(s) || s[d] != 'z' || err != nil || i >= len(ph.text) {
			b.WriteString(s[:k])
			s = s[k:]
			continue
		}
		b.WriteString(s[:j])
		b.WriteString(f(ph.text[i]))
		found = true
		s = s[d+1:]
	}
}

// restore puts the placeholders back as written.
func (ph *placeholders) restore(s string) string {
	out, _ := ph.replace(s, func(text string) string { return text })
	return out
}

// restoreKeys puts placeholders back in mapping keys: keys are names, never
// expanded.
func (ph *placeholders) restoreKeys(n *yaml.Node) {
	for i, c := range n.Content {
		if n.Kind == yaml.MappingNode && i%2 == 0 {
			c.Value = ph.restore(c.Value)
			continue
		}
		ph.restoreKeys(c)
	}
}

// unresolvedVar is a placeholder whose variable is unset and has no
// default; the first in document order is reported, after the worker list
// has been judged.
type unresolvedVar struct {
	node *yaml.Node
	path string
	name string
}

// expandTree expands placeholders in every scalar value. A plain
// (unquoted) value is then read as if its expanded text had been written
// in its place, so `port: ${PORT:49134}` is an integer; a quoted one stays
// a string.
func (p *parser) expandTree(n *yaml.Node, path string, out *[]unresolvedVar) {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for i, c := range n.Content {
			p.expandTree(c, itemPath(n, path, i), out)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			p.expandTree(n.Content[i+1], joinPath(path, n.Content[i].Value), out)
		}
	case yaml.ScalarNode:
		value, found := p.ph.replace(n.Value, func(text string) string {
			v, unresolved := Expand(text, p.lookup, nil)
			for _, name := range unresolved {
				*out = append(*out, unresolvedVar{node: n, path: path, name: name})
			}
			return v
		})
		if !found {
			return
		}
		n.Value = value
		if n.Style&(yaml.TaggedStyle|yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) == 0 {
			n.Tag = ""
			n.Style = 0
			n.Tag = n.ShortTag()
		}
	}
}

func (p *parser) unsetError(u unresolvedVar) *Error {
	return p.fail(CodeUnsetVariable, u.node,
		"%s: ${%s} is not set and has no default; set the variable in the engine's environment or give a default: ${%s:value}",
		orTop(u.path), u.name, u.name)
}

func itemPath(n *yaml.Node, path string, i int) string {
	if n.Kind == yaml.SequenceNode {
		return fmt.Sprintf("%s[%d]", path, i)
	}
	return path
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orTop(path string) string {
	if path == "" {
		return "the top level"
	}
	return path
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

func isNull(n *yaml.Node) bool {
	return n == nil || (n.Kind == yaml.ScalarNode && n.ShortTag() == tagNull)
}
