package fileedit

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

// compose::update's line edits change only the version line or the
// start_after list of a container; quoting, comments and every other line
// stay as written, and a layout the line edits do not handle is rendered
// again.
func TestLineEdits(t *testing.T) {
	tests := []struct {
		name, in, want string
		edit           func(*Doc) error
	}{
		{
			name: "version keeps its quotes and comment",
			in:   "containers:\n  api:\n    worker: package://api\n    version: '1.0.0' # pinned\n",
			edit: func(d *Doc) error { return d.SetVersion("api", "1.2.0") },
			want: "containers:\n  api:\n    worker: package://api\n    version: '1.2.0' # pinned\n",
		},
		{
			name: "double-quoted version",
			in:   "containers:\n  api:\n    worker: package://api\n    version: \"^1\"\n",
			edit: func(d *Doc) error { return d.SetVersion("api", "^2") },
			want: "containers:\n  api:\n    worker: package://api\n    version: \"^2\"\n",
		},
		{
			name: "plain version that would read as a number is quoted",
			in:   "containers:\n  api:\n    worker: package://api\n    version: next\n",
			edit: func(d *Doc) error { return d.SetVersion("api", "0.21") },
			want: "containers:\n  api:\n    worker: package://api\n    version: '0.21'\n",
		},
		{
			name: "flow container: the document is encoded again",
			in:   "containers:\n  api: { worker: package://api, version: '1' }\n",
			edit: func(d *Doc) error { return d.SetVersion("api", "2") },
			want: "containers:\n  api: {worker: 'package://api', version: '2'}\n",
		},
		{
			name: "start_after line added after worker",
			in:   "containers:\n  api:\n    worker: package://api # the api\n    version: '1'\n  db:\n    worker: package://db\n",
			edit: func(d *Doc) error { return d.AddStartAfter("api", []string{"db"}) },
			want: "containers:\n  api:\n    worker: package://api # the api\n    start_after: [db]\n    version: '1'\n  db:\n    worker: package://db\n",
		},
		{
			name: "flow list extended, listed ones skipped",
			in:   "containers:\n  api:\n    worker: package://api\n    start_after: [db]\n  db:\n    worker: package://db\n  kv:\n    worker: package://kv\n",
			edit: func(d *Doc) error { return d.AddStartAfter("api", []string{"db", "kv"}) },
			want: "containers:\n  api:\n    worker: package://api\n    start_after: [db, kv]\n  db:\n    worker: package://db\n  kv:\n    worker: package://kv\n",
		},
		{
			name: "block list extended",
			in:   "containers:\n  api:\n    worker: package://api\n    start_after:\n      - db\n  db:\n    worker: package://db\n  kv:\n    worker: package://kv\n",
			edit: func(d *Doc) error { return d.AddStartAfter("api", []string{"kv"}) },
			want: "containers:\n  api:\n    worker: package://api\n    start_after:\n      - db\n      - kv\n  db:\n    worker: package://db\n  kv:\n    worker: package://kv\n",
		},
		{
			name: "dropped dependency leaves every list, an emptied one goes",
			in:   "containers:\n  api:\n    worker: package://api\n    start_after: [db, kv]\n  web:\n    worker: package://web\n    start_after:\n      - kv\n  kv:\n    worker: package://kv\n  db:\n    worker: package://db\n",
			edit: func(d *Doc) error { return d.DropStartAfter([]string{"kv"}) },
			want: "containers:\n  api:\n    worker: package://api\n    start_after: [db]\n  web:\n    worker: package://web\n  kv:\n    worker: package://kv\n  db:\n    worker: package://db\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "worker-compose.yaml")
			assert.NilError(t, os.WriteFile(path, []byte(tc.in), 0o644))
			d, err := Read(path)
			assert.NilError(t, err)
			assert.NilError(t, tc.edit(d))
			assert.Equal(t, string(d.Bytes()), tc.want)
		})
	}
}

// An edit of a container the file does not declare says so.
func TestLineEditsUnknownContainer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "worker-compose.yaml")
	assert.NilError(t, os.WriteFile(path, []byte("containers:\n  api:\n    worker: package://api\n"), 0o644))
	d, err := Read(path)
	assert.NilError(t, err)
	assert.ErrorContains(t, d.AddStartAfter("web", []string{"api"}), "containers.web is not in "+path)
	assert.ErrorContains(t, d.SetVersion("web", "1"), "containers.web is not in "+path)
}
