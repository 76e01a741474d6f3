package cronworker

import (
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
	"github.com/iii-sandbox/iii/workers/cron"
)

// tickWait bounds a wait for some ticks of a job firing every second: a
// hang guard, not a timing.
const tickWait = time.Minute

type tick struct {
	Trigger       string `json:"trigger"`
	JobID         string `json:"job_id"`
	ScheduledTime string `json:"scheduled_time"`
	ActualTime    string `json:"actual_time"`
}

type record struct {
	Ticks     []tick   `json:"ticks"`
	Consulted []string `json:"consulted"`
}

func (r record) of(job string) []tick {
	var out []tick
	for _, t := range r.Ticks {
		if t.JobID == job {
			out = append(out, t)
		}
	}
	return out
}

type project struct{ *composeproj.Project }

func (p project) record(t *testing.T) record {
	t.Helper()
	var r record
	out := p.MustCall(t, "app::ticks")
	assert.NilError(t, json.Unmarshal([]byte(out), &r), out)
	return r
}

// waitTicks waits until cond holds of the record.
func (p project) waitTicks(t *testing.T, what string, cond func(record) bool) record {
	t.Helper()
	var r record
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		res := p.Call("app::ticks")
		if res.ExitCode != 0 {
			return poll.Continue("app::ticks: %s", res.Combined())
		}
		r = record{}
		if err := json.Unmarshal([]byte(res.Stdout()), &r); err != nil {
			return poll.Error(err)
		}
		if !cond(r) {
			return poll.Continue("%s: %d ticks so far", what, len(r.Ticks))
		}
		return poll.Success()
	}, poll.WithTimeout(tickWait), poll.WithDelay(200*time.Millisecond))
	return r
}

// newJob schedules a job and returns its job_id, learnt from its first
// fire (or, for a job whose condition is false, its first consultation).
func (p project) newJob(t *testing.T, name, expr, condition string) string {
	t.Helper()
	before := p.record(t)
	known := map[string]bool{}
	for _, tk := range before.Ticks {
		known[tk.JobID] = true
	}
	for _, id := range before.Consulted {
		known[id] = true
	}
	req, _ := json.Marshal(map[string]string{"name": name, "expression": expr, "condition": condition})
	p.MustCall(t, "app::schedule", "--json", string(req))
	var id string
	p.waitTicks(t, "the first fire of "+name, func(r record) bool {
		ids := r.Consulted
		for _, tk := range r.Ticks {
			ids = append(ids, tk.JobID)
		}
		for _, i := range ids {
			if !known[i] {
				id = i
				return true
			}
		}
		return false
	})
	return id
}

// checkOnce: every fire of job is a distinct whole-second tick of the
// payload upstream sends, never before its tick.
func checkOnce(t *testing.T, ticks []tick) {
	t.Helper()
	seen := map[string]int{}
	for _, tk := range ticks {
		seen[tk.ScheduledTime]++
		assert.Check(t, is.Equal(tk.Trigger, "cron"))
		sched, err := time.Parse(time.RFC3339, tk.ScheduledTime)
		assert.Check(t, err)
		assert.Check(t, sched.Nanosecond() == 0 && strings.HasSuffix(tk.ScheduledTime, "Z"), tk.ScheduledTime)
		actual, err := time.Parse(time.RFC3339Nano, tk.ActualTime)
		assert.Check(t, err)
		assert.Check(t, !actual.Before(sched), "fired at %s, before its tick %s", tk.ActualTime, tk.ScheduledTime)
	}
	for s, n := range seen {
		assert.Check(t, is.Equal(n, 1), "tick %s fired %d times", s, n)
	}
}

// startProject runs a project of the Node app and containers (the
// containers: block's entries, indented by two) with a real
// `iii compose --up`, in the default namespace: the published Node iii-sdk
// 0.22.1 knows no namespaces (docs/standard-workers.md).
func startProject(t *testing.T, containers string) project {
	t.Helper()
	return project{composeproj.StartNodeApp(t, iii, containers)}
}

