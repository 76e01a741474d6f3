package yamlnode

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	"gotest.tools/v3/assert"
)

func parse(t *testing.T, src string) *yaml.Node {
	t.Helper()
	var doc yaml.Node
	assert.NilError(t, yaml.Unmarshal([]byte(src), &doc))
	return &doc
}

func TestKindNameAndIsNull(t *testing.T) {
	for _, tc := range []struct {
		src, kind string
		null      bool
	}{
		{"{a: 1}", "mapping", false},
		{"[1]", "list", false},
		{"x", "string", false},
		{"'1'", "string", false},
		{"1", "integer", false},
		{"1.5", "number", false},
		{"true", "boolean", false},
		{"~", "null", true},
	} {
		t.Run(tc.src, func(t *testing.T) {
			n := parse(t, tc.src).Content[0]
			assert.Equal(t, KindName(n), tc.kind)
			assert.Equal(t, IsNull(n), tc.null)
		})
	}
	assert.Check(t, IsNull(nil))
	assert.Equal(t, KindName(&yaml.Node{Kind: yaml.AliasNode}), "alias")
	assert.Equal(t, KindName(&yaml.Node{Kind: yaml.DocumentNode}), "document")
}

func TestUnfold(t *testing.T) {
	doc := parse(t, "a: &x {k: v}\nb: *x\n")
	budget := MaxNodes
	out, bad, msg := Unfold(doc, &budget)
	assert.Assert(t, bad == nil, msg)
	top := out.Content[0]
	b := top.Content[3]
	assert.Equal(t, b.Kind, yaml.MappingNode, "the alias is replaced by its anchor's copy")
	assert.Equal(t, b.Line, 2, "the copy keeps the alias's position")
	assert.Equal(t, b.Anchor, "")
	b.Content[1].Value = "changed"
	assert.Equal(t, top.Content[1].Content[1].Value, "v", "the copy is not shared with the anchor")

	t.Run("budget", func(t *testing.T) {
		src := "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
		budget := 500
		_, bad, msg := Unfold(parse(t, src), &budget)
		assert.Assert(t, bad != nil)
		assert.Check(t, strings.Contains(msg, "too large once its aliases are unfolded"), msg)
	})
	t.Run("alias without anchor", func(t *testing.T) {
		budget := MaxNodes
		n := &yaml.Node{Kind: yaml.AliasNode, Line: 3}
		_, bad, msg := Unfold(n, &budget)
		assert.Equal(t, bad, n)
		assert.Equal(t, msg, "alias without an anchor")
	})
}

// spansOf finds "${...}" spans without nesting, enough for the tests.
func spansOf(src string) []Span {
	var out []Span
	for i := 0; i < len(src); {
		j := strings.Index(src[i:], "${")
		if j < 0 {
			break
		}
		k := strings.IndexByte(src[i+j:], '}')
		if k < 0 {
			break
		}
		out = append(out, Span{Start: i + j, End: i + j + k + 1})
		i += j + k + 1
	}
	return out
}

func TestShield(t *testing.T) {
	for _, tc := range []struct {
		name, src, base, want string
	}{
		{"none", "a: b", "p", "a: b"},
		{"one", "a: {k: ${X}}", "p", "a: {k: p0x0z}"},
		{"equal texts share a token", "${A}: ${B} ${A}", "p", "p0x0z: p0x1z p0x0z"},
		{"prefix taken by user text", "p0x ${A}", "p", "p0x p1x0z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, sh := NewShield(tc.src, tc.base, spansOf(tc.src))
			assert.Equal(t, out, tc.want)
			assert.Equal(t, sh.Restore(out), tc.src)
		})
	}
	_, sh := NewShield("${A} ${B}", "p", spansOf("${A} ${B}"))
	got, found := sh.Replace("x p0x1z y", strings.ToLower)
	assert.Check(t, found)
	assert.Equal(t, got, "x ${b} y")
	got, found = sh.Replace("p0x9z p0xz p0x", strings.ToLower)
	assert.Check(t, !found, "tokens that name no reference are left alone")
	assert.Equal(t, got, "p0x9z p0xz p0x")
}

// FuzzShield checks that restoring a shielded document gives it back
// exactly, with the prefixes the two readers use (a prefix that overlaps
// itself, such as "x0x", could be forged by text next to a token; theirs
// cannot).
func FuzzShield(f *testing.F) {
	f.Add("a: {k: ${X}}\nb: ${Y:-d} ${X}", false)
	f.Add("iiiref0x iiiref1x ${A}", false)
	f.Add("iiiph0${A}x iiiph", true)
	f.Add("${", true)
	f.Fuzz(func(t *testing.T, src string, engine bool) {
		base := "iiiref"
		if engine {
			base = "iiiph"
		}
		out, sh := NewShield(src, base, spansOf(src))
		if got := sh.Restore(out); got != src {
			t.Fatalf("Restore(NewShield(%q)) = %q via %q", src, got, out)
		}
		_, _ = sh.Replace(out, func(s string) string { return s + s })
	})
}
