package stateworker

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/icmd"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
	"github.com/iii-sandbox/iii/internal/testkit/procscan"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/workers/state"
)

// Deadlines: a hang guard, not a timing.
const (
	readyWait = 2 * time.Minute
	eventWait = time.Minute
	stopWait  = 2 * time.Minute
)

// project is a Compose project run by a real `iii compose --up` with a
// managed engine, in the default namespace: the published Node iii-sdk
// 0.22.1 knows no namespaces, so its calls resolve in "default", and a
// project whose workers call state::* from it leaves `namespace:` out
// (docs/standard-workers.md).
type project struct {
	dir, home, stateDir string
	port                int
	env                 []string
	out, errOut         syncbuf.Buffer
	cmd                 *exec.Cmd
	exited              chan error
}

// composeFile is the project's worker-compose.yaml; containers is its
// containers: block (indented by two).
func composeFile(port int, node, containers string) string {
	return fmt.Sprintf(`stop_timeout: 5s
engine:
  url: ws://127.0.0.1:%d
  workers: {}
containers:
  app:
    worker: path://./app
    scripts: { run: '%s app.mjs' }
    environment: { III_SDK_URL: '${III_SDK_URL}' }
%s`, port, node, containers)
}

func startProject(t *testing.T, containers string) *project {
	t.Helper()
	if testing.Short() {
		t.Skip("runs iii compose --up with an engine and Node workers")
	}
	sdk := nodesdk.Find(t)
	port, err := loopback.FreePort()
	assert.NilError(t, err)
	p := &project{dir: t.TempDir(), home: t.TempDir(), stateDir: t.TempDir(), port: port, exited: make(chan error, 1)}
	app, err := os.ReadFile(filepath.Join("testdata", "app", "app.mjs"))
	assert.NilError(t, err)
	assert.NilError(t, os.MkdirAll(filepath.Join(p.dir, "app"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(p.dir, "app", "app.mjs"), app, 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(p.dir, "worker-compose.yaml"), []byte(composeFile(port, sdk.Node, containers)), 0o644))
	// No III_* from the test's environment: no $III_REGISTRY, so the
	// package comes from the default registry beside iii.
	p.env = []string{"HOME=" + p.home, "III_COMPOSE_STATE_DIR=" + p.stateDir, "III_SDK_URL=" + sdk.URL}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "III_") {
			p.env = append(p.env, kv)
		}
	}
	p.cmd = exec.Command(iii, "compose", "--up")
	p.cmd.Dir, p.cmd.Env, p.cmd.Stdout, p.cmd.Stderr = p.dir, p.env, &p.out, &p.errOut
	assert.NilError(t, p.cmd.Start())
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case err := <-p.exited:
			p.exited <- err
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(stopWait):
				_ = p.cmd.Process.Kill()
				select {
				case <-p.exited:
				case <-time.After(stopWait):
					t.Errorf("iii compose (pid %d) did not exit after SIGKILL", p.cmd.Process.Pid)
				}
			}
		}
		if t.Failed() {
			t.Logf("iii compose stdout:\n%s\nstderr:\n%s", p.out.Tail(60), p.errOut.Tail(60))
			logs, _ := filepath.Glob(filepath.Join(p.stateDir, "*", "default", "logs", "*.log"))
			eng, _ := filepath.Glob(filepath.Join(p.stateDir, "*", "default", "engine.log"))
			for _, f := range append(logs, eng...) {
				if b, err := os.ReadFile(f); err == nil {
					t.Logf("%s:\n%s", f, tail(string(b), 40))
				}
			}
		}
		// Nothing of the project may outlive the test.
		for _, marker := range []string{p.dir, p.stateDir} {
			for _, pid := range procscan.Naming(marker) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return p
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// call runs `iii call` in the project's directory (it finds the project
// token there); fn resolves in namespace default.
func (p *project) call(fn string, args ...string) *icmd.Result {
	return p.callNS("default", fn, args...)
}

func (p *project) callNS(ns, fn string, args ...string) *icmd.Result {
	argv := append([]string{"call", "-n", ns, "--port", strconv.Itoa(p.port), fn}, args...)
	return icmd.RunCmd(icmd.Command(iii, argv...), icmd.WithEnv(p.env...), icmd.Dir(p.dir), icmd.WithTimeout(time.Minute))
}

func (p *project) mustCall(t *testing.T, fn string, args ...string) string {
	t.Helper()
	res := p.call(fn, args...)
	res.Assert(t, icmd.Success)
	return res.Stdout()
}

// waitReady waits until compose::status says every container is ready.
func (p *project) waitReady(t *testing.T, containers ...string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case err := <-p.exited:
			p.exited <- err
			return poll.Error(fmt.Errorf("iii compose exited: %v", err))
		default:
		}
		res := p.call("compose::status")
		if res.ExitCode != 0 {
			return poll.Continue("compose::status: %s", res.Combined())
		}
		var st struct {
			Containers []struct{ Container, State string } `json:"containers"`
		}
		if err := json.Unmarshal([]byte(res.Stdout()), &st); err != nil {
			return poll.Continue("compose::status: %v", err)
		}
		ready := map[string]bool{}
		for _, c := range st.Containers {
			ready[c.Container] = c.State == "ready"
		}
		for _, c := range containers {
			if !ready[c] {
				return poll.Continue("%s not ready: %s", c, res.Stdout())
			}
		}
		return poll.Success()
	}, poll.WithTimeout(readyWait), poll.WithDelay(200*time.Millisecond))
}

