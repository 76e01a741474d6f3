package sandboxfs

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		pats  []string
		path  string
		isDir bool
		want  bool
	}{
		{[]string{"*.py"}, "a.py", false, true},
		{[]string{"*.py"}, "src/lib/a.py", false, true},
		{[]string{"*.py"}, "a.pyc", false, false},
		{[]string{"/a.py"}, "a.py", false, true},
		{[]string{"/a.py"}, "src/a.py", false, false},
		{[]string{"src/*.go"}, "src/x.go", false, true},
		{[]string{"src/*.go"}, "src/sub/x.go", false, false},
		{[]string{"src/**/*.go"}, "src/sub/deep/x.go", false, true},
		{[]string{"src/**/*.go"}, "src/x.go", false, true},
		{[]string{"**/test"}, "a/b/test", true, true},
		{[]string{"build/"}, "build", true, true},
		{[]string{"build/"}, "build", false, false},
		{[]string{"build/"}, "build/out.txt", false, true}, // through its parent
		{[]string{"node_modules"}, "web/node_modules/x/index.js", false, true},
		{[]string{"a/**"}, "a/b/c", false, true},
		{[]string{"*.log", "!keep.log"}, "keep.log", false, false},
		{[]string{"*.log", "!keep.log"}, "drop.log", false, true},
		{[]string{"!keep.log", "*.log"}, "keep.log", false, true}, // the last match decides
		{[]string{"fil?.[ch]"}, "file.c", false, true},
		{[]string{"fil?.[ch]"}, "file.o", false, false},
		{[]string{`\!important`}, "!important", false, true},
		{[]string{"*"}, "anything/at/all", false, true},
		{[]string{"a//b"}, "a/b", false, true},
		{[]string{"**/**/**/x"}, "x", false, true},
		{nil, "a", false, false},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.pats, ",")+"~"+tc.path, func(t *testing.T) {
			gs, err := CompileGlobs(tc.pats)
			assert.NilError(t, err)
			assert.Equal(t, gs.Match(tc.path, tc.isDir), tc.want)
		})
	}
}

func TestGlobCompileErrors(t *testing.T) {
	for _, p := range []string{"", "/", "!", "[", "a/[b"} {
		_, err := CompileGlobs([]string{p})
		assert.Assert(t, err != nil, "pattern %q", p)
	}
}

func TestGlobManyDoubleStarsStaysCheap(t *testing.T) {
	gs, err := CompileGlobs([]string{"**/a*/**/a*/**/a*/**/a*/**/b"})
	assert.NilError(t, err)
	deep := strings.Repeat("a/", 200) + "c"
	assert.Assert(t, !gs.Match(deep, false))
}

func FuzzGlob(f *testing.F) {
	f.Add("*.py", "src/a.py", false)
	f.Add("!**/x/", "a/x", true)
	f.Add(`[a-\]`, "b", false)
	f.Fuzz(func(t *testing.T, pattern, path string, isDir bool) {
		if len(path) > 4096 || strings.Count(pattern, "**") > 16 {
			return
		}
		gs, err := CompileGlobs([]string{pattern})
		if err != nil {
			return
		}
		_ = gs.Match(path, isDir)
	})
}
