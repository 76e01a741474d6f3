package fileedit

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
)

func TestParseWorkerSpec(t *testing.T) {
	tests := []struct {
		spec, key, worker, version, code string
		latest                           bool
	}{
		{spec: "iii-sandbox", key: "sandbox-libkrun", worker: "package://sandbox-libkrun", version: "^0.3"},
		{spec: "sandbox-libkrun", key: "sandbox-libkrun", worker: "package://sandbox-libkrun", version: "^0.3"},
		{spec: "sandbox-libkrun@^0.2", key: "sandbox-libkrun", worker: "package://sandbox-libkrun", version: "^0.2"},
		{spec: "package://sandbox-hostdir@1.0.0", key: "sandbox-hostdir", worker: "package://sandbox-hostdir", version: "1.0.0"},
		{spec: "registry.example/sandbox-x@1", key: "sandbox-x", worker: "package://registry.example/sandbox-x", version: "1"},
		{spec: "./workers/api", key: "api", worker: "path://./workers/api"},
		{spec: "/srv/workers/api/", key: "api", worker: "path:///srv/workers/api/"},
		{spec: "path://../shared", key: "shared", worker: "path://../shared"},
		{spec: "state", key: "state", worker: "package://state", latest: true},
		{spec: "state@0.21.4", key: "state", worker: "package://state", version: "0.21.4"},
		{spec: "state@next", key: "state", worker: "package://state", version: "next"},
		{spec: "127.0.0.1:8080/state@^1", key: "state", worker: "package://127.0.0.1:8080/state", version: "^1"},
		{spec: "package://reg.example/state", key: "state", worker: "package://reg.example/state", latest: true},
		{spec: "sandbox-other", key: "sandbox-other", worker: "package://sandbox-other", latest: true},
		{spec: "state@^^", code: compose.CodeInvalidWorkerSpec},
		{spec: "a/b/c", code: compose.CodeInvalidWorkerSpec},
		{spec: "../x", key: "x", worker: "path://../x"},
		{spec: "http://x/y", code: compose.CodeInvalidWorkerSpec},
		{spec: "st ate", code: compose.CodeInvalidWorkerSpec},
		{spec: "", code: compose.CodeInvalidWorkerSpec},
		{spec: "path://", code: compose.CodeInvalidWorkerSpec},
		{spec: "./", code: compose.CodeInvalidWorkerSpec},
		{spec: "x@", code: compose.CodeInvalidWorkerSpec},
	}
	for _, tc := range tests {
		a, err := ParseWorkerSpec(tc.spec)
		if tc.code != "" {
			assert.Check(t, is.Equal(compose.CodeOf(err), tc.code), "%q: %v", tc.spec, err)
			continue
		}
		assert.NilError(t, err, tc.spec)
		assert.Check(t, is.Equal(a.Key, tc.key), tc.spec)
		assert.Check(t, is.Equal(a.Fields["worker"].Value, tc.worker), tc.spec)
		if tc.version != "" {
			assert.Check(t, is.Equal(a.Fields["version"].Value, tc.version), tc.spec)
		}
		assert.Check(t, is.Equal(a.Latest, tc.latest), tc.spec)
	}
}

func FuzzParseWorkerSpec(f *testing.F) {
	for _, s := range []string{"iii-sandbox", "./a", "path://x", "a@b", "package://h/n@1", "@", "/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		a, err := ParseWorkerSpec(spec)
		if err != nil {
			if compose.CodeOf(err) == "" {
				t.Fatalf("uncoded error %v", err)
			}
			return
		}
		if a.Key == "" || a.Fields["worker"] == nil {
			t.Fatalf("%q: empty Addition %+v", spec, a)
		}
	})
}

// Edits keep the file byte for byte outside the lines they touch
// (comments, blank lines, quoting, block scalars), and every edited file
// is validated before it is written. Each case's result is a golden file.
func TestComposeFileEdits(t *testing.T) {
	obj := func(s string) *Addition {
		a, err := ParseContainerObject(json.RawMessage(s))
		assert.NilError(t, err)
		return a
	}
	spec := func(s string) *Addition {
		a, err := ParseWorkerSpec(s)
		assert.NilError(t, err)
		return a
	}
	tests := []struct {
		name   string
		input  string
		add    []*Addition
		remove string
	}{
		{name: "add-path-to-commented", input: "commented.yaml", add: []*Addition{spec("./workers/jobs")}},
		{name: "add-sandbox-to-commented", input: "commented.yaml", add: []*Addition{spec("iii-sandbox")}},
		{name: "change-existing", input: "commented.yaml",
			add: []*Addition{obj(`{"worker":"path://./api","environment":{"MODE":"fast"},"startup_timeout":"30s"}`)}},
		{name: "remove-first", input: "commented.yaml", remove: "api"},
		{name: "remove-added", input: "commented.yaml", add: []*Addition{spec("./workers/jobs")}, remove: "jobs"},
		{name: "add-to-empty-map", input: "emptymap.yaml", add: []*Addition{spec("iii-sandbox")}},
		{name: "add-to-no-containers", input: "nocontainers.yaml", add: []*Addition{spec("./workers/api"), spec("iii-sandbox")}},
		{name: "add-to-flow", input: "flow.yaml", add: []*Addition{obj(`{"worker":"./db","start_after":["api"]}`)}},
		{name: "remove-only", input: "emptymap.yaml", add: []*Addition{spec("iii-sandbox")}, remove: "sandbox-libkrun"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, d := range []string{"api", "db", "workers/jobs", "workers/api"} {
				assert.NilError(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
			}
			data, err := os.ReadFile(filepath.Join("testdata", "edit", tc.input))
			assert.NilError(t, err)
			path := filepath.Join(dir, composefile.FileName)
			assert.NilError(t, os.WriteFile(path, data, 0o640))
			doc, err := Read(path)
			assert.NilError(t, err)
			for _, a := range tc.add {
				assert.NilError(t, doc.Upsert(a.Key, a.Merged(doc.Node(a.Key))))
				assert.NilError(t, doc.Reparse())
			}
			if tc.remove != "" {
				assert.NilError(t, doc.Delete(tc.remove))
			}
			_, err = doc.Commit(nil)
			assert.NilError(t, err)
			out, err := os.ReadFile(path)
			assert.NilError(t, err)
			golden.Assert(t, string(out), filepath.Join("edit", tc.name+".golden"))
			st, err := os.Stat(path)
			assert.NilError(t, err)
			assert.Equal(t, st.Mode().Perm(), os.FileMode(0o640), "the file keeps its mode")
		})
	}
}

// An edit that would make the file invalid is refused and nothing is
// written: removing a container another one starts after.
func TestEditRefusesInvalidResult(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"api", "db"} {
		assert.NilError(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	data, err := os.ReadFile(filepath.Join("testdata", "edit", "commented.yaml"))
	assert.NilError(t, err)
	path := filepath.Join(dir, composefile.FileName)
	assert.NilError(t, os.WriteFile(path, data, 0o644))
	doc, err := Read(path)
	assert.NilError(t, err)
	assert.NilError(t, doc.Delete("db"))
	_, err = doc.Commit(nil)
	assert.Equal(t, compose.CodeOf(err), compose.CodeUnknownDependency)
	assert.ErrorContains(t, err, "the edit was not written, because the edited file would not load: ")
	after, err := os.ReadFile(path)
	assert.NilError(t, err)
	assert.Equal(t, string(after), string(data))
}