// waitGet polls state::get until it answers want (compact JSON).
func (p *project) waitGet(t *testing.T, scope, key, want string) {
	t.Helper()
	req, _ := json.Marshal(map[string]string{"scope": scope, "key": key})
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		res := p.call(state.FnGet, "--json", string(req))
		if res.ExitCode != 0 {
			return poll.Continue("state::get: %s", res.Combined())
		}
		if got := compactJSON(res.Stdout()); got != want {
			return poll.Continue("state::get %s/%s = %s, want %s", scope, key, got, want)
		}
		return poll.Success()
	}, poll.WithTimeout(eventWait), poll.WithDelay(100*time.Millisecond))
}

func compactJSON(s string) string {
	if strings.TrimSpace(s) == "" {
		return "null" // iii call prints nothing for a null result
	}
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return strings.TrimSpace(s)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// stop sends SIGTERM to Compose and waits for a clean exit.
func (p *project) stop(t *testing.T) {
	t.Helper()
	assert.NilError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-p.exited:
		p.exited <- err
		assert.NilError(t, err, "iii compose after SIGTERM")
	case <-time.After(stopWait):
		t.Fatalf("iii compose did not stop within %s of SIGTERM", stopWait)
	}
}

// TestComposeUpState: a project declaring `worker: package://state` is
// resolved, locked, installed and run from the default registry; the Node
// worker's writes reach its state trigger; the limit applies (from
// config_override, then changed live through the configuration entry);
// file_based data survives a restart of the worker.
func TestComposeUpState(t *testing.T) {
	t.Parallel()
	p := startProject(t, `  state:
    worker: package://state
    version: '^0.22'
    config_override:
      adapter: { name: kv, config: { store_method: file_based, file_path: ./statedata } }
      save_interval_ms: 100
      max_value_bytes: 4096
`)
	p.waitReady(t, "state", "app")

	// Resolved, locked and installed from the default registry.
	lock, err := os.ReadFile(filepath.Join(p.dir, "worker-compose.lock"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(lock), "state"))
	assert.Check(t, is.Contains(string(lock), state.Version))
	entry := filepath.Join(p.stateDir, "packages", "state-"+state.Version+"-"+registry.HostPlatform().Target())
	_, err = os.Stat(filepath.Join(entry, "state"))
	assert.NilError(t, err, "the package is installed in the cache")

	// The Node worker writes; its state trigger sees the write.
	out := p.mustCall(t, "app::write", "--json", `{"key":"o1","value":{"n":1}}`)
	assert.Check(t, is.Equal(compactJSON(out), `{"new_value":{"n":1},"old_value":null}`))
	p.waitGet(t, "seen", "o1:state:created", `{"event_type":"state:created","key":"o1","new_value":{"n":1},"old_value":null,"scope":"orders","type":"state"}`)
	out = p.mustCall(t, "app::bump", "key=o1")
	assert.Check(t, is.Equal(compactJSON(out), `{"new_value":{"n":2},"old_value":{"n":1}}`))
	p.waitGet(t, "seen", "o1:state:updated", `{"event_type":"state:updated","key":"o1","new_value":{"n":2},"old_value":{"n":1},"scope":"orders","type":"state"}`)

	// A condition answering false skips its trigger: o1 (n=2) never
	// reached app::on-big, o2 (n=10), written after it, did. Events are
	// delivered in write order, so o1's was decided before o2's.
	p.mustCall(t, "app::write", "--json", `{"key":"o2","value":{"n":10}}`)
	p.waitGet(t, "big", "o2", `{"n":10}`)
	p.waitGet(t, "big", "o1", `null`)

	// max_value_bytes from config_override.
	big := `{"scope":"x","key":"k","value":"` + strings.Repeat("v", 5000) + `"}`
	res := p.call(state.FnSet, "--json", big)
	assert.Check(t, res.ExitCode != 0)
	assert.Check(t, is.Contains(res.Stderr(), "VALUE_TOO_LARGE"))
	// Changed live: the configuration entry "state" (the worker name) lies
	// over the file; the worker follows its configuration trigger.
	p.callNS("default", "configuration::register", "--json",
		`{"id":"state","schema":{},"initial_value":{"max_value_bytes":32}}`).Assert(t, icmd.Success)
	small := `{"scope":"x","key":"k","value":"` + strings.Repeat("v", 40) + `"}`
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		res := p.call(state.FnSet, "--json", small)
		if res.ExitCode == 0 {
			return poll.Continue("a 42-byte value is still accepted")
		}
		if !strings.Contains(res.Stderr(), "VALUE_TOO_LARGE: value of 42 bytes exceeds the configured max_value_bytes limit of 32") {
			return poll.Error(fmt.Errorf("unexpected failure: %s", res.Stderr()))
		}
		return poll.Success()
	}, poll.WithTimeout(eventWait), poll.WithDelay(100*time.Millisecond))

	// file_based: a restarted worker has the data.
	p.mustCall(t, "compose::restart", "worker=state")
	p.waitReady(t, "state", "app")
	p.waitGet(t, "orders", "o1", `{"n":2}`)
	_, err = os.Stat(filepath.Join(p.dir, "statedata"))
	assert.NilError(t, err, "file_path is relative to the compose file's directory")

	p.stop(t)
}

