package envexpand

import (
	"testing"

	"gotest.tools/v3/assert"
)

// envOf is a LookupFunc over m.
func envOf(m map[string]string) LookupFunc {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func TestExpand(t *testing.T) {
	env := envOf(map[string]string{"PORT": "8080", "EMPTY": "", "HOST": "127.0.0.1"})
	tests := []struct {
		name, in, want string
		unresolved     []string
	}{
		{name: "no placeholder", in: "plain", want: "plain"},
		{name: "set variable", in: "${PORT}", want: "8080"},
		{name: "set wins over default", in: "${PORT:1}", want: "8080"},
		{name: "default", in: "${MISSING:3111}", want: "3111"},
		{name: "empty default", in: "${MISSING:}", want: ""},
		{name: "set to empty stays empty", in: "${EMPTY:x}", want: ""},
		{name: "single colon syntax keeps the dash", in: "${MISSING:-x}", want: "-x"},
		{name: "default with colons", in: "${MISSING:http://a:1}", want: "http://a:1"},
		{name: "embedded", in: "ws://${HOST}:${PORT}/", want: "ws://127.0.0.1:8080/"},
		{name: "unset without default stays", in: "a${MISSING}b", want: "a${MISSING}b", unresolved: []string{"MISSING"}},
		{name: "bad name is text", in: "${1X}", want: "${1X}"},
		{name: "empty name is text", in: "${}", want: "${}"},
		{name: "unclosed is text", in: "${PORT", want: "${PORT"},
		{name: "unclosed default is text", in: "${PORT:1", want: "${PORT:1"},
		{name: "dollar alone", in: "$PORT $", want: "$PORT $"},
		{name: "name with space is text", in: "${A B}", want: "${A B}"},
		{name: "nested braces", in: "${${PORT}}", want: "${8080}"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, unresolved := Expand(tc.in, env, nil)
			assert.Equal(t, got, tc.want)
			assert.DeepEqual(t, unresolved, tc.unresolved)
		})
	}
}

func TestExpandDefaultsHook(t *testing.T) {
	got, _ := Expand("v${V:__VERSION__}", envOf(nil), func(d string) string {
		if d == "__VERSION__" {
			return "0.26.0"
		}
		return d
	})
	assert.Equal(t, got, "v0.26.0")
}

func TestIsSinglePlaceholder(t *testing.T) {
	for in, want := range map[string]bool{
		"${A}":      true,
		"${A:1}":    true,
		"${A}${B}":  false,
		" ${A}":     false,
		"${A} ":     false,
		"x":         false,
		"${1}":      false,
		"${A:}":     true,
		"${A:b}c}":  false,
		"${A:${B}}": false,
	} {
		assert.Equal(t, IsSinglePlaceholder(in), want, in)
	}
}

func FuzzExpand(f *testing.F) {
	for _, s := range []string{"${A}", "${A:1}", "x${B:}y", "${", "${A", "${A:", "$${A}", "${A:${B}}"} {
		f.Add(s)
	}
	env := envOf(map[string]string{"A": "1", "B": "${A}"})
	f.Fuzz(func(t *testing.T, s string) {
		out, unresolved := Expand(s, env, nil)
		if len(Placeholders(s)) == 0 && out != s {
			t.Fatalf("text without placeholders changed: %q -> %q", s, out)
		}
		for _, name := range unresolved {
			if name == "A" || name == "B" {
				t.Fatalf("set variable %s reported unresolved", name)
			}
		}
		for _, p := range Placeholders(s) {
			if p.Start < 0 || p.End > len(s) || p.Start >= p.End || s[p.Start:p.Start+2] != "${" || s[p.End-1] != '}' {
				t.Fatalf("bad placeholder bounds %+v in %q", p, s)
			}
		}
	})
}
