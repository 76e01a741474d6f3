package tenancy

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
	"github.com/iii-sandbox/iii/protocol"
)

// sandboxScript is the router tests' Node SDK driver: as an adapter it
// registers <name>::* (the sixteen operations and adapter::info), as a
// caller it makes calls and prints one JSON line each.
var sandboxScript = nodesdk.Script{Path: filepath.Join("..", "..", "host", "router", "testdata", "node", "sandbox.mjs")}

// With the published Node iii-sdk: a worker without the engine token that
// serves the installed adapter's names in a namespace of its own has every
// registration refused, and receives nothing; an anonymous Node caller
// sees only the sandbox it created, and exec or stop of the engine token
// holder's sandbox answers S002.
func TestNodeSDKWorkersRealEngine(t *testing.T) {
	t.Parallel()
	ne := nodesdk.Find(t)
	e := startEngine(t, "sandbox:\n  adapter: sandbox-hostdir\n  namespace: default\n  config: "+hostdirConfig(t)+"\n")
	admin, _ := dial(t, e, "admin", "", token)

	p := ne.Start(t, sandboxScript, map[string]any{"mode": "adapter", "url": e.url, "name": "sandbox-hostdir", "namespace": "squat", "major": 1}, waitFor)
	assert.Equal(t, p.Line(t, waitFor)["started"], true)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		logs := e.logs.String()
		for _, id := range []string{"sandbox-hostdir::adapter::info", "sandbox-hostdir::create", "sandbox-hostdir::fs::sed"} {
			if !strings.Contains(logs, "function_id="+id+" namespace=squat code=FORBIDDEN") {
				return poll.Continue("the refusal of %s is not logged yet", id)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(waitFor), poll.WithDelay(20*time.Millisecond))
	_, err := call(t, admin, "squat", "sandbox-hostdir::create", map[string]any{"image": "shell", "env": []string{"SECRET=1"}})
	assert.Equal(t, err != nil && strings.Contains(err.Error(), protocol.CodeFunctionNotFound), true, "%v", err)

	var idAdmin string
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		out, err := call(t, admin, "default", "sandbox::create", map[string]any{"image": "shell"})
		if err != nil {
			return poll.Continue("sandbox::create: %v", err)
		}
		idAdmin = out["sandbox_id"].(string)
		return poll.Success()
	}, poll.WithTimeout(waitFor), poll.WithDelay(50*time.Millisecond))

	c := ne.Start(t, sandboxScript, map[string]any{"mode": "call", "url": e.url, "name": "node-caller", "calls": []map[string]any{
		{"function_id": "sandbox::create", "payload": map[string]any{"image": "shell"}},
		{"function_id": "sandbox::list", "payload": map[string]any{}},
		{"function_id": "sandbox::exec", "payload": map[string]any{"sandbox_id": idAdmin, "cmd": "true"}},
		{"function_id": "sandbox::stop", "payload": map[string]any{"sandbox_id": idAdmin}},
	}}, waitFor)
	created := c.Line(t, waitFor)
	assert.Equal(t, created["ok"], true, "%v", created)
	mine := created["result"].(map[string]any)["sandbox_id"].(string)
	listed := c.Line(t, waitFor)
	assert.Equal(t, listed["ok"], true, "%v", listed)
	sbs := listed["result"].(map[string]any)["sandboxes"].([]any)
	assert.Assert(t, is.Len(sbs, 1))
	assert.Equal(t, sbs[0].(map[string]any)["sandbox_id"], mine)
	for _, op := range []string{"exec", "stop"} {
		r := c.Line(t, waitFor)
		assert.Equal(t, r["ok"], false, "%s: %v", op, r)
		assert.Equal(t, r["sandbox_error"].(map[string]any)["code"], "S002", "%s: %v", op, r)
	}
	// The admin's sandbox still runs.
	out := mustCall(t, admin, "default", "sandbox::exec", map[string]any{"sandbox_id": idAdmin, "cmd": "echo still-here"})
	assert.Equal(t, out["stdout"], "still-here\n")
}