// TestComposeAddState: `compose::add worker=state` adds the package from
// the default registry (no network), edits the file and the lock, starts
// it, and the Node worker's trigger (parked until a `state` provider
// appears) fires.
func TestComposeAddState(t *testing.T) {
	t.Parallel()
	p := startProject(t, "")
	p.waitReady(t, "app")

	out := p.mustCall(t, "compose::add", "worker=state")
	var added struct {
		Added  []string `json:"added"`
		Edited bool     `json:"edited"`
	}
	assert.NilError(t, json.Unmarshal([]byte(out), &added), out)
	assert.Check(t, added.Edited, out)
	assert.Check(t, is.DeepEqual(added.Added, []string{"state"}), out)
	file, err := os.ReadFile(filepath.Join(p.dir, "worker-compose.yaml"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(file), "worker: package://state"))
	assert.Check(t, is.Contains(string(file), state.Version), "an unpinned name is written as the exact latest version")
	lock, err := os.ReadFile(filepath.Join(p.dir, "worker-compose.lock"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(lock), state.Version))
	p.waitReady(t, "state", "app")

	p.mustCall(t, "app::write", "--json", `{"key":"a1","value":"hello"}`)
	p.waitGet(t, "seen", "a1:state:created", `{"event_type":"state:created","key":"a1","new_value":"hello","old_value":null,"scope":"orders","type":"state"}`)
	p.stop(t)
}
