package queueworker

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
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
	"github.com/iii-sandbox/iii/workers/queue"
)

// deliveryWait bounds a wait for deliveries: a hang guard, not a timing.
const deliveryWait = 2 * time.Minute

type rec struct {
	Fn string `json:"fn"`
	ID string `json:"id"`
	At int64  `json:"at"` // ms
}

type project struct{ *composeproj.Project }

func (p project) records(t *testing.T) []rec {
	t.Helper()
	var out struct {
		Records []rec `json:"records"`
	}
	raw := p.MustCall(t, "app::records")
	assert.NilError(t, json.Unmarshal([]byte(raw), &out), raw)
	return out.Records
}

// of is the records of fn for id, in order.
func of(rs []rec, fn, id string) []rec {
	var out []rec
	for _, r := range rs {
		if r.Fn == fn && r.ID == id {
			out = append(out, r)
		}
	}
	return out
}

// waitRecords waits until cond holds of the records.
func (p project) waitRecords(t *testing.T, what string, cond func([]rec) bool) []rec {
	t.Helper()
	var rs []rec
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		res := p.Call("app::records")
		if res.ExitCode != 0 {
			return poll.Continue("app::records: %s", res.Combined())
		}
		var out struct {
			Records []rec `json:"records"`
		}
		if err := json.Unmarshal([]byte(res.Stdout()), &out); err != nil {
			return poll.Error(err)
		}
		rs = out.Records
		if !cond(rs) {
			return poll.Continue("%s: %d records so far", what, len(rs))
		}
		return poll.Success()
	}, poll.WithTimeout(deliveryWait), poll.WithDelay(200*time.Millisecond))
	return rs
}

// outcome is app::publish's and app::enqueue's answer.
type outcome struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    any    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (p project) try(t *testing.T, fn string, in any) outcome {
	t.Helper()
	b, _ := json.Marshal(in)
	raw := p.MustCall(t, fn, "--json", string(b))
	var o outcome
	assert.NilError(t, json.Unmarshal([]byte(raw), &o), raw)
	return o
}

func (p project) publish(t *testing.T, topic, id string) outcome {
	t.Helper()
	return p.try(t, "app::publish", map[string]any{"topic": topic, "data": map[string]string{"id": id}})
}

func (p project) enqueue(t *testing.T, queueName, fn, id string) outcome {
	t.Helper()
	return p.try(t, "app::enqueue", map[string]any{"queue": queueName, "function_id": fn, "data": map[string]string{"id": id}})
}

func (p project) callJSON(t *testing.T, fn string, in any, out any) {
	t.Helper()
	b, _ := json.Marshal(in)
	raw := p.MustCall(t, fn, "--json", string(b))
	assert.NilError(t, json.Unmarshal([]byte(raw), out), raw)
}

type dlqItem struct {
	ID      string          `json:"id"`
	Payload json.RawMessage `json:"payload"`
	Error   string          `json:"error"`
	Retries int             `json:"retries"`
}

func (p project) dlq(t *testing.T, topic string) []dlqItem {
	t.Helper()
	var items []dlqItem
	p.callJSON(t, "engine::queue::dlq_messages", map[string]string{"topic": topic}, &items)
	return items
}

func (p project) waitLog(t *testing.T, container, text string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if log := p.Log(container); !strings.Contains(log, text) {
			return poll.Continue("the %s log does not show %q yet:\n%s", container, text, composeproj.Tail(log, 5))
		}
		return poll.Success()
	}, poll.WithTimeout(deliveryWait), poll.WithDelay(200*time.Millisecond))
}

const containers = `  queue:
    worker: package://queue
    version: '^0.21'
    config_override:
      queue_configs:
        jobs: { max_retries: 2, backoff_ms: 100 }
`

// startProject runs the Node app and the queue worker with a real
// `iii compose --up`, in the default namespace (the published Node
// iii-sdk 0.22.1 knows no namespaces).
func startProject(t *testing.T) project {
	t.Helper()
	return project{composeproj.StartNodeApp(t, iii, containers)}
}

