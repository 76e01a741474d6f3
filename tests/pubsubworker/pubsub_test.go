package pubsubworker

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
	"github.com/iii-sandbox/iii/workers/pubsub"
)

// wait bounds the waits for deliveries: a hang guard, not a timing.
const wait = time.Minute

type received struct {
	A []json.RawMessage `json:"a"`
	B []json.RawMessage `json:"b"`
}

// TestComposeAddPubsub: `compose::add worker=pubsub` adds the deprecated
// package from the default registry (no network) and starts it; the Node
// worker's subscribe triggers, registered before any pubsub worker
// existed, then receive each publish once, both subscribers, whether it
// comes from `iii call publish` or from the Node worker's own trigger of
// `publish`; a publish without a topic is refused with topic_not_set; the
// worker logs its deprecation with the replacement.
func TestComposeAddPubsub(t *testing.T) {
	if testing.Short() {
		t.Skip("runs iii compose --up with an engine and Node workers")
	}
	t.Parallel()
	p := composeproj.StartNodeApp(t, iii, "")
	p.WaitReady(t, "app")

	out := p.MustCall(t, "compose::add", "worker=pubsub")
	assert.Check(t, is.Contains(out, `"pubsub"`), out)
	file, err := os.ReadFile(filepath.Join(p.Dir, "worker-compose.yaml"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(file), "worker: package://pubsub"))
	lock, err := os.ReadFile(filepath.Join(p.Dir, "worker-compose.lock"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(lock), pubsub.Version))
	p.WaitReady(t, "pubsub", "app")

	got := func() received {
		var r received
		out := p.MustCall(t, "app::received")
		assert.NilError(t, json.Unmarshal([]byte(out), &r), out)
		return r
	}
	// The triggers settle as the pubsub worker registers its trigger
	// type: publish until both subscribers have one.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if res := p.Call("publish", "--json", `{"topic":"news","data":{"n":0}}`); res.ExitCode != 0 {
			return poll.Continue("publish: %s", res.Combined())
		}
		if r := got(); len(r.A) == 0 || len(r.B) == 0 {
			return poll.Continue("a got %d, b got %d", len(r.A), len(r.B))
		}
		return poll.Success()
	}, poll.WithTimeout(wait), poll.WithDelay(300*time.Millisecond))

	// From now on every publish reaches both, once.
	before := got()
	p.MustCall(t, "publish", "--json", `{"topic":"news","data":{"n":1}}`)
	p.MustCall(t, "app::announce", "--json", `{"data":"from node"}`)
	p.MustCall(t, "publish", "--json", `{"topic":"weather","data":"nobody listens"}`)
	var r received
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		r = got()
		if len(r.A) < len(before.A)+2 || len(r.B) < len(before.B)+2 {
			return poll.Continue("a got %d, b got %d", len(r.A)-len(before.A), len(r.B)-len(before.B))
		}
		return poll.Success()
	}, poll.WithTimeout(wait), poll.WithDelay(200*time.Millisecond))
	for _, l := range [][]json.RawMessage{r.A[len(before.A):], r.B[len(before.B):]} {
		var s []string
		for _, m := range l {
			var b bytes.Buffer
			assert.NilError(t, json.Compact(&b, m))
			s = append(s, b.String())
		}
		assert.Check(t, is.DeepEqual(s, []string{`{"n":1}`, `"from node"`}))
	}

	res := p.Call("publish", "--json", `{"data":1}`)
	assert.Check(t, res.ExitCode != 0)
	assert.Check(t, is.Contains(res.Combined(), pubsub.CodeTopicNotSet))

	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if log := p.Log("pubsub"); !strings.Contains(log, "pubsub is deprecated") || !strings.Contains(log, "iii::durable::publish") {
			return poll.Continue("no deprecation warning in the pubsub log yet:\n%s", composeproj.Tail(log, 5))
		}
		return poll.Success()
	}, poll.WithTimeout(wait), poll.WithDelay(200*time.Millisecond))
	p.Stop(t)
}
