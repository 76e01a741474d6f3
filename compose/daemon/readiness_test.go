package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose"
)

// Each way a worker can fail to become ready gets its own code, the
// failed up reports it on the container, and everything the up started
// before is rolled back (reported stopped, unchanged).
func TestReadinessFailures(t *testing.T) {
	t.Parallel()
	n := findNode(t)
	eng := startEngine(t, "")
	tests := []struct {
		name    string
		mode    string
		extra   string // more container settings
		code    string
		message []string
	}{
		{name: "exits", mode: "exit", code: compose.CodeChildExitedBeforeRegistration,
			message: []string{`container "w" exited (exit status 3) before it registered as worker "w" in namespace "rd"`, "last output:", "worker w gives up before registering"}},
		// Long enough for node to print its first line on a loaded machine.
		{name: "never registers", mode: "hang", extra: "    startup_timeout: 4s\n", code: compose.CodeStartupTimeout,
			message: []string{`container "w" did not register as worker "w" in namespace "rd" within 4s (startup_timeout)`, "worker w starting in namespace rd"}},
		{name: "ignores the namespace", mode: "no-namespace", code: compose.CodeWorkerIgnoredNamespace,
			message: []string{`container "w" registered as worker "w" in namespace "default" instead of "rd"`}},
		{name: "wrong name", mode: "wrong-name", code: compose.CodeWorkerNameMismatch,
			message: []string{`container "w" registered in namespace "rd" as worker "w-other"; the worker must use the container key as its name ($III_WORKER_NAME=w)`}},
		{name: "functions elsewhere", mode: "functions-elsewhere", code: compose.CodeFunctionsInWrongNamespace,
			message: []string{`container "w" registered 1 function(s) in namespace "default" (as worker "w-helper") instead of "rd"`}},
		{name: "pre_run fails", mode: "serve", extra: "    scripts: { pre_run: 'echo migrating; exit 4', run: RUN }\n", code: compose.CodeHookFailed,
			message: []string{"pre_run `echo migrating; exit 4` failed (exit status 4)", "migrating"}},
		{name: "pre_run too slow", mode: "serve", extra: "    scripts: { pre_run: 'sleep 30', pre_run_timeout: 300ms, run: RUN }\n", code: compose.CodeHookTimeout,
			message: []string{"did not finish within 300ms and was stopped; raise scripts.pre_run_timeout"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			worker := nodeContainer(n, "w", "base", map[string]string{"WORKER_MODE": tc.mode})
			if strings.Contains(tc.extra, "scripts:") {
				// Replace the generated scripts line with the test's own.
				var kept []string
				for _, l := range strings.Split(worker, "\n") {
					if !strings.HasPrefix(l, "    scripts:") {
						kept = append(kept, l)
					}
				}
				worker = strings.Join(kept, "\n")
				tc.extra = strings.ReplaceAll(tc.extra, "RUN", n.runCommand())
			}
			worker = strings.TrimRight(worker, "\n") + "\n" + tc.extra
			file := "namespace: rd\ncontainers:\n" + nodeContainer(n, "base", "", nil) + worker
			dir := newProject(t, file, "base", "w")
			startDaemon(t, eng.attach(Options{Cwd: dir}))
			c := eng.caller(t)
			var up opResult
			assert.NilError(t, call(t, c, "rd", "compose::up", nil, &up))
			assert.Equal(t, up.Status, "failed")
			assert.Equal(t, len(up.Containers), 2)
			base, w := up.Containers[0], up.Containers[1]
			assert.Check(t, is.DeepEqual(base, containerResult{Container: "base", State: "stopped"}), "rolled back")
			assert.Equal(t, w.State, "failed")
			assert.Assert(t, w.Error != nil)
			assert.Check(t, is.Equal(w.Error.Code, tc.code), w.Error.Message)
			for _, m := range tc.message {
				assert.Check(t, is.Contains(w.Error.Message, m))
			}
			// Nothing of the project is left in the engine.
			ws, err := listWorkers(context.Background(), c)
			assert.NilError(t, err)
			for _, lw := range ws {
				assert.Check(t, !strings.HasPrefix(lw.name(), "w") && lw.name() != "base", "left running: %+v", lw)
			}
			var st statusReply
			assert.NilError(t, call(t, c, "rd", "compose::status", nil, &st))
			s, _, lastErr := st.of("w")
			assert.Check(t, is.Equal(s, "failed"))
			assert.Check(t, lastErr != nil && lastErr.Code == tc.code)
		})
	}
}

