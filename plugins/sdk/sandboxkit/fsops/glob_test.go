package fsops

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func TestGlobs(t *testing.T) {
	tests := []struct {
		patterns []string
		path     string
		isDir    bool
		want     bool
	}{
		{[]string{"*.go"}, "a.go", false, true},
		{[]string{"*.go"}, "x/y/a.go", false, true},
		{[]string{"*.go"}, "a.txt", false, false},
		{[]string{"vendor"}, "vendor/x/y.go", false, true},
		{[]string{"vendor/"}, "vendor", true, true},
		{[]string{"vendor/"}, "vendor", false, false},
		{[]string{"vendor/"}, "a/vendor/b.go", false, true},
		{[]string{"/vendor"}, "a/vendor/b.go", false, false},
		{[]string{"/vendor"}, "vendor/b.go", false, true},
		{[]string{"src/*.c"}, "src/a.c", false, true},
		{[]string{"src/*.c"}, "x/src/a.c", false, false},
		{[]string{"**/gen/*.go"}, "gen/a.go", false, true},
		{[]string{"**/gen/*.go"}, "a/b/gen/a.go", false, true},
		{[]string{"docs/**"}, "docs/a/b.md", false, true},
		{[]string{"a/**/b"}, "a/b", false, true},
		{[]string{"a/**/b"}, "a/x/y/b", false, true},
		{[]string{"a/**/b"}, "a/x/y/c", false, false},
		{[]string{"*.go", "!keep.go"}, "keep.go", false, false},
		{[]string{"*.go", "!keep.go"}, "drop.go", false, true},
		{[]string{"!keep.go", "*.go"}, "keep.go", false, true},
		{[]string{"file?.[ch]"}, "file1.c", false, true},
		{[]string{"file?.[ch]"}, "file10.c", false, false},
		{nil, "a.go", false, false},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.patterns, ",")+" "+tc.path, func(t *testing.T) {
			g, err := CompileGlobs(tc.patterns)
			assert.NilError(t, err)
			assert.Equal(t, g.Match(tc.path, tc.isDir), tc.want)
		})
	}
	for _, bad := range []string{"[a", "", "/", "!", strings.Repeat("x", 1025)} {
		_, err := CompileGlobs([]string{bad})
		assert.Check(t, err != nil, "pattern %q accepted", bad)
	}
	// An empty segment is dropped: "a//b" is "a/b".
	g, err := CompileGlobs([]string{"a//b", strings.Repeat("y", 1024)})
	assert.NilError(t, err)
	assert.Check(t, g.Match("a/b", false) && !g.Match("x/a/b", false))
}

func TestGlobManyDoubleStars(t *testing.T) {
	g, err := CompileGlobs([]string{strings.Repeat("**/", 40) + "x"})
	assert.NilError(t, err)
	path := strings.Repeat("d/", 60) + "y"
	assert.Check(t, !g.Match(path, false), "must answer quickly and correctly")
	assert.Check(t, g.Match(strings.Repeat("d/", 60)+"x", false))
}

func FuzzGlobs(f *testing.F) {
	f.Add("**/a/*.go", "x/a/b.go", false)
	f.Add("!b", "b", true)
	f.Add("[", "a", false)
	f.Fuzz(func(t *testing.T, pattern, path string, isDir bool) {
		g, err := CompileGlobs([]string{pattern})
		if err != nil {
			return
		}
		_ = g.Match(path, isDir)
	})
}
