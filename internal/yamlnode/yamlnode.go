// Package yamlnode holds what the strict YAML readers of config.yaml
// (host/config) and worker-compose.yaml (compose/composefile) both need on
// a yaml.v3 node tree: the type names their messages use, alias unfolding
// with a size budget, and the token shield that hides "${...}" references
// from the YAML parser. Each reader keeps its own error codes and wording
// around them.
package yamlnode

import (
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// MaxNodes bounds a tree once its aliases are unfolded, so a small file
// with nested aliases ("billion laughs") cannot build a huge tree.
const MaxNodes = 100_000

// YAML tags as yaml.v3 reports them in Node.ShortTag.
const (
	TagStr   = "!!str"
	TagInt   = "!!int"
	TagNull  = "!!null"
	TagBool  = "!!bool"
	TagFloat = "!!float"
	TagMerge = "!!merge"
)

// IsNull reports a missing node or an explicit or implicit YAML null
// (`key:` with no value).
func IsNull(n *yaml.Node) bool {
	return n == nil || (n.Kind == yaml.ScalarNode && n.ShortTag() == TagNull)
}

// KindName names a node's type the way messages to users do: "mapping",
// "list", "string", "integer", …
func KindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case TagNull:
			return "null"
		case TagInt:
			return "integer"
		case TagFloat:
			return "number"
		case TagBool:
			return "boolean"
		}
		return "string"
	case yaml.AliasNode:
		return "alias"
	}
	return "document"
}

// Unfold copies a node tree with every alias replaced by a copy of its
// anchor, so later passes (which may rewrite scalars) see every node once
// and the tree's size is bounded by *budget nodes. On failure it returns
// the node to blame and a message without position; the caller adds its
// own code and location.
func Unfold(n *yaml.Node, budget *int) (out, bad *yaml.Node, msg string) {
	if n == nil {
		return nil, nil, ""
	}
	*budget--
	if *budget < 0 {
		return nil, n, fmt.Sprintf("the document is too large once its aliases are unfolded (more than %d nodes)", MaxNodes)
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			return nil, n, "alias without an anchor"
		}
		c, bad, msg := Unfold(n.Alias, budget)
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
			cc, bad, msg := Unfold(child, budget)
			if bad != nil {
				return nil, bad, msg
			}
			c.Content = append(c.Content, cc)
		}
	}
	return &c, nil, ""
}

// Span is the byte range [Start, End) of one reference in a document.
type Span struct{ Start, End int }

// Shield stands alphanumeric tokens in for references such as "${VAR}".
// References are written inside flow mappings (`{ port: ${PORT} }`), where
// a raw "{" or "}" is YAML syntax; with each one swapped for a token
// before parsing and put back on the node tree after, a reference reads
// the same in block and flow style, and a variable's value can never add
// keys or lines to the document.
type Shield struct {
	prefix string
	text   []string // token i stands for text[i]
}

// NewShield replaces the spans of src (in order, not overlapping) with
// tokens "<base><n>x<i>z". Equal reference texts share a token, so
// duplicate-key checks still see equal keys. n is the smallest number that
// makes the prefix absent from src, so user text cannot pass for a token.
func NewShield(src, base string, spans []Span) (string, *Shield) {
	sh := &Shield{}
	if len(spans) == 0 {
		return src, sh
	}
	for n := 0; ; n++ {
		sh.prefix = base + strconv.Itoa(n) + "x"
		if !strings.Contains(src, sh.prefix) {
			break
		}
	}
	index := map[string]int{}
	var b strings.Builder
	b.Grow(len(src))
	last := 0
	for _, sp := range spans {
		text := src[sp.Start:sp.End]
		i, ok := index[text]
		if !ok {
			i = len(sh.text)
			index[text] = i
			sh.text = append(sh.text, text)
		}
		b.WriteString(src[last:sp.Start])
		b.WriteString(sh.prefix)
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('z')
		last = sp.End
	}
	b.WriteString(src[last:])
	return b.String(), sh
}

// Replace rewrites each token in s with f(reference text); found reports
// whether s held one.
func (sh *Shield) Replace(s string, f func(text string) string) (out string, found bool) {
	if sh.prefix == "" || !strings.Contains(s, sh.prefix) {
		return s, false
	}
	var b strings.Builder
	for {
		j := strings.Index(s, sh.prefix)
		if j < 0 {
			b.WriteString(s)
			return b.String(), found
		}
		k := j + len(sh.prefix)
		d := k
		for d < len(s) && s[d] >= '0' && s[d] <= '9' {
			d++
		}
		i, err := strconv.Atoi(s[k:d])
		if d == k || d >= len(s) || s[d] != 'z' || err != nil || i >= len(sh.text) {
			b.WriteString(s[:k])
			s = s[k:]
			continue
		}
		b.WriteString(s[:j])
		b.WriteString(f(sh.text[i]))
		found = true
		s = s[d+1:]
	}
}

// Restore puts the references in s back as written.
func (sh *Shield) Restore(s string) string {
	out, _ := sh.Replace(s, func(text string) string { return text })
	return out
}