// A worker name already held in the project namespace by someone else is
// CONTAINER_NAME_TAKEN, before anything is started.
func TestContainerNameTaken(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	squatter, err := client.Dial(ctx, eng.url, client.Options{Name: "w", Namespace: "rd", IgnoreEnv: true, ConfirmRegistration: true,
		Reconnect: client.ReconnectPolicy{Disable: true}})
	assert.NilError(t, err)
	defer squatter.Close(context.Background())
	dir := newProject(t, "namespace: rd\ncontainers:\n  w:\n    worker: path://./w\n    scripts: { run: 'sleep 300' }\n", "w")
	startDaemon(t, eng.attach(Options{Cwd: dir}))
	c := eng.caller(t)
	var up opResult
	assert.NilError(t, call(t, c, "rd", "compose::up", nil, &up))
	assert.Equal(t, up.Status, "failed")
	assert.Equal(t, up.Containers[0].Error.Code, compose.CodeContainerNameTaken)
	assert.Check(t, is.Contains(up.Containers[0].Error.Message,
		fmt.Sprintf(`a worker named "w" already runs in namespace "rd" (engine worker %s) and this Compose did not start it`, squatter.WorkerID())))
}

// Start commands: scripts.run wins over the manifest; the manifest's
// scripts.start otherwise; neither, a missing directory, or a broken
// manifest each have their code. No engine is needed to see them.
func TestStartCommandResolution(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		d := filepath.Join(dir, name)
		assert.NilError(t, os.MkdirAll(d, 0o755))
		if content != "" {
			assert.NilError(t, os.WriteFile(filepath.Join(d, ManifestFile), []byte(content), 0o644))
		}
		return d
	}
	tests := []struct {
		name, dir, run, want, code, msg string
	}{
		{name: "run wins", dir: write("a", "scripts: { start: node a.js }\n"), run: "npm start", want: "npm start"},
		{name: "manifest start", dir: write("b", "name: b\nscripts: { start: node b.js }\ndescription: extra keys are fine\n"), want: "node b.js"},
		{name: "nothing", dir: write("c", ""), code: compose.CodeMissingStartCommand, msg: "iii.worker.yaml does not exist; set containers.x.scripts.run"},
		{name: "manifest without start", dir: write("d", "name: d\n"), code: compose.CodeMissingStartCommand, msg: "iii.worker.yaml has no scripts.start"},
		{name: "broken manifest", dir: write("e", "scripts: [\n"), code: compose.CodeInvalidManifest, msg: "is not a valid worker manifest"},
		{name: "missing dir", dir: filepath.Join(dir, "nope"), run: "x", code: compose.CodeMissingWorkerDirectory, msg: "does not exist; fix the path:// in worker:"},
		{name: "vm worker", dir: write("f", "runtime: { base_image: python }\nscripts: { start: x }\n"), want: "x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := startCommand("x", tc.dir, tc.run)
			if tc.code != "" {
				assert.Equal(t, compose.CodeOf(err), tc.code, "%v", err)
				assert.ErrorContains(t, err, tc.msg)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
		})
	}
}

func FuzzParseManifest(f *testing.F) {
	f.Add([]byte("name: a\nscripts: { start: node a.js }\n"))
	f.Add([]byte("scripts: [\n"))
	f.Add([]byte("&a [*a]"))
	f.Add([]byte("copy: { include: [node_modules], exclude: [data, ../x] }\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseManifest(data, "iii.worker.yaml")
		if err == nil && m == nil {
			t.Fatal("nil manifest without an error")
		}
		if err != nil && compose.CodeOf(err) != compose.CodeInvalidManifest {
			t.Fatalf("uncoded error %v", err)
		}
		if err == nil {
			if _, _, err := copyPaths("k", "/w", m); err != nil && compose.CodeOf(err) != compose.CodeInvalidManifest {
				t.Fatalf("uncoded copy error %v", err)
			}
		}
	})
}

// scripts.post_run runs after the worker's exit is confirmed (here: a
// worker that exits before registering), with the worker's environment
// and working directory, before the daemon exits.
func TestPostRun(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, "")
	mark := filepath.Join(t.TempDir(), "post_run")
	dir := newProject(t, "namespace: pr\ncontainers:\n  w:\n    worker: path://./w\n    environment: { MARK: '"+mark+"' }\n"+
		"    scripts: { run: 'exit 1', post_run: 'echo \"$III_WORKER_NAME in $(pwd)\" > \"$MARK\"' }\n", "w")
	d := startDaemon(t, eng.attach(Options{Cwd: dir}))
	c := eng.caller(t)
	var up opResult
	assert.NilError(t, call(t, c, "pr", "compose::up", nil, &up))
	assert.Equal(t, up.Containers[0].Error.Code, compose.CodeChildExitedBeforeRegistration)
	// The daemon waits for post_run hooks before it exits.
	assert.NilError(t, d.stop(t))
	data, err := os.ReadFile(mark)
	assert.NilError(t, err)
	assert.Equal(t, string(data), "w in "+filepath.Join(dir, "w")+"\n")
}
