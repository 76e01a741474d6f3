package textscan

import (
	"strings"
	"testing"
	"unicode/utf8"

	"gotest.tools/v3/assert"
)

func TestCutLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		n    int
		want string
	}{
		{"abc", 3, "abc"},
		{"abc", 10, "abc"},
		{"abcd", 3, "abc…"},
		{"日本語", 4, "日…"},
		{"日本語", 3, "日…"},
		{"日本語", 0, "…"},
		{"abc", -1, "…"},
		{"", 0, ""},
		{"\xff\xfe", 1, "\xff…"},
	} {
		assert.Equal(t, CutLine([]byte(tc.line), tc.n), tc.want, "CutLine(%q, %d)", tc.line, tc.n)
	}
}

func TestIsBinary(t *testing.T) {
	assert.Check(t, !IsBinary(nil))
	assert.Check(t, !IsBinary([]byte("text\n")))
	assert.Check(t, IsBinary([]byte("ELF\x00\x01")))
}

func FuzzCutLine(f *testing.F) {
	f.Add("日本語", 4)
	f.Add("\xff", 0)
	f.Fuzz(func(t *testing.T, line string, n int) {
		got := CutLine([]byte(line), n)
		if len(line) <= n {
			assert.Equal(t, got, line)
			return
		}
		body, ok := strings.CutSuffix(got, "…")
		assert.Assert(t, ok, "a cut line ends with …: %q", got)
		assert.Assert(t, strings.HasPrefix(line, body))
		assert.Assert(t, len(body) <= max(n, 0))
		if utf8.ValidString(line) {
			assert.Assert(t, utf8.ValidString(body), "cut inside a character: %q", body)
		}
	})
}
