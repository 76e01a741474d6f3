// Package yamlbuild builds and walks the yaml.Node trees Compose writes
// itself: the compose file's edits (compose/fileedit) and the managed
// engine's generated config.yaml (compose/engineproc). Both import it
// rather than each other, so they stay independent parts of the daemon
// (tests/layers). The strict readers' helpers are internal/yamlnode.
package yamlbuild

import (
	"strconv"

	"gopkg.in/yaml.v3"
)

// Str is a string scalar. The explicit !!str tag makes the encoder quote
// a value that would otherwise read back as another type ("8080", "true").
func Str(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }

// Int is an integer scalar.
func Int(n int) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(n)}
}

// Map is a block mapping of alternating keys and values.
func Map(kv ...*yaml.Node) *yaml.Node {
	return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: kv}
}

// Child is the value of key in mapping n (nil when n is no mapping or
// has no such key).
func Child(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// ChildMap is the mapping under key in mapping n, appended empty when
// key is absent. It is nil when n is no mapping or key holds something
// other than a mapping: a value the caller does not understand is left
// as the user wrote it rather than overwritten.
func ChildMap(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	c := Child(n, key)
	if c == nil {
		c = Map()
		n.Content = append(n.Content, Str(key), c)
	}
	if c.Kind != yaml.MappingNode {
		return nil
	}
	return c
}
