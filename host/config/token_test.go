package config

import (
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestEngineToken(t *testing.T) {
	lookup := func(k string) (string, bool) {
		if k == "PROJECT_TOKEN" {
			return "from-env-var", true
		}
		return "", false
	}
	for _, tc := range []struct {
		name, doc, want, err string
	}{
		{"absent", "workers: []\n", "", ""},
		{"set", "engine_token: abc-123\n", "abc-123", ""},
		{"quoted number", "engine_token: \"12345\"\n", "12345", ""},
		{"null", "engine_token:\n", "", ""},
		{"placeholder", "engine_token: ${PROJECT_TOKEN}\n", "from-env-var", ""},
		{"unset placeholder", "engine_token: ${NOPE}\n", "", CodeUnsetVariable},
		{"empty", "engine_token: \"\"\n", "", "engine_token is empty"},
		{"space", "engine_token: \"a b\"\n", "", "whitespace"},
		{"map", "engine_token: {a: 1}\n", "", "must be a string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.doc), ParseOptions{Dir: "/x", Lookup: lookup})
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.Check(t, is.Equal(cfg.EngineToken, tc.want))
		})
	}
}
