package contract

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func TestSplit(t *testing.T) {
	cases := []struct {
		in   string
		want []string
		err  string
	}{
		{in: "", want: nil},
		{in: "   \t\n", want: nil},
		{in: "ls", want: []string{"ls"}},
		{in: "  ls   -l  /tmp ", want: []string{"ls", "-l", "/tmp"}},
		{in: "a\tb\nc", want: []string{"a", "b", "c"}},
		{in: "a\u00a0b", want: []string{"a", "b"}},
		{in: `echo 'a b' "c d"`, want: []string{"echo", "a b", "c d"}},
		{in: `'it'\''s'`, want: []string{"it's"}},
		{in: `"a\"b" "\\" "\$HOME" "\x"`, want: []string{`a"b`, `\`, `$HOME`, `\x`}},
		{in: `a\ b \'c`, want: []string{"a b", "'c"}},
		{in: "line\\\ncontinued", want: []string{"linecontinued"}},
		{in: "\"a\\\nb\"", want: []string{"ab"}},
		{in: `'' ""`, want: []string{"", ""}},
		{in: `pre"mid"'post'`, want: []string{"premidpost"}},
		{in: `echo $HOME && rm -rf / ; x | y > z # c`, want: []string{"echo", "$HOME", "&&", "rm", "-rf", "/", ";", "x", "|", "y", ">", "z", "#", "c"}},
		{in: "caf\xe9 \xff", want: []string{"caf\xe9", "\xff"}},
		{in: `héllo wörld`, want: []string{"héllo", "wörld"}},
		{in: `a\é`, want: []string{"aé"}},
		{in: `'unterminated`, err: "unterminated single quote"},
		{in: `"unterminated`, err: "unterminated double quote"},
		{in: `"ends in escape\`, err: "unterminated double quote"},
		{in: `trailing\`, err: "trailing backslash"},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := Split(tc.in)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

func TestQuoteJoin(t *testing.T) {
	cases := []struct{ in, want string }{
		{"", "''"},
		{"plain-word_1.0/x:y@z%+=,", "plain-word_1.0/x:y@z%+=,"},
		{"a b", "'a b'"},
		{"it's", `'it'\''s'`},
		{"$HOME", "'$HOME'"},
	}
	for _, tc := range cases {
		assert.Equal(t, Quote(tc.in), tc.want)
	}
	words := []string{"python", "-c", `print("it's")`, "", "a\nb", "\xff"}
	back, err := Split(Join(words))
	assert.NilError(t, err)
	assert.DeepEqual(t, back, words)
}

func FuzzShlex(f *testing.F) {
	for _, s := range []string{"ls -l", `echo 'a b' "c\"d"`, `a\ b`, "x\\\ny", `'`, `"\`, "caf\xe9", "\u00a0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		words, err := Split(s)
		if err != nil {
			return
		}
		// Whatever Split produced, Join quotes back into the same words.
		back, err := Split(Join(words))
		if err != nil {
			t.Fatalf("Join(%q) does not split: %v", words, err)
		}
		if len(back) != len(words) {
			t.Fatalf("Split(Join(%q)) = %q", words, back)
		}
		for i := range words {
			if back[i] != words[i] {
				t.Fatalf("Split(Join(%q)) = %q", words, back)
			}
		}
		// And any list of words survives Join and Split: here the input's
		// NUL-separated pieces.
		pieces := strings.Split(s, "\x00")
		again, err := Split(Join(pieces))
		if err != nil || len(again) != len(pieces) {
			t.Fatalf("Split(Join(%q)) = %q, %v", pieces, again, err)
		}
		for i := range pieces {
			if again[i] != pieces[i] {
				t.Fatalf("Split(Join(%q)) = %q", pieces, again)
			}
		}
	})
}
