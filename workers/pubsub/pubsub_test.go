package pubsub

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is an Invoker that notes every fire; fail makes fires of that
// function fail.
type recorder struct {
	mu    sync.Mutex
	fires []string
	fail  string
}

func (r *recorder) Fire(_ context.Context, ns, fn string, data, md json.RawMessage) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fn == r.fail {
		return errors.New("boom")
	}
	r.fires = append(r.fires, ns+"/"+fn+" "+string(data)+" "+string(md))
	return nil
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.fires...)
}

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		raw, adapter, url, err string
	}{
		{raw: ``, adapter: "local"},
		{raw: `null`, adapter: "local"},
		{raw: DefaultConfig, adapter: "local"},
		{raw: `{"adapter":{"name":"local","config":{}}}`, adapter: "local"},
		{raw: `{"adapter":{"name":"redis"}}`, adapter: "redis", url: DefaultRedisURL},
		{raw: `{"adapter":{"name":"redis","config":{"redis_url":"redis://h:1/2"}}}`, adapter: "redis", url: "redis://h:1/2"},
		{raw: `{"adapter":{"name":"kafka"}}`, err: `adapter "kafka" is not one of local, redis`},
		{raw: `{"adapter":{"name":"redis","config":{"url":"x"}}}`, err: "keys: redis_url"},
		{raw: `{"adapter":{"name":"local","config":{"x":1}}}`, err: "adapter local takes no config"},
		{raw: `{"topics":[]}`, err: "keys: adapter"},
		{raw: `[1]`, err: "invalid"},
	} {
		_, spec, err := ParseConfig(json.RawMessage(tc.raw))
		if tc.err != "" {
			var eb *protocol.ErrorBody
			assert.Assert(t, errors.As(err, &eb), "%s: %v", tc.raw, err)
			assert.Check(t, is.Equal(eb.Code, CodeInvalidConfig), tc.raw)
			assert.Check(t, is.Contains(eb.Message, tc.err), tc.raw)
			continue
		}
		assert.NilError(t, err, tc.raw)
		assert.Check(t, is.Equal(spec.Adapter, tc.adapter), tc.raw)
		assert.Check(t, is.Equal(spec.RedisURL, tc.url), tc.raw)
	}
}

// Every subscriber of a topic gets each publish once, with the data as
// published and its trigger's metadata, in its namespace; other topics'
// subscribers get nothing; a failing subscriber does not stop the others
// and is not retried; unsubscribed means no more deliveries.
func TestFanOut(t *testing.T) {
	rec := &recorder{fail: "app::broken"}
	hub := NewHub(rec, nil)
	svc := NewService(hub, LocalBroker{Hub: hub}, nil)
	ctx := context.Background()
	reg := func(id, topic, fn, ns string) {
		cfg, _ := json.Marshal(map[string]string{"topic": topic})
		assert.NilError(t, svc.RegisterTrigger(ctx, client.TriggerRegistration{ID: id, TriggerType: TriggerType, FunctionID: fn, Namespace: ns,
			Config: cfg, Metadata: json.RawMessage(`{"t":"` + id + `"}`)}))
	}
	reg("t1", "orders", "app::a", "")
	reg("t2", "orders", "app::b", "shop")
	reg("t3", "orders", "app::broken", "")
	reg("t4", "users", "app::c", "")
	reg("t5", "", "app::d", "") // registers nothing

	out, err := svc.Publish(ctx, json.RawMessage(`{"topic":"orders","data":{"id":7},"_caller_worker_id":"w1"}`))
	assert.NilError(t, err)
	assert.Check(t, out == nil)
	assert.DeepEqual(t, rec.got(), []string{`/app::a {"id":7} {"t":"t1"}`, `shop/app::b {"id":7} {"t":"t2"}`})

	assert.NilError(t, svc.UnregisterTrigger(ctx, client.TriggerRegistration{ID: "t1"}))
	_, err = svc.Publish(ctx, json.RawMessage(`{"topic":"orders","data":"x"}`))
	assert.NilError(t, err)
	assert.Check(t, is.Len(rec.got(), 3))
	assert.Check(t, is.Equal(rec.got()[2], `shop/app::b "x" {"t":"t2"}`))

	// A topic nobody subscribes to: nothing, no error.
	_, err = svc.Publish(ctx, json.RawMessage(`{"topic":"nobody","data":1}`))
	assert.NilError(t, err)
	assert.Check(t, is.Len(rec.got(), 3))

	// Re-registering an id moves it.
	reg("t2", "users", "app::b", "shop")
	assert.Check(t, is.Len(hub.Subscribers("orders"), 1)) // t3 only
	assert.Check(t, is.Len(hub.Subscribers("users"), 2))
}

func TestPublishErrors(t *testing.T) {
	hub := NewHub(&recorder{}, nil)
	svc := NewService(hub, LocalBroker{Hub: hub}, nil)
	for _, tc := range []struct{ raw, code string }{
		{`{}`, CodeTopicNotSet},
		{`{"topic":""}`, CodeTopicNotSet},
		{`null`, CodeTopicNotSet},
		{`"orders"`, CodeInvalidPublish},
		{`{"topic":7}`, CodeInvalidPublish},
		{`[]`, CodeInvalidPublish},
	} {
		_, err := svc.Publish(context.Background(), json.RawMessage(tc.raw))
		var eb *protocol.ErrorBody
		assert.Assert(t, errors.As(err, &eb), tc.raw)
		assert.Check(t, is.Equal(eb.Code, tc.code), tc.raw)
	}
	err := svc.RegisterTrigger(context.Background(), client.TriggerRegistration{ID: "x", Config: json.RawMessage(`"orders"`)})
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb))
	assert.Check(t, is.Equal(eb.Code, CodeInvalidConfig))
}

// The deprecation warning: once per entry point and caller in 10
// minutes, under the iii::deprecation logger, in bounded memory.
func TestDeprecationWarning(t *testing.T) {
	logs := &syncbuf.Buffer{}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := newDeprecation(hclog.New(&hclog.LoggerOptions{Output: logs}), func() time.Time { return now })
	assert.Check(t, d.warn("publish", "w1"))
	assert.Check(t, !d.warn("publish", "w1"))
	assert.Check(t, d.warn("publish", "w2"))
	assert.Check(t, d.warn("subscribe", "w1"))
	now = now.Add(9 * time.Minute)
	assert.Check(t, !d.warn("publish", "w1"))
	now = now.Add(time.Minute)
	assert.Check(t, d.warn("publish", "w1"))
	assert.Check(t, is.Equal(strings.Count(logs.String(), "pubsub is deprecated"), 4))
	assert.Check(t, is.Contains(logs.String(), "iii::deprecation"))
	assert.Check(t, is.Contains(logs.String(), "iii::durable::publish"))

	for i := range 3 * maxDeprecationKeys {
		d.warn("publish", strings.Repeat("c", 10)+string(rune('a'+i%26))+strings.Repeat("x", i%97)+string(rune(i)))
	}
	d.mu.Lock()
	n := len(d.last)
	d.mu.Unlock()
	assert.Check(t, n <= maxDeprecationKeys, "%d keys remembered", n)
}