// TestComposeUpCron: a project with two cron workers from `package://cron`
// and a Node worker: a job every second fires once per tick between the
// two workers (also while one of them restarts and the other takes its
// jobs), a condition answering false keeps its job from firing, an
// invalid expression is refused with INVALID_CRON_EXPRESSION, and an
// unregistered trigger stops firing.
func TestComposeUpCron(t *testing.T) {
	if testing.Short() {
		t.Skip("runs iii compose --up with an engine and Node workers")
	}
	t.Parallel()
	p := startProject(t, `  cron:
    worker: package://cron
    version: '^0.21'
  cron2:
    worker: package://cron
    version: '^0.21'
    environment: { III_LOG_LEVEL: debug }
`)
	p.WaitReady(t, "cron", "cron2", "app")
	lock, err := os.ReadFile(filepath.Join(p.Dir, "worker-compose.lock"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(lock), cron.Version))

	// A job every second, and a clock job to count seconds by.
	every := p.newJob(t, "every", "* * * * * *", "")
	clock := p.newJob(t, "clock", "*/1 * * * * *", "")
	never := p.newJob(t, "never", "* * * * * *", "app::never")
	r := p.waitTicks(t, "5 fires of the job", func(r record) bool { return len(r.of(every)) >= 5 })
	checkOnce(t, r.of(every))
	_, err = os.Stat(filepath.Join(p.Dir, "data", "cron"))
	assert.NilError(t, err, "the local lock lives in the compose directory")

	// One cron worker restarts: the engine gives the trigger type (and
	// the jobs) to whichever registered last; still one fire per tick.
	p.MustCall(t, "compose::restart", "worker=cron")
	p.WaitReady(t, "cron", "cron2", "app")
	n := len(r.of(every))
	r = p.waitTicks(t, "5 more fires after the restart", func(r record) bool { return len(r.of(every)) >= n+5 })
	checkOnce(t, r.of(every))
	checkOnce(t, r.of(clock))

	// The condition answered false every time: consulted, never fired.
	assert.Check(t, is.Contains(r.Consulted, never))
	assert.Check(t, is.Len(r.of(never), 0))

	// An invalid expression: the registrant is told (the Node SDK logs it).
	p.MustCall(t, "app::schedule", "--json", `{"name":"bad","expression":"*/5 * * * *"}`)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if log := p.Log("app"); !strings.Contains(log, "INVALID_CRON_EXPRESSION: invalid cron expression '*/5 * * * *'") {
			return poll.Continue("the app's log does not show the refusal yet:\n%s", composeproj.Tail(log, 5))
		}
		return poll.Success()
	}, poll.WithTimeout(tickWait), poll.WithDelay(200*time.Millisecond))

	// Unregistered: the cron worker removes the job; once the clock job
	// has fired again (a call of the job under way has landed), the
	// count holds while the clock ticks three more times.
	p.MustCall(t, "app::unschedule", "name=every")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if log := p.Log("cron"); !strings.Contains(log, "cron trigger removed: job_id="+every) {
			return poll.Continue("no cron worker has removed %s yet", every)
		}
		return poll.Success()
	}, poll.WithTimeout(tickWait), poll.WithDelay(200*time.Millisecond))
	c := len(p.record(t).of(clock))
	r = p.waitTicks(t, "a clock tick after the removal", func(r record) bool { return len(r.of(clock)) >= c+1 })
	stopped, c := len(r.of(every)), len(r.of(clock))
	r = p.waitTicks(t, "3 more clock ticks", func(r record) bool { return len(r.of(clock)) >= c+3 })
	assert.Check(t, is.Len(r.of(every), stopped), "the unregistered job fired again")
	checkOnce(t, r.of(clock))

	p.Stop(t)
}

// TestComposeAddCron: `compose::add worker=cron` adds the package from the
// default registry (no network), edits the file and the lock, starts it,
// and the Node worker's cron trigger, registered before any cron worker
// existed (parked by the engine), fires.
func TestComposeAddCron(t *testing.T) {
	if testing.Short() {
		t.Skip("runs iii compose --up with an engine and Node workers")
	}
	t.Parallel()
	p := startProject(t, "")
	p.WaitReady(t, "app")
	p.MustCall(t, "app::schedule", "--json", `{"name":"early","expression":"* * * * * *"}`)

	out := p.MustCall(t, "compose::add", "worker=cron")
	var added struct {
		Added  []string `json:"added"`
		Edited bool     `json:"edited"`
	}
	assert.NilError(t, json.Unmarshal([]byte(out), &added), out)
	assert.Check(t, added.Edited, out)
	assert.Check(t, is.DeepEqual(added.Added, []string{"cron"}), out)
	file, err := os.ReadFile(filepath.Join(p.Dir, "worker-compose.yaml"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(file), "worker: package://cron"))
	assert.Check(t, is.Contains(string(file), cron.Version), "an unpinned name is written as the exact latest version")
	lock, err := os.ReadFile(filepath.Join(p.Dir, "worker-compose.lock"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(lock), cron.Version))
	p.WaitReady(t, "cron", "app")

	r := p.waitTicks(t, "3 fires of the parked job", func(r record) bool { return len(r.Ticks) >= 3 })
	checkOnce(t, r.Ticks)
	p.Stop(t)
}
