package daemon

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// compose::logs returns each worker's newest lines (escapes stripped,
// stream-tagged), filters a stream, continues from cursors, and waits up
// to wait_ms for lines after them.
func TestLogs(t *testing.T) {
	t.Parallel()
	n := findNode(t)
	eng := startEngine(t, "")
	dir := newProject(t, "namespace: lg\ncontainers:\n"+nodeContainer(n, "w", "", nil), "w")
	startDaemon(t, eng.attach(Options{Cwd: dir}))
	c := eng.caller(t)
	assert.NilError(t, call(t, c, "lg", "compose::up", nil, nil))

	var logs logsJSON
	assert.NilError(t, call(t, c, "lg", "compose::logs", map[string]any{"worker": "w", "tail": 10}, &logs))
	assert.Equal(t, len(logs.Containers), 1)
	w := logs.Containers[0]
	assert.Equal(t, w.LogPath, filepath.Join(dir, ".iii/compose/lg/logs/w.log"))
	assert.Check(t, is.Contains(w.Entries, proc.Entry{Stream: proc.Stdout, Message: "worker w starting in namespace lg"}))
	assert.Check(t, is.Contains(w.Entries, proc.Entry{Stream: proc.Stderr, Message: "[compose] starting w: " + n.runCommand()}))

	var errs logsJSON
	assert.NilError(t, call(t, c, "lg", "compose::logs", map[string]any{"stream": "stderr"}, &errs))
	for _, e := range errs.Containers[0].Entries {
		assert.Check(t, is.Equal(e.Stream, proc.Stderr))
	}

	// Follow: wait for what comes after the cursor; a restart writes more.
	got := make(chan logsJSON, 1)
	go func() {
		var next logsJSON
		_ = call(t, c, "lg", "compose::logs", map[string]any{"worker": "w", "cursors": map[string]any{"w": w.Cursor}, "wait_ms": 5000}, &next)
		got <- next
	}()
	assert.NilError(t, call(t, c, "lg", "compose::restart", map[string]any{"container": "w"}, nil))
	next := waitfor.Recv(t, got, waitFor, "the long-polled compose::logs to return across the restart")
	deadline := time.Now().Add(waitFor)
	for len(next.Containers[0].Entries) == 0 {
		assert.Assert(t, time.Now().Before(deadline), "no log entry after the restart within %s", waitFor)
		assert.NilError(t, call(t, c, "lg", "compose::logs", map[string]any{"worker": "w", "cursors": map[string]any{"w": w.Cursor}, "wait_ms": 5000}, &next))
	}
	var msgs []string
	assert.NilError(t, call(t, c, "lg", "compose::logs", map[string]any{"worker": "w", "cursors": map[string]any{"w": w.Cursor}}, &next))
	for _, e := range next.Containers[0].Entries {
		msgs = append(msgs, e.Message)
	}
	joined := strings.Join(msgs, "\n")
	assert.Check(t, is.Contains(joined, "worker w stopping"))
	assert.Check(t, is.Contains(joined, "[compose] w stopped ("))
	assert.Check(t, !strings.Contains(joined, "\x1b"))
	assert.Check(t, !next.Containers[0].Truncated)
}

