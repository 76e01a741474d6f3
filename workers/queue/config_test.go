package queue

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/protocol"
)

// The Makefile publishes the package under Version with DefaultConfig.
func TestMakefileVersion(t *testing.T) {
	b, err := os.ReadFile("../../Makefile")
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), "QUEUE_VERSION ?= "+Version+"\n"))
	assert.Check(t, is.Contains(string(b), "QUEUE_DEFAULTS := "+DefaultConfig+"\n"))
}

func code(t *testing.T, err error) string {
	t.Helper()
	var eb *protocol.ErrorBody
	assert.Assert(t, err != nil)
	assert.Assert(t, asErrorBody(err, &eb), "%T %v", err, err)
	return eb.Code
}

func asErrorBody(err error, out **protocol.ErrorBody) bool {
	eb, ok := err.(*protocol.ErrorBody)
	if ok {
		*out = eb
	}
	return ok
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig(json.RawMessage(DefaultConfig))
	assert.NilError(t, err)
	spec, err := c.Store("/proj")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(spec.Dir, filepath.Join("/proj", DefaultFilePath)))

	c, err = ParseConfig(json.RawMessage(`{"adapter":{"name":"builtin","config":{"store_method":"in_memory"}},"queue_configs":{"orders":{"type":"fifo","message_group_field":"customer","concurrency":2}}}`))
	assert.NilError(t, err)
	spec, err = c.Store("/proj")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(spec.Dir, ""))
	q := c.QueueConfigs["orders"]
	assert.Check(t, is.Equal(*q.MaxRetries, DefaultMaxRetries))
	assert.Check(t, is.Equal(*q.Concurrency, 2))
	assert.Check(t, is.Equal(*q.BackoffMS, int64(DefaultBackoffMS)))

	for _, tc := range []struct{ name, raw, msg string }{
		{"unknown key", `{"adapterz":{}}`, "unknown field"},
		{"not an object", `[1]`, "queue configuration"},
		{"unknown adapter", `{"adapter":{"name":"kafka"}}`, "unknown adapter"},
		{"rabbitmq not here", `{"adapter":{"name":"rabbitmq"}}`, "not implemented"},
		{"unknown redis key", `{"adapter":{"name":"redis","config":{"url":"x"}}}`, "unknown field"},
		{"store method", `{"adapter":{"name":"builtin","config":{"store_method":"disk"}}}`, "store_method"},
		{"save interval", `{"adapter":{"name":"builtin","config":{"save_interval_ms":0}}}`, "save_interval_ms"},
		{"unknown queue key", `{"queue_configs":{"q":{"retries":3}}}`, "unknown field"},
		{"fifo without group field", `{"queue_configs":{"q":{"type":"fifo"}}}`, "message_group_field"},
		{"zero concurrency", `{"queue_configs":{"q":{"concurrency":0}}}`, "concurrency"},
		{"bad type", `{"queue_configs":{"q":{"type":"lifo"}}}`, "standard or fifo"},
		{"empty queue name", `{"queue_configs":{"":{}}}`, "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig(json.RawMessage(tc.raw))
			assert.Check(t, is.Equal(code(t, err), CodeInvalidConfig))
			assert.Check(t, is.Contains(err.Error(), tc.msg))
			assert.Check(t, strings.HasPrefix(err.Error(), CodeInvalidConfig+": "), err.Error())
		})
	}
}

func TestParseSubscriber(t *testing.T) {
	s, err := ParseSubscriber(json.RawMessage(`{"topic":"orders"}`))
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(s, SubscriberConfig{Queue: "orders", MaxRetries: 3, BackoffMS: 1000, Type: "concurrent", Concurrency: 10}))
	s, err = ParseSubscriber(json.RawMessage(`{"queue":"q","max_retries":1,"backoff_ms":5,"group":"g","condition_function_id":"c","queue_config":{"type":"fifo","maxRetries":4,"backoffDelayMs":7,"concurrency":2,"visibilityTimeout":3}}`))
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(s, SubscriberConfig{Queue: "q", MaxRetries: 4, BackoffMS: 7, Condition: "c", Group: "g", Type: "fifo", Concurrency: 2}))
	for _, tc := range []struct{ name, raw, msg string }{
		{"empty queue", `{"queue":""}`, "non-empty queue"},
		{"no queue", `{}`, "non-empty queue"},
		{"blank queue", `{"queue":"  "}`, "non-empty queue"},
		{"not an object", `"q"`, "object config"},
		{"queue not a string", `{"queue":5}`, "must be a string"},
		{"negative retries", `{"queue":"q","max_retries":-1}`, "max_retries"},
		{"bad type", `{"queue":"q","queue_config":{"type":"lifo"}}`, "concurrent or fifo"},
		{"unknown queue_config key", `{"queue":"q","queue_config":{"speed":1}}`, "unknown keys speed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSubscriber(json.RawMessage(tc.raw))
			assert.Check(t, is.Equal(code(t, err), CodeInvalidConfig))
			assert.Check(t, is.Contains(err.Error(), tc.msg))
		})
	}
}

func TestBackoff(t *testing.T) {
	for _, tc := range []struct {
		base    int64
		attempt int
		wantMS  int64
	}{
		{1000, 1, 1000}, {1000, 2, 2000}, {1000, 3, 4000}, {100, 5, 1600},
		{0, 3, 0}, {1000, 0, 0}, {1000, 200, maxBackoffMS},
	} {
		assert.Check(t, is.Equal(Backoff(tc.base, tc.attempt).Milliseconds(), tc.wantMS), "%d × 2^(%d-1)", tc.base, tc.attempt)
	}
}
