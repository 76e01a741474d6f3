package adaptername

import (
	"regexp"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func TestValid(t *testing.T) {
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"sandbox-libkrun", true},
		{"a", true},
		{"0", true},
		{"a_b-c9", true},
		{strings.Repeat("a", 64), true},
		{strings.Repeat("a", 65), false},
		{"", false},
		{"-a", false},
		{"_a", false},
		{"A", false},
		{"sandbox::x", false},
		{"a.b", false},
		{"a b", false},
		{"é", false},
		{"a\n", false},
	} {
		assert.Check(t, Valid(tc.name) == tc.want, "Valid(%q)", tc.name)
	}
}

// FuzzValid checks Valid against Pattern, the form the JSON Schemas and the
// docs publish, so the two cannot drift apart.
func FuzzValid(f *testing.F) {
	for _, s := range []string{"sandbox-libkrun", "", "-", "a-", "Z", strings.Repeat("b", 64), strings.Repeat("b", 65), "a\x00"} {
		f.Add(s)
	}
	re := regexp.MustCompile(Pattern)
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := Valid(s), re.MatchString(s); got != want {
			t.Fatalf("Valid(%q) = %v, Pattern says %v", s, got, want)
		}
	})
}
