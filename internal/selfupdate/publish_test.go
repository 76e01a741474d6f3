package selfupdate

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func writeFile(t *testing.T, p, content string, mode os.FileMode) string {
	t.Helper()
	assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	assert.NilError(t, os.WriteFile(p, []byte(content), mode))
	assert.NilError(t, os.Chmod(p, mode))
	return p
}

// TestPublish: a release directory is written in the index format, with
// relative urls whose files match their digests; republishing changes
// nothing, and other versions stay.
func TestPublish(t *testing.T) {
	dir := t.TempDir()
	bins := t.TempDir()
	iii := writeFile(t, filepath.Join(bins, "iii"), "#!/bin/sh\necho 0.26.0\n", 0o755)
	cloud := writeFile(t, filepath.Join(bins, "iii-cloud"), "#!/bin/sh\necho 0.26.0\n", 0o755)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

	out, err := Publish(dir, Publication{Version: "0.26.0", Target: "x86_64-unknown-linux-gnu", Binaries: []PublishBinary{{Path: iii}, {Path: cloud}}, Latest: true, Now: t0})
	assert.NilError(t, err)
	assert.Equal(t, len(out), 2)
	for _, p := range out {
		assert.Check(t, p.Changed)
		data, err := os.ReadFile(p.Path)
		assert.NilError(t, err)
		sum := sha256.Sum256(data)
		assert.Equal(t, hex.EncodeToString(sum[:]), p.SHA256)
		assert.Equal(t, int64(len(data)), p.Size)
		var got bytes.Buffer
		_, err = extractBinary(bytes.NewReader(data), p.Product, &got)
		assert.NilError(t, err, "the archive holds the binary under its product name")
	}
	_, err = Publish(dir, Publication{Version: "0.26.1", Target: "x86_64-unknown-linux-gnu", Binaries: []PublishBinary{{Path: iii}}, Latest: true, Now: t0.Add(time.Hour)})
	assert.NilError(t, err)
	_, err = Publish(dir, Publication{Version: "0.26.1", Target: "aarch64-apple-darwin", Binaries: []PublishBinary{{Path: iii}}, Now: t0.Add(2 * time.Hour)})
	assert.NilError(t, err)

	data, err := os.ReadFile(filepath.Join(dir, IndexFile))
	assert.NilError(t, err)
	idx, err := DecodeIndex(data, "published")
	assert.NilError(t, err)
	assert.Equal(t, idx.Latest, "0.26.1")
	assert.DeepEqual(t, idx.Versions(), []string{"0.26.1", "0.26.0"})
	assert.DeepEqual(t, idx.Releases["0.26.0"].AssetNames(), []string{"iii-cloud-x86_64-unknown-linux-gnu.tar.gz", "iii-x86_64-unknown-linux-gnu.tar.gz"})
	assert.DeepEqual(t, idx.Releases["0.26.1"].AssetNames(), []string{"iii-aarch64-apple-darwin.tar.gz", "iii-x86_64-unknown-linux-gnu.tar.gz"})
	assert.Equal(t, idx.Releases["0.26.1"].PublishedAt, "2026-01-02T04:04:05Z", "a second target keeps the version's stamp")
	a := idx.Releases["0.26.0"].Assets["iii-x86_64-unknown-linux-gnu.tar.gz"]
	assert.Equal(t, a.URL, "0.26.0/iii-x86_64-unknown-linux-gnu.tar.gz")

	// The same binary again: the same bytes, nothing rewritten.
	before, err := os.Stat(filepath.Join(dir, IndexFile))
	assert.NilError(t, err)
	again, err := Publish(dir, Publication{Version: "0.26.0", Target: "x86_64-unknown-linux-gnu", Binaries: []PublishBinary{{Path: iii}}, Now: t0.Add(5 * time.Hour)})
	assert.NilError(t, err)
	assert.Check(t, !again[0].Changed)
	assert.Equal(t, again[0].SHA256, a.SHA256, "the archive is deterministic")
	after, err := os.Stat(filepath.Join(dir, IndexFile))
	assert.NilError(t, err)
	assert.Check(t, os.SameFile(before, after), "the index was not rewritten")
}

func TestPublishRefuses(t *testing.T) {
	bin := writeFile(t, filepath.Join(t.TempDir(), "iii"), "x", 0o755)
	tests := []struct {
		name string
		p    Publication
		want string
	}{
		{"bad version", Publication{Version: "0.26", Target: "t", Binaries: []PublishBinary{{Path: bin}}}, "not MAJOR.MINOR.PATCH"},
		{"bad target", Publication{Version: "0.26.0", Target: "a/b", Binaries: []PublishBinary{{Path: bin}}}, "not a target triple"},
		{"no binary", Publication{Version: "0.26.0", Target: "t"}, "at least one binary"},
		{"twice", Publication{Version: "0.26.0", Target: "t", Binaries: []PublishBinary{{Path: bin}, {Path: bin}}}, "two binaries"},
		{"bad product", Publication{Version: "0.26.0", Target: "t", Binaries: []PublishBinary{{Path: bin, Product: "../x"}}}, "not a name"},
		{"missing file", Publication{Version: "0.26.0", Target: "t", Binaries: []PublishBinary{{Path: bin + "-missing"}}}, "no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := Publish(dir, tc.p)
			assert.Check(t, is.ErrorContains(err, tc.want))
			_, serr := os.Stat(filepath.Join(dir, IndexFile))
			assert.Check(t, os.IsNotExist(serr), "nothing was written")
		})
	}
	// A directory whose index is not one is not overwritten.
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, IndexFile), "{", 0o644)
	_, err := Publish(dir, Publication{Version: "0.26.0", Target: "t", Binaries: []PublishBinary{{Path: bin}}})
	assert.ErrorContains(t, err, "the existing index cannot be updated")
}
