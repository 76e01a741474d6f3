package daemon

import (
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose"
)

// TestCopyPaths: iii.worker.yaml's copy.include passes plain names on,
// copy.exclude becomes absolute paths under the worker's directory, and
// anything else is INVALID_MANIFEST naming the file and the key.
func TestCopyPaths(t *testing.T) {
	t.Parallel()
	const dir = "/srv/app/worker"
	for _, tc := range []struct {
		name, yaml       string
		include, exclude []string
		msg              string
	}{
		{name: "none", yaml: "name: w\n"},
		{name: "both", yaml: "copy:\n  include: [node_modules, dist]\n  exclude: [data, logs/old, ./tmp/]\n",
			include: []string{"node_modules", "dist"},
			exclude: []string{dir + "/data", dir + "/logs/old", dir + "/tmp"}},
		{name: "include a path", yaml: "copy: { include: [lib/dist] }\n", msg: `copy.include[0] "lib/dist" must be the plain name`},
		{name: "include dot-dot", yaml: "copy: { include: [..] }\n", msg: "must be the plain name"},
		{name: "include empty", yaml: "copy: { include: [''] }\n", msg: "must be the plain name"},
		{name: "include state", yaml: "copy: { include: [.iii] }\n", msg: "never enters a VM"},
		{name: "exclude absolute", yaml: "copy: { exclude: [/etc] }\n", msg: `copy.exclude[0] "/etc" must be a path relative`},
		{name: "exclude climbs out", yaml: "copy: { exclude: [a/../../b] }\n", msg: "must be a path relative to the worker's directory"},
		{name: "exclude the directory", yaml: "copy: { exclude: [.] }\n", msg: "below it"},
		{name: "too many", yaml: "copy: { include: [" + strings.TrimSuffix(strings.Repeat("dist,", maxCopyEntries+1), ",") + "] }\n", msg: "at most 64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := parseManifest([]byte(tc.yaml), "iii.worker.yaml")
			assert.NilError(t, err)
			inc, exc, err := copyPaths("api", dir, m)
			if tc.msg != "" {
				assert.Equal(t, compose.CodeOf(err), compose.CodeInvalidManifest, "%v", err)
				assert.Check(t, is.ErrorContains(err, tc.msg))
				assert.Check(t, is.ErrorContains(err, filepath.Join(dir, ManifestFile)))
				return
			}
			assert.NilError(t, err)
			assert.DeepEqual(t, inc, tc.include)
			assert.DeepEqual(t, exc, tc.exclude)
		})
	}
	inc, exc, err := copyPaths("api", dir, nil)
	assert.NilError(t, err)
	assert.Check(t, inc == nil && exc == nil)
	_, err = parseManifest([]byte("copy: { include: node_modules }\n"), "iii.worker.yaml")
	assert.Equal(t, compose.CodeOf(err), compose.CodeInvalidManifest, "a scalar where a list belongs: %v", err)
}
