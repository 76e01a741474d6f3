package configuration

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/protocol"
)

func (f *fixture) waitBound(t *testing.T, n int) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		f.w.trig.mu.Lock()
		got := len(f.w.trig.bound)
		f.w.trig.mu.Unlock()
		if got != n {
			return poll.Continue("%d configuration triggers bound, want %d", got, n)
		}
		return poll.Success()
	}, poll.WithTimeout(3*time.Second), poll.WithDelay(2*time.Millisecond))
}

// payloadLine renders a trigger payload as one line, without the
// _caller_worker_id the engine may add.
func payloadLine(t *testing.T, data json.RawMessage) string {
	var p map[string]json.RawMessage
	assert.NilError(t, json.Unmarshal(data, &p))
	assert.Equal(t, string(p["type"]), `"configuration"`)
	var typ, id string
	assert.NilError(t, json.Unmarshal(p["event_type"], &typ))
	assert.NilError(t, json.Unmarshal(p["id"], &id))
	s := typ + " " + id + " old=" + string(p["old_value"]) + " new=" + string(p["new_value"])
	if m, ok := p["metadata"]; ok {
		s += " meta=" + string(m)
	}
	return s
}

// TestTriggerThroughSocket: socket workers register triggers of type
// configuration; register, set and a hand edit of the file reach them in
// order, filtered by configuration_id, event_types and condition
// functions; a worker without the engine token gets the stored templates,
// as its configuration::get would.
func TestTriggerThroughSocket(t *testing.T) {
	const token = "cfg-trigger-token"
	sf := attachedOverSocket(t, token, env{"PORT": "7000"})
	f, dial := sf.fixture, sf.dial
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, worker := dial("admin", token), dial("worker", "")

	recs := map[string]*recorder{}
	handle := func(c *client.Client, id string, answer any, fail bool) {
		rec := &recorder{}
		recs[id] = rec
		_, err := c.RegisterFunction(client.FunctionDef{ID: id}, func(_ context.Context, inv *client.Invocation) (any, error) {
			rec.add(payloadLine(t, inv.Data))
			if fail {
				return nil, &protocol.ErrorBody{Code: "NOPE", Message: "condition failed"}
			}
			return answer, nil
		})
		assert.NilError(t, err)
	}
	handle(admin, "watch::http", nil, false)
	handle(admin, "watch::all", nil, false)
	handle(admin, "cond::false", false, false)
	handle(admin, "cond::obj", map[string]any{"ok": 1}, false)
	handle(admin, "cond::err", nil, true)
	handle(admin, "got::false", nil, false)
	handle(admin, "got::obj", nil, false)
	handle(admin, "got::err", nil, false)
	handle(worker, "plain::http", nil, false)

	trigger := func(c *client.Client, fn, config string) {
		_, err := c.RegisterTrigger(client.TriggerDef{TriggerType: TriggerType, FunctionID: fn, Config: json.RawMessage(config)})
		assert.NilError(t, err)
	}
	trigger(admin, "watch::http", `{"configuration_id":"http","event_types":["configuration:registered","configuration:updated"]}`)
	trigger(admin, "watch::all", `{"event_types":["configuration:deleted"]}`)
	trigger(admin, "got::false", `{"configuration_id":"http","condition_function_id":"cond::false"}`)
	trigger(admin, "got::obj", `{"configuration_id":"http","condition_function_id":"cond::obj"}`)
	trigger(admin, "got::err", `{"configuration_id":"http","condition_function_id":"cond::err"}`)
	trigger(worker, "plain::http", `{"configuration_id":"http","event_types":["configuration:registered"]}`)
	f.waitBound(t, 6)

	_, err := admin.Call(ctx, FnRegister, json.RawMessage(`{"id":"http","schema":`+portSchema+`,"initial_value":{"port":"${PORT:3111}"},"metadata":{"team":"a"}}`))
	assert.NilError(t, err)
	_, err = admin.Call(ctx, FnSet, json.RawMessage(`{"id":"http","value":{"port":8080}}`))
	assert.NilError(t, err)
	_, err = admin.Call(ctx, FnGet, json.RawMessage(`{"id":"http"}`)) // reads never fire
	assert.NilError(t, err)
	_, err = admin.Call(ctx, FnRegister, json.RawMessage(`{"id":"other","schema":{"type":"integer"},"initial_value":1}`))
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(filepath.Join(f.dir, "http.yaml"), []byte("id: http\nname: http\ndescription: \"\"\nvalue:\n  port: 8081\n"), 0o600))
	poll.WaitOn(t, valueIs(f, "http", `{"port":8081}`))
	assert.NilError(t, os.Remove(filepath.Join(f.dir, "other.yaml")))

	updates := []string{
		`configuration:registered http old=null new={"port":7000} meta={"team":"a"}`,
		`configuration:updated http old={"port":7000} new={"port":8080} meta={"team":"a"}`,
		`configuration:updated http old={"port":8080} new={"port":8081} meta={"team":"a"}`,
	}
	recs["watch::http"].waitFor(t, updates...)
	recs["watch::all"].waitFor(t, `configuration:deleted other old=1 new=null`)
	recs["got::obj"].waitFor(t, updates...)
	recs["cond::false"].waitFor(t, updates...)
	recs["cond::err"].waitFor(t, updates...)
	recs["plain::http"].waitFor(t, `configuration:registered http old=null new={"port":"${PORT:3111}"} meta={"team":"a"}`)
	assert.Equal(t, len(recs["got::false"].list()), 0, "a condition answering false skips the trigger")
	assert.Equal(t, len(recs["got::err"].list()), 0, "a failing condition skips the trigger")
	assert.Assert(t, strings.Contains(f.logs.String(), "configuration trigger condition failed"))

	// A worker that leaves takes its trigger with it.
	assert.NilError(t, worker.Close(context.Background()))
	f.waitBound(t, 5)
}

