package daemon

import (
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// compose::add edits the file (keeping everything else byte for byte) and
// starts the new worker; the same add again is a no-op; a changed
// container restarts in place; compose::remove stops it and takes it out
// of the file again.
func TestAddAndRemove(t *testing.T) {
	t.Parallel()
	n := findNode(t)
	eng := startEngine(t, "")
	original := "# my project\nnamespace: ar\n\ncontainers:\n" + nodeContainer(n, "one", "", nil)
	dir := newProject(t, original, "one", "two")
	// two's start command comes from its manifest.
	writeFile(t, dir, "two/iii.worker.yaml", "name: two\nscripts:\n  start: "+n.runCommand()+"\n")
	path := filepath.Join(dir, "worker-compose.yaml")
	env := map[string]string{"III_SDK_URL": n.URL, "PATH": os.Getenv("PATH")}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	startDaemon(t, eng.attach(Options{Cwd: dir, LookupEnv: lookup}))
	c := eng.caller(t)
	assert.NilError(t, call(t, c, "ar", "compose::up", nil, nil))

	obj := map[string]any{"worker": "./two", "start_after": []string{"one"}, "environment": map[string]string{"III_SDK_URL": n.URL}}
	var added addResult
	assert.NilError(t, call(t, c, "ar", "compose::add", map[string]any{"workers": []any{obj}}, &added))
	assert.DeepEqual(t, added.Added, []string{"two"})
	assert.Check(t, added.Edited)
	assert.Assert(t, added.Up != nil)
	assert.DeepEqual(t, added.Up.Containers, []containerResult{{Container: "one", State: "ready"}, {Container: "two", State: "ready", Changed: true}})
	data, err := os.ReadFile(path)
	assert.NilError(t, err)
	assert.Equal(t, string(data), original+"  two:\n    worker: path://./two\n    start_after:\n      - one\n    environment:\n      III_SDK_URL: "+n.URL+"\n")

	var again addResult
	assert.NilError(t, call(t, c, "ar", "compose::add", map[string]any{"workers": []any{obj}}, &again))
	assert.Check(t, !again.Edited)
	assert.DeepEqual(t, again.Unchanged, []string{"two"})

	// A supplied field replaces the whole field; the worker restarts.
	obj["environment"] = map[string]string{"III_SDK_URL": n.URL, "APP_MODE": "b"}
	var changed addResult
	assert.NilError(t, call(t, c, "ar", "compose::add", map[string]any{"workers": []any{obj}}, &changed))
	assert.DeepEqual(t, changed.Changed, []string{"two"})
	assert.DeepEqual(t, changed.Up.Containers, []containerResult{{Container: "one", State: "ready"}, {Container: "two", State: "ready", Changed: true}})
	var ping pingReply
	assert.NilError(t, call(t, c, "ar", "two::ping", nil, &ping))
	assert.Equal(t, ping.Env["APP_MODE"], "b")

	var removed removeResult
	assert.NilError(t, call(t, c, "ar", "compose::remove", map[string]any{"worker": "two"}, &removed))
	assert.Equal(t, removed.Removed, "two")
	assert.Check(t, removed.Down.Containers[0].Changed)
	assert.Equal(t, removed.Up.Status, "ok")
	data, err = os.ReadFile(path)
	assert.NilError(t, err)
	assert.Equal(t, string(data), original)
	var st statusReply
	assert.NilError(t, call(t, c, "ar", "compose::status", nil, &st))
	assert.Check(t, is.Len(st.Containers, 1))
	err = call(t, c, "ar", "two::ping", nil, nil)
	assert.Check(t, err != nil)
}
