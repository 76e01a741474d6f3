package authority

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// waitFor bounds every wait of these tests: a hang guard, not a timing.
const waitFor = 30 * time.Second

const token = "authority-acceptance-token"

var workerScript = nodesdk.Script{Path: filepath.Join("testdata", "worker.mjs"), RejectNonJSON: true}

// engine is a real `iii` process.
type engine struct {
	port int
	logs *syncbuf.Buffer
}

func (e *engine) url() string { return "ws://127.0.0.1:" + strconv.Itoa(e.port) }

func freePort(t *testing.T) int {
	t.Helper()
	p, err := loopback.FreePort()
	assert.NilError(t, err)
	return p
}

// startEngine runs `iii -c config.yaml` with a listener, iii-stream and
// the engine token until the test ends.
func startEngine(t *testing.T) *engine {
	t.Helper()
	dir := t.TempDir()
	e := &engine{port: freePort(t), logs: &syncbuf.Buffer{}}
	config := fmt.Sprintf(`engine_token: %s
workers:
  - name: iii-worker-manager
    config: { host: 127.0.0.1, port: %d }
  - name: iii-stream
    config:
      host: 127.0.0.1
      port: %d
      adapter:
        name: kv
        config: { store_method: file_based, file_path: ./data/streams }
`, token, e.port, freePort(t))
	path := filepath.Join(dir, "config.yaml")
	assert.NilError(t, os.WriteFile(path, []byte(config), 0o644))
	cmd := exec.Command(iiiBinary(t), "-c", path)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+dir)
	cmd.Stdout, cmd.Stderr = e.logs, e.logs
	assert.NilError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			waitfor.Closed(t, done, waitfor.Default, "the killed engine to be reaped")
		}
		if t.Failed() {
			t.Logf("engine log:\n%s", e.logs.String())
		}
	})
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case <-done:
			return poll.Error(fmt.Errorf("the engine exited:\n%s", e.logs.String()))
		default:
		}
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(e.port))
		if err != nil {
			return poll.Continue("the engine does not listen yet")
		}
		c.Close()
		return poll.Success()
	}, poll.WithTimeout(waitFor))
	return e
}

// waitRefused waits for the engine's warning that it refused a call of
// functionID that an anonymous principal set up (what).
func (e *engine) waitRefused(t *testing.T, what, functionID, via string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, line := range strings.Split(e.logs.String(), "\n") {
			if strings.Contains(line, what+" refused") && strings.Contains(line, "function_id="+functionID) &&
				strings.Contains(line, "principal=anonymous") && strings.Contains(line, "worker_id=") && strings.Contains(line, via) {
				return poll.Success()
			}
		}
		return poll.Continue("no refusal of %s %s logged", what, functionID)
	}, poll.WithTimeout(waitFor), poll.WithDelay(20*time.Millisecond))
}

func job(e *engine, mode, name string, admin bool, extra map[string]any) map[string]any {
	j := map[string]any{"mode": mode, "url": e.url(), "name": name}
	if admin {
		j["headers"] = map[string]string{"Authorization": "Bearer " + token}
	}
	for k, v := range extra {
		j[k] = v
	}
	return j
}

// calls runs a Node caller and returns one line per call.
func calls(t *testing.T, sdk nodesdk.SDK, e *engine, admin bool, cs ...map[string]any) []map[string]any {
	t.Helper()
	p := sdk.Start(t, workerScript, job(e, "call", "caller", admin, map[string]any{"calls": cs}), waitFor)
	out := make([]map[string]any, 0, len(cs))
	for range cs {
		out = append(out, p.Line(t, waitFor))
	}
	select {
	case <-p.Done():
		assert.NilError(t, p.Err(), "the caller exits cleanly")
	case <-time.After(waitFor):
		t.Fatal("caller did not exit")
	}
	return out
}

func call(fn string, payload any) map[string]any {
	return map[string]any{"function_id": fn, "payload": payload}
}

// opsUntil reads the ops worker's lines until it reports a call of fn
// whose input has mark, failing on any call of ops::wipe or ops::note
// before it: the attacker's targets never run.
func opsUntil(t *testing.T, ops *nodesdk.Proc, fn, mark string) {
	t.Helper()
	for {
		line := ops.Line(t, waitFor)
		called, _ := line["called"].(string)
		input := fmt.Sprint(line["input"])
		if called == fn && strings.Contains(input, mark) {
			return
		}
		assert.Assert(t, called != "ops::wipe" && called != "ops::note",
			"%s ran for the attacker: %v (waiting for %s %s)", called, line, fn, mark)
	}
}