// TestComposeUpQueue: a project with the queue worker from
// `package://queue` and a Node worker: a durable job that fails twice is
// retried with backoff and succeeds; one that always fails lands in the
// DLQ after max_retries+1 attempts, is redriven and discarded; a publish
// fans out to two subscribers; `action: enqueue` reaches its target
// through the queue worker (the provider credential Compose gave it, and
// only it); bad input is refused with upstream's messages.
func TestComposeUpQueue(t *testing.T) {
	if testing.Short() {
		t.Skip("runs iii compose --up with an engine and Node workers")
	}
	t.Parallel()
	p := startProject(t)
	p.WaitReady(t, "queue", "app")
	lock, err := os.ReadFile(filepath.Join(p.Dir, "worker-compose.lock"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(lock), queue.Version))
	p.waitLog(t, "queue", "serving engine::queue::enqueue")

	// Only the queue package got the provider credential.
	var env struct {
		ProviderToken bool `json:"provider_token"`
	}
	p.callJSON(t, "app::env", map[string]any{}, &env)
	assert.Check(t, !env.ProviderToken, "the app container was given the queue provider credential")

	// Fails twice, then succeeds: three attempts, each retry no sooner
	// than backoff_ms × 2^(attempt-1) after the failure.
	o := p.publish(t, "flaky", "f1")
	assert.Assert(t, o.Error == nil, "%+v", o.Error)
	rs := p.waitRecords(t, "three attempts of f1", func(rs []rec) bool { return len(of(rs, "app::flaky", "f1")) >= 3 })
	f1 := of(rs, "app::flaky", "f1")
	assert.Check(t, f1[1].At-f1[0].At >= 300, "first retry %d ms after the first attempt", f1[1].At-f1[0].At)
	assert.Check(t, f1[2].At-f1[1].At >= 600, "second retry %d ms after the second attempt", f1[2].At-f1[1].At)

	// Always fails: max_retries 1 means two attempts, then the DLQ.
	for _, id := range []string{"d1", "d2"} {
		o := p.publish(t, "doomed", id)
		assert.Assert(t, o.Error == nil, "%+v", o.Error)
	}
	var items []dlqItem
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if items = p.dlq(t, "doomed"); len(items) < 2 {
			return poll.Continue("%d dead letters", len(items))
		}
		return poll.Success()
	}, poll.WithTimeout(deliveryWait), poll.WithDelay(200*time.Millisecond))
	assert.Assert(t, is.Len(items, 2))
	byID := map[string]dlqItem{}
	for _, it := range items {
		var d struct {
			ID string `json:"id"`
		}
		assert.NilError(t, json.Unmarshal(it.Payload, &d))
		byID[d.ID] = it
		assert.Check(t, is.Equal(it.Retries, 2))
		assert.Check(t, is.Contains(it.Error, "doomed"))
	}
	rs = p.records(t)
	assert.Check(t, is.Len(of(rs, "app::doomed", "d1"), 2))
	assert.Check(t, is.Len(of(rs, "app::doomed", "d2"), 2))
	var topics []struct {
		Name         string `json:"name"`
		MessageCount int    `json:"message_count"`
	}
	p.callJSON(t, "engine::queue::dlq_topics", map[string]any{}, &topics)
	assert.Check(t, is.Contains(fmt.Sprint(topics), "{doomed 2}"))

	p.MustCall(t, "app::heal")
	var redriven struct {
		Redriven bool `json:"redriven"`
	}
	p.callJSON(t, "iii::queue::redrive_message", map[string]string{"topic": "doomed", "message_id": byID["d1"].ID}, &redriven)
	assert.Check(t, redriven.Redriven)
	p.waitRecords(t, "the redriven d1", func(rs []rec) bool { return len(of(rs, "app::doomed", "d1")) == 3 })
	var discarded struct {
		Discarded bool `json:"discarded"`
	}
	p.callJSON(t, "iii::queue::discard_message", map[string]string{"topic": "doomed", "message_id": byID["d2"].ID}, &discarded)
	assert.Check(t, discarded.Discarded)
	assert.Check(t, is.Len(p.dlq(t, "doomed"), 0))
	res := p.Call("iii::queue::discard_message", "--json", `{"topic":"doomed","message_id":"`+byID["d2"].ID+`"}`)
	assert.Check(t, res.ExitCode != 0)
	assert.Check(t, is.Contains(res.Combined(), queue.CodeMessageNotFound))

	// Fan-out: both subscribers of the topic get the message.
	o = p.publish(t, "fanout", "x1")
	assert.Assert(t, o.Error == nil, "%+v", o.Error)
	p.waitRecords(t, "x1 at both subscribers", func(rs []rec) bool {
		return len(of(rs, "app::sub1", "x1")) == 1 && len(of(rs, "app::sub2", "x1")) == 1
	})

	// action: enqueue through the queue worker.
	o = p.enqueue(t, "jobs", "app::job", "e1")
	assert.Assert(t, o.Error == nil, "%+v", o.Error)
	var receipt struct {
		ID string `json:"messageReceiptId"`
	}
	assert.NilError(t, json.Unmarshal(o.Result, &receipt), string(o.Result))
	assert.Check(t, receipt.ID != "", string(o.Result))
	p.waitRecords(t, "the enqueued job", func(rs []rec) bool { return len(of(rs, "app::job", "e1")) == 1 })
	var stats struct {
		Depth         int `json:"depth"`
		ConsumerCount int `json:"consumer_count"`
	}
	p.callJSON(t, "engine::queue::topic_stats", map[string]string{"topic": "fanout"}, &stats)
	assert.Check(t, is.Equal(stats.ConsumerCount, 2))

	// Bad input.
	o = p.enqueue(t, "nope", "app::job", "e2")
	assert.Assert(t, o.Error != nil, "an unknown queue was accepted")
	assert.Check(t, is.Contains(o.Error.Message, "function queue 'nope' is not provisioned"))
	o = p.enqueue(t, "", "app::job", "e3")
	assert.Assert(t, o.Error != nil, "an empty queue name was accepted")
	assert.Check(t, is.Contains(o.Error.Message, "INVALID_ARGUMENT: the queue name is empty"))
	o = p.publish(t, "", "p1")
	assert.Assert(t, o.Error != nil, "a publish without a topic was accepted")
	assert.Check(t, is.Contains(o.Error.Message, "topic_not_set"))
	p.MustCall(t, "app::subscribe", "--json", `{"function_id":"app::sub1","config":{"queue":""}}`)
	p.waitLog(t, "app", "INVALID_CONFIG: durable:subscriber needs a non-empty queue (or topic)")
	p.MustCall(t, "app::subscribe", "--json", `{"function_id":"app::sub1","config":{"queue":"q","queue_config":{"type":"lifo"}}}`)
	p.waitLog(t, "app", "queue_config.type must be concurrent or fifo")
	p.Stop(t)
}

