package bins

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// A set builds a real package once, runs the result, reports unknown
// names and build failures, and its Close removes everything.
func TestSet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go build")
	}
	src := t.TempDir()
	writeModule(t, src)
	t.Chdir(src)

	s, err := New("bins-test-", map[string]string{"hello": "./hello", "broken": "./broken"})
	assert.NilError(t, err)
	p := s.Path(t, "hello")
	assert.Equal(t, p, filepath.Join(s.Dir(), "hello"))
	out, err := exec.Command(p).Output()
	assert.NilError(t, err)
	assert.Equal(t, string(out), "hello\n")

	fi, err := os.Stat(p)
	assert.NilError(t, err)
	again, err := s.Build("hello")
	assert.NilError(t, err)
	fi2, err := os.Stat(again)
	assert.NilError(t, err)
	assert.Check(t, fi.ModTime().Equal(fi2.ModTime()), "built once")

	_, err = s.Build("nope")
	assert.Check(t, is.ErrorContains(err, `no test binary "nope"`))
	_, err = s.Build("broken")
	assert.Check(t, is.ErrorContains(err, "build ./broken"))
	assert.Check(t, is.ErrorContains(s.BuildAll(), "build ./broken"), "BuildAll stops at the first failure")

	assert.NilError(t, s.Close())
	_, err = os.Stat(s.Dir())
	assert.Check(t, os.IsNotExist(err))
}

func TestRepoRoot(t *testing.T) {
	wd, err := os.Getwd()
	assert.NilError(t, err)
	root, err := RepoRoot(wd)
	assert.NilError(t, err)
	assert.Equal(t, root, filepath.Dir(filepath.Dir(filepath.Dir(wd))))
	_, err = RepoRoot(t.TempDir())
	assert.Check(t, is.ErrorContains(err, "go.mod"))
}

func TestFuzzing(t *testing.T) {
	assert.Check(t, !Fuzzing(), "go test without -fuzz")
}

func writeModule(t *testing.T, dir string) {
	t.Helper()
	for name, content := range map[string]string{
		"go.mod":         "module example.test/bins\n\ngo 1.26\n",
		"hello/main.go":  "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello\") }\n",
		"broken/main.go": "package main\n\nfunc main() { undefined() }\n",
	} {
		p := filepath.Join(dir, filepath.FromSlash(name))
		assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		assert.NilError(t, os.WriteFile(p, []byte(strings.TrimLeft(content, "\n")), 0o644))
	}
}