// TestConfusedDeputyNodeSDK is the attack and its variants, each
// with a control that takes the same path and is observed.
func TestConfusedDeputyNodeSDK(t *testing.T) {
	sdk := nodesdk.Find(t)
	e := startEngine(t)

	hooksP := sdk.Start(t, workerScript, job(e, "hooks", "hooks", true, nil), waitFor)
	assert.Equal(t, hooksP.Line(t, waitFor)["started"], true)
	queue := sdk.Start(t, workerScript, job(e, "queue", "queue", true, nil), waitFor)
	assert.Equal(t, queue.Line(t, waitFor)["started"], true)

	// The attacker binds before ops::wipe exists, so registration lets it
	// by; and enqueues to it.
	trig := func(typ, fn string, config map[string]any) map[string]any {
		return map[string]any{"type": typ, "function_id": fn, "config": config}
	}
	cfg := func(extra map[string]any) map[string]any {
		c := map[string]any{"configuration_id": "app", "event_types": []string{"configuration:updated"}}
		for k, v := range extra {
			c[k] = v
		}
		return c
	}
	cond := map[string]any{"condition_function_id": "ops::wipe"}
	attacker := sdk.Start(t, workerScript, job(e, "attacker", "attacker", false, map[string]any{
		"triggers": []map[string]any{
			trig("stream", "ops::wipe", map[string]any{"stream_name": "s"}),
			trig("stream", "ops::note", map[string]any{"stream_name": "s", "condition_function_id": "ops::wipe"}),
			trig("stream", "ops::log", map[string]any{"stream_name": "s"}),
			trig("configuration", "ops::wipe", cfg(nil)),
			trig("configuration", "ops::note", cfg(cond)),
			trig("configuration", "ops::log", cfg(nil)),
			trig("webhook", "ops::wipe", nil),
			trig("webhook", "ops::note", cond),
			trig("webhook", "ops::log", nil),
		},
		"enqueue": []string{"ops::wipe", "ops::log"},
	}), waitFor)
	for {
		line := attacker.Line(t, waitFor)
		if line["started"] == true {
			break
		}
		assert.Assert(t, line["enqueued"] != nil, "%v", line)
	}
	hooks := map[string]string{} // webhook binding id → function
	for len(hooks) < 3 {
		line := hooksP.Line(t, waitFor)
		hooks[line["bound"].(string)] = line["function_id"].(string)
	}
	for range 2 {
		assert.Assert(t, queue.Line(t, waitFor)["queued"] != nil)
	}

	// Now an admin registers ops::wipe, privileged.
	ops := sdk.Start(t, workerScript, job(e, "ops", "ops", true, nil), waitFor)
	assert.Equal(t, ops.Line(t, waitFor)["started"], true)

	t.Run("stream trigger and its condition", func(t *testing.T) {
		res := calls(t, sdk, e, false,
			call("stream::set", map[string]any{"stream_name": "s", "group_id": "g", "item_id": "i", "data": map[string]any{"payload": "attacker"}}),
			call("ops::wipe", map[string]any{"payload": "direct"}))
		assert.Equal(t, res[0]["ok"], true, "%v", res[0])
		assert.Equal(t, res[1]["ok"], false, "the attacker's direct call: %v", res[1])
		assert.Equal(t, res[1]["code"], "UNAUTHORIZED")
		opsUntil(t, ops, "ops::log", "attacker") // the control, the same write
		e.waitRefused(t, "invocation", "ops::wipe", "via=trigger")
	})

	t.Run("configuration trigger and its condition", func(t *testing.T) {
		res := calls(t, sdk, e, true,
			call("configuration::register", map[string]any{"id": "app", "schema": map[string]any{"type": "object"}, "initial_value": map[string]any{}}),
			call("configuration::set", map[string]any{"id": "app", "value": map[string]any{"payload": "attacker-cfg"}}))
		for _, r := range res {
			assert.Equal(t, r["ok"], true, "%v", r)
		}
		opsUntil(t, ops, "ops::log", "attacker-cfg")
		// Both refusals (target and condition) are logged; count them.
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			n := strings.Count(e.logs.String(), "configuration trigger condition failed")
			if n >= 1 {
				return poll.Success()
			}
			return poll.Continue("the condition's refusal is not logged yet")
		}, poll.WithTimeout(waitFor), poll.WithDelay(20*time.Millisecond))
	})

	t.Run("enqueued call", func(t *testing.T) {
		res := calls(t, sdk, e, false, call("queue::deliver", map[string]any{}))
		assert.Equal(t, res[0]["ok"], true, "%v", res[0])
		got := map[string]map[string]any{}
		for len(got) < 2 {
			line := queue.Line(t, waitFor)
			if d, ok := line["delivered"].(string); ok {
				got[d] = line
			}
		}
		assert.Equal(t, got["ops::wipe"]["ok"], false, "%v", got)
		assert.Equal(t, got["ops::wipe"]["code"], "UNAUTHORIZED")
		assert.Equal(t, got["ops::log"]["ok"], true, "%v", got)
		opsUntil(t, ops, "ops::log", "ops::log") // {"enqueued":"ops::log"}
		e.waitRefused(t, "delivery by a provider", "ops::wipe", "via=enqueue")
	})

	t.Run("trigger type served by a worker with the engine token", func(t *testing.T) {
		res := calls(t, sdk, e, false, call("hooks::fire", map[string]any{}))
		assert.Equal(t, res[0]["ok"], true, "%v", res[0])
		fired := map[string]map[string]any{}
		for len(fired) < 3 {
			line := hooksP.Line(t, waitFor)
			if id, ok := line["fired"].(string); ok {
				fired[hooks[id]] = line
			}
		}
		assert.Equal(t, fired["ops::wipe"]["code"], "UNAUTHORIZED", "%v", fired)
		assert.Equal(t, fired["ops::note"]["code"], "UNAUTHORIZED", "the condition: %v", fired)
		assert.Equal(t, fired["ops::log"]["ok"], true, "%v", fired)
		opsUntil(t, ops, "ops::log", "webhook")
		e.waitRefused(t, "delivery by a provider", "ops::wipe", "via=trigger")
	})

	// ops::wipe itself works: the engine token's holder's call runs it,
	// and it is the first ops::wipe the ops worker ever saw.
	res := calls(t, sdk, e, true, call("ops::wipe", map[string]any{"payload": "admin-final"}))
	assert.Equal(t, res[0]["ok"], true, "%v", res[0])
	opsUntil(t, ops, "ops::wipe", "admin-final")
}