// TestTriggerConfig: what a trigger's config may hold.
func TestTriggerConfig(t *testing.T) {
	eng := engine.New(engine.Options{Logger: hclog.NewNullLogger(), Version: "0.26.0"})
	t.Cleanup(func() { assert.NilError(t, eng.Close(context.Background())) })
	f := newWorker(t, nil)
	assert.NilError(t, f.w.Attach(eng))
	for _, tc := range []struct {
		config string
		err    string
	}{
		{``, ""},
		{`null`, ""},
		{`{}`, ""},
		{`{"configuration_id":"http","event_types":["configuration:updated"],"condition_function_id":"c::f","extra":1}`, ""},
		{`[]`, "config must be an object"},
		{`{"configuration_id":3}`, "config must be an object"},
		{`{"configuration_id":"Bad Id"}`, "not a valid configuration id"},
		{`{"event_types":[]}`, "event_types is empty"},
		{`{"event_types":["configuration:changed"]}`, `unknown event type "configuration:changed"`},
		{`{"event_types":"configuration:updated"}`, "config must be an object"},
	} {
		b := engine.TriggerBinding{ID: "t", TriggerType: TriggerType, FunctionID: "x::y", Namespace: engine.DefaultNamespace, Config: json.RawMessage(tc.config)}
		err := f.w.trig.RegisterTrigger(b)
		if tc.err == "" {
			assert.NilError(t, err, tc.config)
			f.w.trig.UnregisterTrigger(b)
			continue
		}
		var eb *protocol.ErrorBody
		assert.Assert(t, errors.As(err, &eb), "%s: %v", tc.config, err)
		assert.Equal(t, eb.Code, CodeInvalidRequest, tc.config)
		assert.ErrorContains(t, err, tc.err, tc.config)
	}
	f.waitBound(t, 0)
}

// TestTriggerTTL: with ttl_seconds set, an entry the last trigger naming
// it left is deleted after the TTL (file and registration, with a
// configuration:deleted event); a trigger naming it again in time keeps it.
func TestTriggerTTL(t *testing.T) {
	eng := engine.New(engine.Options{Logger: hclog.NewNullLogger(), Version: "0.26.0"})
	t.Cleanup(func() { assert.NilError(t, eng.Close(context.Background())) })
	f := newWorker(t, nil)
	f.w.SetTTL(50 * time.Millisecond)
	assert.NilError(t, f.w.Attach(eng))
	var rec recorder
	defer f.w.Subscribe(func(ev Event) { rec.add(eventLine(ev)) })()
	f.register(t, "tmp", `{"type":"integer"}`, "5")
	f.register(t, "kept", `{"type":"integer"}`, "6")
	f.register(t, "canary", `{"type":"integer"}`, "7")

	bind := func(id, cfgID string) engine.TriggerBinding {
		b := engine.TriggerBinding{ID: id, TriggerType: TriggerType, FunctionID: "x::y", Namespace: engine.DefaultNamespace,
			Config: json.RawMessage(`{"configuration_id":"` + cfgID + `"}`)}
		assert.NilError(t, f.w.trig.RegisterTrigger(b))
		return b
	}
	a, b := bind("a", "tmp"), bind("b", "tmp")
	k := bind("k", "kept")
	f.w.trig.UnregisterTrigger(a) // one left: no countdown
	f.w.trig.UnregisterTrigger(k)
	bind("k2", "kept") // back before the TTL: the countdown stops
	// An entry whose last trigger left after these did expires: by then
	// the TTL has passed for them too.
	f.w.trig.UnregisterTrigger(bind("c", "canary"))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := f.w.Get(context.Background(), "canary", true); err == nil {
			return poll.Continue("canary still there")
		}
		return poll.Success()
	}, poll.WithTimeout(3*time.Second), poll.WithDelay(5*time.Millisecond))
	_, err := f.w.Get(context.Background(), "tmp", true)
	assert.NilError(t, err)
	_, err = f.w.Get(context.Background(), "kept", true)
	assert.NilError(t, err)

	f.w.trig.UnregisterTrigger(b) // the last one: tmp expires
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := f.w.Get(context.Background(), "tmp", true); err == nil {
			return poll.Continue("tmp still there")
		}
		return poll.Success()
	}, poll.WithTimeout(3*time.Second), poll.WithDelay(5*time.Millisecond))
	_, err = os.Stat(filepath.Join(f.dir, "tmp.yaml"))
	assert.Assert(t, errors.Is(err, os.ErrNotExist), "%v", err)
	_, err = f.w.Schema(context.Background(), "tmp")
	assert.ErrorContains(t, err, "not found")
	rec.waitFor(t,
		`configuration:registered tmp old=null new=5`,
		`configuration:registered kept old=null new=6`,
		`configuration:registered canary old=null new=7`,
		`configuration:deleted canary old=7 new=null`,
		`configuration:deleted tmp old=5 new=null`,
	)
	// The watcher does not report the removal as a hand edit: a hand edit
	// made after it is reported, and nothing before it.
	assert.NilError(t, os.WriteFile(filepath.Join(f.dir, "marker.yaml"), []byte("id: marker\nvalue: 1\n"), 0o600))
	rec.waitFor(t,
		`configuration:registered tmp old=null new=5`,
		`configuration:registered kept old=null new=6`,
		`configuration:registered canary old=null new=7`,
		`configuration:deleted canary old=7 new=null`,
		`configuration:deleted tmp old=5 new=null`,
		`configuration:registered marker old=null new=1`,
	)
	_, err = f.w.Get(context.Background(), "kept", true)
	assert.NilError(t, err)
}
