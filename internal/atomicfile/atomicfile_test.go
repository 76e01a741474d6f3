package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "index.json")
	for _, tc := range []struct {
		name string
		data string
		perm os.FileMode
	}{
		{"create", "one", 0o644},
		{"replace", "two, longer", 0o600},
		{"empty", "", 0o640},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.NilError(t, Write(p, []byte(tc.data), tc.perm))
			got, err := os.ReadFile(p)
			assert.NilError(t, err)
			assert.Equal(t, string(got), tc.data)
			st, err := os.Stat(p)
			assert.NilError(t, err)
			assert.Equal(t, st.Mode().Perm(), tc.perm)
			des, err := os.ReadDir(dir)
			assert.NilError(t, err)
			assert.Equal(t, len(des), 1, "no temporary file is left behind")
		})
	}
}

func TestWriteFailsWithoutDirectory(t *testing.T) {
	p := filepath.Join(t.TempDir(), "missing", "f")
	assert.Check(t, Write(p, []byte("x"), 0o644) != nil)
	_, err := os.Stat(p)
	assert.Check(t, os.IsNotExist(err))
}

// TestCreate: the first Create writes the file whole with its mode; later
// ones leave it as it is; of many at once exactly one creates it, and no
// temporary file is left behind.
func TestCreate(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "token")
	created, err := Create(p, []byte("first\n"), 0o600)
	assert.NilError(t, err)
	assert.Check(t, created)
	created, err = Create(p, []byte("second\n"), 0o644)
	assert.NilError(t, err)
	assert.Check(t, !created)
	got, err := os.ReadFile(p)
	assert.NilError(t, err)
	assert.Equal(t, string(got), "first\n")
	st, err := os.Stat(p)
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600))

	race := filepath.Join(dir, "race")
	const n = 16
	wins := make(chan bool, n)
	for i := range n {
		go func() {
			c, err := Create(race, []byte(strings.Repeat(string(rune('a'+i)), 64)), 0o600)
			assert.Check(t, err)
			wins <- c
		}()
	}
	won := 0
	for range n {
		if <-wins {
			won++
		}
	}
	assert.Equal(t, won, 1)
	got, err = os.ReadFile(race)
	assert.NilError(t, err)
	assert.Equal(t, len(got), 64, "the file is whole")
	assert.Equal(t, strings.Count(string(got), string(got[0])), 64, "and one writer's")
	des, err := os.ReadDir(dir)
	assert.NilError(t, err)
	assert.Equal(t, len(des), 2, "no temporary file is left behind")
}
