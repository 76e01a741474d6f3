package stateworker

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/icmd"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
	"github.com/iii-sandbox/iii/workers/state"
)

// eventWait bounds a wait for a trigger's effect: a hang guard, not a
// timing.
const eventWait = time.Minute

// project is a Compose project run by a real `iii compose --up` with a
// managed engine, in the default namespace: the published Node iii-sdk
// 0.22.1 knows no namespaces, so its calls resolve in "default", and a
// project whose workers call state::* from it leaves `namespace:` out
// (docs/standard-workers.md).
type project struct{ *composeproj.Project }

// startProject runs the Node app and containers (the containers: block's
// entries, indented by two).
func startProject(t *testing.T, containers string) project {
	t.Helper()
	if testing.Short() {
		t.Skip("runs iii compose --up with an engine and Node workers")
	}
	return project{composeproj.StartNodeApp(t, iii, containers)}
}

// waitGet polls state::get until it answers want (compact JSON).
func (p project) waitGet(t *testing.T, scope, key, want string) {
	t.Helper()
	req, _ := json.Marshal(map[string]string{"scope": scope, "key": key})
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		res := p.Call(state.FnGet, "--json", string(req))
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
	p.WaitReady(t, "state", "app")

	// Resolved, locked and installed from the default registry.
	lock, err := os.ReadFile(filepath.Join(p.Dir, "worker-compose.lock"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(lock), "state"))
	assert.Check(t, is.Contains(string(lock), state.Version))
	entry := filepath.Join(p.StateDir, "packages", "state-"+state.Version+"-"+registry.HostPlatform().Target())
	_, err = os.Stat(filepath.Join(entry, "state"))
	assert.NilError(t, err, "the package is installed in the cache")

	// The Node worker writes; its state trigger sees the write.
	out := p.MustCall(t, "app::write", "--json", `{"key":"o1","value":{"n":1}}`)
	assert.Check(t, is.Equal(compactJSON(out), `{"new_value":{"n":1},"old_value":null}`))
	p.waitGet(t, "seen", "o1:state:created", `{"event_type":"state:created","key":"o1","new_value":{"n":1},"old_value":null,"scope":"orders","type":"state"}`)
	out = p.MustCall(t, "app::bump", "key=o1")
	assert.Check(t, is.Equal(compactJSON(out), `{"new_value":{"n":2},"old_value":{"n":1}}`))
	p.waitGet(t, "seen", "o1:state:updated", `{"event_type":"state:updated","key":"o1","new_value":{"n":2},"old_value":{"n":1},"scope":"orders","type":"state"}`)

	// A condition answering false skips its trigger: o1 (n=2) never
	// reached app::on-big, o2 (n=10), written after it, did. Events are
	// delivered in write order, so o1's was decided before o2's.
	p.MustCall(t, "app::write", "--json", `{"key":"o2","value":{"n":10}}`)
	p.waitGet(t, "big", "o2", `{"n":10}`)
	p.waitGet(t, "big", "o1", `null`)

	// max_value_bytes from config_override.
	big := `{"scope":"x","key":"k","value":"` + strings.Repeat("v", 5000) + `"}`
	res := p.Call(state.FnSet, "--json", big)
	assert.Check(t, res.ExitCode != 0)
	assert.Check(t, is.Contains(res.Stderr(), "VALUE_TOO_LARGE"))
	// Changed live: the configuration entry "state" (the worker name) lies
	// over the file; the worker follows its configuration trigger.
	p.CallNS("default", "configuration::register", "--json",
		`{"id":"state","schema":{},"initial_value":{"max_value_bytes":32}}`).Assert(t, icmd.Success)
	small := `{"scope":"x","key":"k","value":"` + strings.Repeat("v", 40) + `"}`
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		res := p.Call(state.FnSet, "--json", small)
		if res.ExitCode == 0 {
			return poll.Continue("a 42-byte value is still accepted")
		}
		if !strings.Contains(res.Stderr(), "VALUE_TOO_LARGE: value of 42 bytes exceeds the configured max_value_bytes limit of 32") {
			return poll.Error(fmt.Errorf("unexpected failure: %s", res.Stderr()))
		}
		return poll.Success()
	}, poll.WithTimeout(eventWait), poll.WithDelay(100*time.Millisecond))

	// file_based: a restarted worker has the data.
	p.MustCall(t, "compose::restart", "worker=state")
	p.WaitReady(t, "state", "app")
	p.waitGet(t, "orders", "o1", `{"n":2}`)
	_, err = os.Stat(filepath.Join(p.Dir, "statedata"))
	assert.NilError(t, err, "file_path is relative to the compose file's directory")

	p.Stop(t)
}

// TestComposeAddState: `compose::add worker=state` adds the package from
// the default registry (no network), edits the file and the lock, starts
// it, and the Node worker's trigger (parked until a `state` provider
// appears) fires.
func TestComposeAddState(t *testing.T) {
	t.Parallel()
	p := startProject(t, "")
	p.WaitReady(t, "app")

	out := p.MustCall(t, "compose::add", "worker=state")
	var added struct {
		Added  []string `json:"added"`
		Edited bool     `json:"edited"`
	}
	assert.NilError(t, json.Unmarshal([]byte(out), &added), out)
	assert.Check(t, added.Edited, out)
	assert.Check(t, is.DeepEqual(added.Added, []string{"state"}), out)
	file, err := os.ReadFile(filepath.Join(p.Dir, "worker-compose.yaml"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(file), "worker: package://state"))
	assert.Check(t, is.Contains(string(file), state.Version), "an unpinned name is written as the exact latest version")
	lock, err := os.ReadFile(filepath.Join(p.Dir, "worker-compose.lock"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(lock), state.Version))
	p.WaitReady(t, "state", "app")

	p.MustCall(t, "app::write", "--json", `{"key":"a1","value":"hello"}`)
	p.waitGet(t, "seen", "a1:state:created", `{"event_type":"state:created","key":"a1","new_value":"hello","old_value":null,"scope":"orders","type":"state"}`)
	p.Stop(t)
}