// What a Compose that died without cleaning up left in state.json is
// adopted when the project loads again: the same live process is kept
// (and stopped by down), a dead one is failed, a live one that cannot be
// verified is reported and never signalled.
func TestStateAdoptionAfterCrash(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, "")
	dir := newProject(t, "namespace: ad\ncontainers:\n"+
		"  kept:\n    worker: path://./kept\n    scripts: { run: 'sleep 300' }\n"+
		"  gone:\n    worker: path://./gone\n    scripts: { run: 'sleep 300' }\n"+
		"  odd:\n    worker: path://./odd\n    scripts: { run: 'sleep 300' }\n", "kept", "gone", "odd")
	start := func() (*exec.Cmd, chan struct{}) {
		cmd := exec.Command("sleep", "300")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		assert.NilError(t, cmd.Start())
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			waitfor.Closed(t, done, waitFor, "the killed sleep to be reaped")
		})
		return cmd, done
	}
	kept, keptDone := start()
	odd, _ := start()
	birth, err := proc.Birth(kept.Process.Pid)
	assert.NilError(t, err)
	dead := exec.Command("true")
	assert.NilError(t, dead.Run())

	composePath := filepath.Join(dir, "worker-compose.yaml")
	st := state.NewState(composePath)
	st.Containers["kept"] = &state.Record{PID: kept.Process.Pid, Birth: birth, Status: state.StatusReady}
	st.Containers["gone"] = &state.Record{PID: dead.Process.Pid, Birth: "1", Status: state.StatusReady}
	st.Containers["odd"] = &state.Record{PID: odd.Process.Pid, Status: state.StatusReady}
	data, err := st.Encode()
	assert.NilError(t, err)
	writeFile(t, dir, ".iii/compose/ad/state.json", string(data))

	startDaemon(t, eng.attach(Options{Cwd: dir}))
	c := eng.caller(t)
	// Loading the project (here by a targeted up of the adopted worker)
	// runs the recovery; kept is already running, so nothing starts.
	var up opResult
	assert.NilError(t, call(t, c, "ad", "compose::up", map[string]any{"container": "kept"}, &up))
	assert.DeepEqual(t, up.Containers, []containerResult{{Container: "kept", State: "ready"}})

	var sr statusReply
	assert.NilError(t, call(t, c, "ad", "compose::status", nil, &sr))
	s, pid, _ := sr.of("kept")
	assert.Check(t, is.Equal(s, "ready"))
	assert.Check(t, is.Equal(pid, kept.Process.Pid))
	s, _, lastErr := sr.of("gone")
	assert.Check(t, is.Equal(s, "failed"))
	assert.Assert(t, lastErr != nil)
	assert.Check(t, is.Equal(lastErr.Code, CodeWorkerExited))
	assert.Check(t, is.Contains(lastErr.Message, "ended while no Compose was watching it"))
	s, pid, _ = sr.of("odd")
	assert.Check(t, is.Equal(s, "ready"))
	assert.Check(t, is.Equal(pid, odd.Process.Pid))
	for _, cs := range sr.Containers {
		if cs.Container == "odd" {
			assert.Check(t, !cs.Owned, "an unverified process is not ours")
		}
		if cs.Container == "kept" {
			assert.Check(t, cs.Owned)
		}
	}

	var down opResult
	assert.NilError(t, call(t, c, "ad", "compose::down", nil, &down))
	select {
	case <-keptDone:
	case <-time.After(waitFor):
		t.Fatal("the adopted process was not stopped")
	}
	assert.Check(t, proc.Alive(odd.Process.Pid), "the unverified process is left running")
	_, err = os.Stat(filepath.Join(dir, ".iii/compose/ad/state.json"))
	assert.Check(t, os.IsNotExist(err), "a clean down clears state.json")
}

