package atomicfile

import (
	"os"
	"path/filepath"
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
