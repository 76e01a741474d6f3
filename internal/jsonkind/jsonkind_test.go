package jsonkind

import (
	"testing"

	"gotest.tools/v3/assert"
)

func TestOf(t *testing.T) {
	for raw, want := range map[string]string{
		``:         "nothing",
		"  \n":     "nothing",
		`"x"`:      "a string",
		` {"a":1}`: "an object",
		`[1]`:      "an array",
		`true`:     "a boolean",
		`false`:    "a boolean",
		`null`:     "null",
		`-1.5e3`:   "a number",
		`0`:        "a number",
	} {
		assert.Equal(t, Of([]byte(raw)), want, "%q", raw)
	}
}

func FuzzOf(f *testing.F) {
	f.Add([]byte(`{"a":1}`))
	f.Add([]byte(" "))
	f.Fuzz(func(t *testing.T, raw []byte) {
		if Of(raw) == "" {
			t.Fatalf("no name for %q", raw)
		}
	})
}
