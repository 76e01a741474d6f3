package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
)

// nodeContainer is a containers: entry for a Node test worker.
func nodeContainer(n nodeSDK, key, startAfter string, env map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  %s:\n    worker: path://./%s\n", key, key)
	if startAfter != "" {
		fmt.Fprintf(&b, "    start_after: [%s]\n", startAfter)
	}
	fmt.Fprintf(&b, "    scripts: { run: %s }\n    environment:\n      III_SDK_URL: %q\n", n.runCommand(), n.URL)
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "      %s: %q\n", k, env[k])
	}
	return b.String()
}

func lines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	assert.NilError(t, err)
	s := strings.TrimSpace(string(data))
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func indexOf(list []string, s string) int { return slices.Index(list, s) }

// A project of five Node iii-sdk workers with start_after edges comes up
// in dependency order (each sees its dependencies registered when it
// starts); killing one takes its dependents down and marks them failed,
// the others keep running; down stops the rest in reverse order.
func TestFiveNodeWorkersOrderSupervisionDown(t *testing.T) {
	t.Parallel()
	n := findNode(t)
	eng := startEngine(t, "")
	orderFile := filepath.Join(t.TempDir(), "order")
	env := func(deps string) map[string]string {
		return map[string]string{"ORDER_FILE": orderFile, "DEPS": deps}
	}
	// db ← api ← web ← edge; db ← jobs
	file := "namespace: shop\ncontainers:\n" +
		nodeContainer(n, "edge", "web", env("web")) +
		nodeContainer(n, "web", "api", env("api")) +
		nodeContainer(n, "api", "db", env("db")) +
		nodeContainer(n, "jobs", "db", env("db")) +
		nodeContainer(n, "db", "", env(""))
	dir := newProject(t, file, "edge", "web", "api", "jobs", "db")
	d := startDaemon(t, eng.attach(Options{Cwd: dir}))
	assert.Equal(t, d.info.Namespace, "shop")
	c := eng.caller(t)

	var up opResult
	assert.NilError(t, call(t, c, "shop", "compose::up", map[string]any{}, &up))
	assert.Equal(t, up.Status, "ok")
	assert.Check(t, up.Changed)
	var got []string
	for _, cr := range up.Containers {
		got = append(got, cr.Container+"="+cr.State)
		assert.Check(t, cr.Changed, cr.Container)
	}
	assert.DeepEqual(t, got, []string{"db=ready", "api=ready", "jobs=ready", "web=ready", "edge=ready"})

	// A worker is ready as soon as the engine lists it, which can be a
	// moment before its script has written its own lines: wait for them.
	var starts []string
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		starts = lines(t, orderFile)
		for _, w := range []string{"db", "api", "jobs", "web", "edge"} {
			if indexOf(starts, "start "+w) < 0 {
				return poll.Continue("%s has not written its start line: %v", w, starts)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Second))
	pos := func(s string) int { return indexOf(starts, s) }
	for _, edge := range [][2]string{{"db", "api"}, {"db", "jobs"}, {"api", "web"}, {"web", "edge"}} {
		assert.Check(t, pos("start "+edge[0]) >= 0 && pos("start "+edge[0]) < pos("dep "+edge[1]+" "+edge[0]+" ready"),
			"%s must be up before %s starts: %v", edge[0], edge[1], starts)
	}
	for _, l := range starts {
		assert.Check(t, !strings.HasSuffix(l, "missing"), "a dependency was not ready: %v", starts)
	}

	// A second up changes nothing.
	var again opResult
	assert.NilError(t, call(t, c, "shop", "compose::up", map[string]any{}, &again))
	assert.Check(t, !again.Changed)

	// Kill api: web and edge (its dependents) go down and are failed; db
	// and jobs stay.
	var st statusReply
	assert.NilError(t, call(t, c, "shop", "compose::status", nil, &st))
	_, apiPID, _ := st.of("api")
	assert.Assert(t, apiPID > 0)
	assert.NilError(t, syscall.Kill(apiPID, syscall.SIGKILL))
	waitUntil(t, "api recorded failed", func() bool {
		assert.NilError(t, call(t, c, "shop", "compose::status", nil, &st))
		s, _, _ := st.of("api")
		return s == "failed"
	})
	for _, key := range []string{"web", "edge"} {
		s, pid, lastErr := st.of(key)
		assert.Check(t, is.Equal(s, "failed"), key)
		assert.Check(t, pid == 0, key)
		assert.Assert(t, lastErr != nil, key)
		assert.Check(t, is.Equal(lastErr.Code, CodeDependencyFailed), key)
	}
	_, _, apiErr := st.of("api")
	assert.Equal(t, apiErr.Code, CodeWorkerExited)
	assert.Check(t, is.Contains(apiErr.Message, "signal: killed"))
	assert.Check(t, is.Contains(apiErr.Message, "stopped with it: edge, web"))
	for _, key := range []string{"db", "jobs"} {
		s, _, _ := st.of(key)
		assert.Check(t, is.Equal(s, "ready"), key)
	}
	stops := lines(t, orderFile)
	assert.Check(t, indexOf(stops, "stop edge") < indexOf(stops, "stop web"), "dependents stop first: %v", stops)

	// Bring the failed ones back, then down everything: reverse order.
	assert.NilError(t, call(t, c, "shop", "compose::up", map[string]any{}, &up))
	assert.Equal(t, up.Status, "ok")
	assert.NilError(t, os.WriteFile(orderFile, nil, 0o644))
	var down opResult
	assert.NilError(t, call(t, c, "shop", "compose::down", map[string]any{}, &down))
	assert.Equal(t, down.Status, "ok")
	got = nil
	for _, cr := range down.Containers {
		got = append(got, cr.Container)
		assert.Check(t, cr.Changed)
		assert.Check(t, is.Equal(cr.State, "stopped"))
	}
	assert.DeepEqual(t, got, []string{"edge", "web", "jobs", "api", "db"})
	// Workers the second up restarted may still be writing their start
	// lines when the file is cleared: only the stop lines count here.
	stops = nil
	for _, l := range lines(t, orderFile) {
		if strings.HasPrefix(l, "stop ") {
			stops = append(stops, l)
		}
	}
	assert.DeepEqual(t, stops, []string{"stop edge", "stop web", "stop jobs", "stop api", "stop db"})
}