// TestQueueRestarts: messages accepted while the queue worker and then
// the engine restart (a backlog under way at each) are all delivered,
// at least once each.
func TestQueueRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs iii compose --up with an engine and Node workers")
	}
	t.Parallel()
	p := startProject(t)
	p.WaitReady(t, "queue", "app")
	p.waitLog(t, "queue", "serving engine::queue::enqueue")
	var accepted, jobs []string
	many := func(fn string, in map[string]any) []string {
		var out struct {
			Accepted []string `json:"accepted"`
		}
		p.callJSON(t, fn, in, &out)
		return out.Accepted
	}
	accepted = append(accepted, many("app::publish_many", map[string]any{"topic": "durable", "prefix": "a", "n": 30})...)
	p.waitRecords(t, "a backlog under way", func(rs []rec) bool { return len(rs) >= 3 })

	// The queue worker restarts mid-run.
	t.Logf("restarting the queue worker after %d of %d deliveries", len(p.records(t)), len(accepted))
	p.MustCall(t, "compose::restart", "worker=queue")
	p.WaitReady(t, "queue", "app")
	accepted = append(accepted, many("app::publish_many", map[string]any{"topic": "durable", "prefix": "b", "n": 20})...)
	jobs = many("app::enqueue_many", map[string]any{"queue": "jobs", "function_id": "app::job", "prefix": "j", "n": 5})

	// Then the engine (and everything else) while a backlog waits.
	t.Logf("restarting the engine after %d of %d deliveries", len(p.records(t)), len(accepted)+len(jobs))
	p.Stop(t)
	p = project{p.Restart(t)}
	p.WaitReady(t, "queue", "app")
	assert.Check(t, len(accepted) == 50, "accepted %d of 50 publishes", len(accepted))
	assert.Check(t, len(jobs) == 5, "accepted %d of 5 enqueues", len(jobs))
	rs := p.waitRecords(t, "every accepted message", func(rs []rec) bool {
		for _, id := range accepted {
			if len(of(rs, "app::durable", id)) == 0 {
				return false
			}
		}
		for _, id := range jobs {
			if len(of(rs, "app::job", id)) == 0 {
				return false
			}
		}
		return true
	})
	t.Logf("%d deliveries of %d accepted messages", len(rs), len(accepted)+len(jobs))
	p.Stop(t)
}
