package guest

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// TestWorkspacePruneKeep: the prune after a copy removes what the archive
// no longer holds, except names in Keep at any depth and names in KeepTop
// directly under the workspace (node_modules the install step made), and
// so a stale file in a nested dist, which the host now copies, goes.
func TestWorkspacePruneKeep(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{
		"node_modules/dep/index.js",      // top-level, KeepTop: stays
		"vendor/sdk/dist/old.js",         // nested dist, not in the archive: goes
		"vendor/sdk/node_modules/x/a.js", // nested node_modules, not in the archive: goes
		"vendor/.iii/state",              // Keep at any depth: stays
		"stale.txt",                      // goes
		"vendor/sdk/dist/index.js",       // in the archive: stays
	} {
		p := filepath.Join(dir, filepath.FromSlash(name))
		assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		assert.NilError(t, os.WriteFile(p, []byte("old"), 0o644))
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"vendor/", "vendor/sdk/", "vendor/sdk/dist/"} {
		assert.NilError(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755}))
	}
	assert.NilError(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "vendor/sdk/dist/index.js", Mode: 0o644, Size: 3}))
	_, err := tw.Write([]byte("new"))
	assert.NilError(t, err)
	assert.NilError(t, tw.Close())

	res, err := Workspace{}.Unpack(context.Background(), &agentproto.WorkspaceRequest{
		Dir: dir, Prune: true, Keep: []string{".iii"}, KeepTop: []string{"node_modules", "dist"},
	}, &buf)
	assert.NilError(t, err)
	var got []string
	assert.NilError(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			got = append(got, filepath.ToSlash(rel))
		}
		return err
	}))
	sort.Strings(got)
	assert.DeepEqual(t, got, []string{"node_modules/dep/index.js", "vendor/.iii/state", "vendor/sdk/dist/index.js"})
	b, err := os.ReadFile(filepath.Join(dir, "vendor", "sdk", "dist", "index.js"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "new")
	assert.Equal(t, res.Removed, int64(3), "stale.txt, the nested node_modules and the stale dist file: %+v", res)
	assert.Check(t, !strings.Contains(strings.Join(got, " "), "old.js"))
}