// compose::list, validate, schema (with the worker-compose.yaml pseudo
// id), the namespace guard, restart by container alias, a targeted down,
// and compose::stop, which returns before the daemon exits.
func TestDaemonFunctions(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, "")
	body := "namespace: fx\ncontainers:\n" +
		"  pkg:\n    worker: package://state\n    version: '0.21.4'\n" +
		"  a:\n    worker: path://./a\n    start_after: [pkg]\n"
	dir := newProject(t, body, "a")
	d := startDaemon(t, eng.attach(Options{Cwd: dir, Namespace: "fx"}))
	c := eng.caller(t)

	var v struct {
		Namespace        string   `json:"namespace"`
		StartOrder       []string `json:"start_order"`
		DeferredPackages []string `json:"deferred_packages"`
	}
	assert.NilError(t, call(t, c, "fx", "compose::validate", nil, &v))
	assert.DeepEqual(t, v.StartOrder, []string{"pkg", "a"})
	assert.DeepEqual(t, v.DeferredPackages, []string{"pkg"})
	assert.Equal(t, v.Namespace, "fx")

	var one schemaJSON
	assert.NilError(t, call(t, c, "fx", "compose::schema", map[string]any{"function_id": FileSchemaID}, &one))
	var gotSchema, wantSchema any
	assert.NilError(t, json.Unmarshal(one.Request, &gotSchema))
	assert.NilError(t, json.Unmarshal(composefile.Schema(), &wantSchema))
	assert.DeepEqual(t, gotSchema, wantSchema)
	var example string
	assert.NilError(t, json.Unmarshal(one.Response, &example))
	assert.Equal(t, example, composefile.Example())
	var all struct {
		Functions []schemaJSON `json:"functions"`
	}
	assert.NilError(t, call(t, c, "fx", "compose::schema", nil, &all))
	assert.Equal(t, len(all.Functions), 13)
	for _, s := range all.Functions {
		assert.Check(t, json.Valid(s.Request) && json.Valid(s.Response), s.FunctionID)
	}
	err := call(t, c, "fx", "compose::schema", map[string]any{"function_id": "compose::nope"}, nil)
	assert.Equal(t, codeOf(err), CodeInvalidArgument)

	// The namespace guard.
	assert.NilError(t, call(t, c, "fx", "compose::list", map[string]any{"namespace": "fx"}, nil))

	// Restart with the container alias of a worker the project runs.
	err = call(t, c, "fx", "compose::up", nil, nil)
	assert.Equal(t, codeOf(err), compose.CodePackageNotResolved, "the registry has no package state: %v", err)
	var list struct {
		Daemon          string `json:"daemon"`
		DaemonNamespace string `json:"daemon_namespace"`
		DaemonPID       int    `json:"daemon_pid"`
		Projects        []struct {
			File       string            `json:"file"`
			Containers []containerResult `json:"containers"`
		} `json:"projects"`
	}
	assert.NilError(t, call(t, c, "fx", "compose::list", nil, &list))
	assert.Equal(t, list.Daemon, "compose")
	assert.Equal(t, list.DaemonNamespace, "fx")
	assert.Equal(t, list.DaemonPID, os.Getpid())
	assert.Equal(t, len(list.Projects), 1)
	assert.Equal(t, list.Projects[0].File, filepath.Join(dir, "worker-compose.yaml"))

	var stop struct {
		Daemon   string   `json:"daemon"`
		PID      int      `json:"pid"`
		Stopping []string `json:"stopping"`
	}
	assert.NilError(t, call(t, c, "fx", "compose::stop", nil, &stop))
	assert.Equal(t, stop.Daemon, "compose")
	assert.DeepEqual(t, stop.Stopping, []string{filepath.Join(dir, "worker-compose.yaml")})
	select {
	case err := <-d.done:
		assert.NilError(t, err)
		close(d.done)
	case <-time.After(waitFor):
		t.Fatal("compose::stop did not stop the daemon")
	}
}

// `engine:` with nothing under it attaches: the file is accepted by a
// daemon attached to an engine it does not own.
func TestEmptyEngineSectionAttaches(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, "")
	dir := newProject(t, "namespace: at\nengine:\ncontainers:\n  w:\n    worker: path://./w\n    scripts: { run: 'exit 0' }\n", "w")
	startDaemon(t, eng.attach(Options{Cwd: dir}))
	c := eng.caller(t)
	var up opResult
	assert.NilError(t, call(t, c, "at", "compose::up", nil, &up))
	assert.Equal(t, up.Containers[0].Error.Code, compose.CodeChildExitedBeforeRegistration, "attached and tried to start it")
}

// The daemon reads ./worker-compose.yaml in its working directory for its
// defaults: the namespace and the engine address; -n overrides the
// namespace for the daemon and its projects.
func TestDaemonDefaultsFromFile(t *testing.T) {
	t.Parallel()
	eng := startEngine(t, "")
	dir := newProject(t, "namespace: fromfile\nengine:\n  url: "+eng.url+"\ncontainers: {}\n")
	// Nothing in the environment but the engine's token: its home is not
	// the process's.
	lookup := func(k string) (string, bool) {
		if k == envEngineToken {
			return eng.token, true
		}
		return "", false
	}
	d := startDaemon(t, Options{Cwd: dir, LookupEnv: lookup})
	assert.Equal(t, d.info.Namespace, "fromfile")
	assert.Equal(t, d.info.URL, eng.url)
	assert.Check(t, !d.info.Managed, "without --up the daemon never starts the engine")
	assert.NilError(t, d.stop(t))
	d = startDaemon(t, Options{Cwd: dir, LookupEnv: lookup, Namespace: "flag"})
	assert.Equal(t, d.info.Namespace, "flag")

	// --frozen without --up and -f without --up are refused.
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	err := Run(ctx, Options{File: "x.yaml"})
	assert.Equal(t, compose.CodeOf(err), compose.CodeFileRequiresUp)
}
