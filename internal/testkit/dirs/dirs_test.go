package dirs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestShort(t *testing.T) {
	var made string
	t.Run("made", func(t *testing.T) {
		made = Short(t, "dk")
		assert.Check(t, strings.HasPrefix(made, "/tmp/dk"), made)
		fi, err := os.Stat(made)
		assert.NilError(t, err)
		assert.Check(t, fi.IsDir())
	})
	_, err := os.Stat(made)
	assert.Check(t, os.IsNotExist(err), "removed when the test ended: %v", err)
}

func TestNames(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		dir  string
		want []string
	}{
		{name: "missing", dir: filepath.Join(dir, "nope"), want: nil},
		{name: "empty", dir: dir, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.DeepEqual(t, Names(t, tc.dir), tc.want)
		})
	}
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "a"), nil, 0o644))
	assert.NilError(t, os.Mkdir(filepath.Join(dir, "b"), 0o755))
	assert.Check(t, is.DeepEqual(Names(t, dir), []string{"a", "b"}))
}

func TestImageCache(t *testing.T) {
	layout := t.TempDir()
	assert.NilError(t, os.WriteFile(filepath.Join(layout, "index.json"), []byte("{}"), 0o644))
	cache := filepath.Join(t.TempDir(), "a", "cache")
	assert.NilError(t, ImageCache(cache, layout))
	b, err := os.ReadFile(filepath.Join(cache, "oci", "index.json"))
	assert.NilError(t, err)
	assert.Check(t, is.Equal(string(b), "{}"))
	assert.Check(t, ImageCache(cache, layout) != nil, "an existing link is an error, not replaced")
}
