package yamlbuild

import (
	"testing"

	"gopkg.in/yaml.v3"
	"gotest.tools/v3/assert"
)

// top is the top node of the document src.
func top(t *testing.T, src string) *yaml.Node {
	t.Helper()
	var doc yaml.Node
	err := yaml.Unmarshal([]byte(src), &doc)
	assert.NilError(t, err)
	assert.Assert(t, len(doc.Content) == 1, "%q", src)
	return doc.Content[0]
}

func encode(t *testing.T, n *yaml.Node) string {
	t.Helper()
	out, err := yaml.Marshal(n)
	assert.NilError(t, err)
	return string(out)
}

func TestChild(t *testing.T) {
	for _, tc := range []struct {
		name, src, key string
		want           string // "" = nil
	}{
		{"present", "a: 1\nb: two\n", "b", "two"},
		{"absent", "a: 1\n", "b", ""},
		{"a list has no keys", "- b\n- c\n", "b", ""},
		{"a scalar has no keys", "b\n", "b", ""},
		{"a value is not a key", "a: b\n", "b", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Child(top(t, tc.src), tc.key)
			if tc.want == "" {
				assert.Check(t, got == nil, "got %v", got)
				return
			}
			assert.Assert(t, got != nil)
			assert.Equal(t, got.Value, tc.want)
		})
	}
	assert.Check(t, Child(nil, "a") == nil)
}

func TestChildMap(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		wantNil   bool
		after     string // the tree after ChildMap and one key set in the result
	}{
		{"an existing mapping is reused", "a:\n  x: 1\n", false, "a:\n    x: 1\n    k: v\n"},
		{"an absent key gets an empty mapping", "b: 2\n", false, "b: 2\na:\n    k: v\n"},
		{"a scalar is left alone", "a: ./dir\n", true, "a: ./dir\n"},
		{"a list is left alone", "a: [x]\n", true, "a: [x]\n"},
		{"no mapping to add to", "- a\n", true, "- a\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := top(t, tc.src)
			m := ChildMap(n, "a")
			assert.Equal(t, m == nil, tc.wantNil)
			if m != nil {
				m.Content = append(m.Content, Str("k"), Str("v"))
			}
			assert.Equal(t, encode(t, n), tc.after)
		})
	}
	assert.Check(t, ChildMap(nil, "a") == nil)
}

// TestScalarsReadBack: what the builders write reads back as the type
// meant, a string that looks like a number or a boolean included.
func TestScalarsReadBack(t *testing.T) {
	out := encode(t, Map(Str("port"), Str("8080"), Str("on"), Str("true"), Str("n"), Int(3)))
	var back map[string]any
	assert.NilError(t, yaml.Unmarshal([]byte(out), &back))
	assert.DeepEqual(t, back, map[string]any{"port": "8080", "on": "true", "n": 3})
}
