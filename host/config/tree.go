package config

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/internal/yamlnode"
)

// unfold copies a node tree with every alias replaced by a copy of its
// anchor. Later passes mutate scalars (placeholder expansion) and must not
// see one node twice through an alias.
func (p *parser) unfold(n *yaml.Node, budget *int) (*yaml.Node, error) {
	c, bad, msg := yamlnode.Unfold(n, budget)
	if bad != nil {
		return nil, p.fail(CodeInvalidConfig, bad, "%s", msg)
	}
	return c, nil
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
				return p.fail(CodeInvalidConfig, k, "%s: a mapping key must be a plain value, not a %s", orTop(path), yamlnode.KindName(k))
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

// tokenize hides every placeholder in data from the YAML parser behind a
// token (see yamlnode.Shield): the engine syntax is written inside flow
// mappings (`config: { port: ${PORT:3112} }`), where a raw "{" or "}" is
// YAML syntax. Placeholders in comments are restored untouched.
func tokenize(data []byte) (string, *yamlnode.Shield) {
	src := string(data)
	ps := Placeholders(src)
	spans := make([]yamlnode.Span, len(ps))
	for i, p := range ps {
		spans[i] = yamlnode.Span{Start: p.Start, End: p.End}
	}
	return yamlnode.NewShield(src, "iiiph", spans)
}

// restoreKeys puts placeholders back in mapping keys: keys are names, never
// expanded.
func restoreKeys(ph *yamlnode.Shield, n *yaml.Node) {
	for i, c := range n.Content {
		if n.Kind == yaml.MappingNode && i%2 == 0 {
			c.Value = ph.Restore(c.Value)
			continue
		}
		restoreKeys(ph, c)
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
		asWritten := n.Value
		value, found := p.ph.Replace(n.Value, func(text string) string {
			v, unresolved := Expand(text, p.lookup, nil)
			for _, name := range unresolved {
				*out = append(*out, unresolvedVar{node: n, path: path, name: name})
			}
			return v
		})
		if !found {
			return
		}
		if p.written == nil {
			p.written = map[*yaml.Node]string{}
		}
		p.written[n] = p.ph.Restore(asWritten)
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
