package pubsub

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/internal/testkit/redisserver"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func dial(t *testing.T, url, name string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
	defer cancel()
	c, err := client.Dial(ctx, url, client.Options{Name: name, IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}})
	assert.NilError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

// subscriber registers fn on c, subscribed to topic, and returns what it
// receives.
func subscriber(t *testing.T, c *client.Client, fn, topic string) chan string {
	t.Helper()
	got := make(chan string, 16)
	_, err := c.RegisterFunction(client.FunctionDef{ID: fn}, func(_ context.Context, inv *client.Invocation) (any, error) {
		var v any
		_ = json.Unmarshal(inv.Data, &v)
		if m, ok := v.(map[string]any); ok {
			delete(m, "_caller_worker_id")
		}
		b, _ := json.Marshal(v)
		got <- string(b)
		return nil, nil
	})
	assert.NilError(t, err)
	cfg, _ := json.Marshal(map[string]string{"topic": topic})
	_, err = c.RegisterTrigger(client.TriggerDef{TriggerType: TriggerType, FunctionID: fn, Config: cfg})
	assert.NilError(t, err)
	return got
}

func serve(t *testing.T, c *client.Client, broker func(*Hub) Broker) {
	t.Helper()
	hub := NewHub(ClientInvoker{C: c}, nil)
	b := broker(hub)
	t.Cleanup(func() { _ = b.Close() })
	assert.NilError(t, NewService(hub, b, nil).Register(c))
}

// Through a real engine: an app's subscribe triggers receive what a caller
// publishes with the bare `publish`, local adapter.
func TestThroughEngine(t *testing.T) {
	env := enginetest.Start(t, enginetest.Options{ClientName: "caller", Wait: waitfor.Default})
	serve(t, dial(t, env.URL, "pubsub"), func(h *Hub) Broker { return LocalBroker{Hub: h} })
	app := dial(t, env.URL, "app")
	a := subscriber(t, app, "app::on_order_a", "orders")
	b := subscriber(t, app, "app::on_order_b", "orders")
	assert.DeepEqual(t, publishUntil(t, env.Client, "orders", map[string]any{"id": 1}, a, b), []string{`{"id":1}`, `{"id":1}`})
}

// publishUntil publishes data to topic until every subscriber in subs
// received it, and returns what each received: the registrations of
// publish and of the triggers settle asynchronously, and a publish before
// them reaches nobody (fire and forget).
func publishUntil(t *testing.T, c *client.Client, topic string, data any, subs ...chan string) []string {
	t.Helper()
	out := make([]string, len(subs))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
		defer cancel()
		if _, err := c.Call(ctx, FunctionPublish, map[string]any{"topic": topic, "data": data}); err != nil {
			return poll.Continue("publish: %v", err)
		}
		deadline := time.After(100 * time.Millisecond)
		for i, ch := range subs {
			if out[i] != "" {
				continue
			}
			select {
			case out[i] = <-ch:
			case <-deadline:
				return poll.Continue("subscriber %d got nothing yet", i)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(50*time.Millisecond))
	return out
}

// Two pubsub workers on one Redis (two engines): a publish through one
// reaches the subscribers of the other.
func TestRedisAdapterAcrossEngines(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	srv := redisserver.Start(t)
	e1 := enginetest.Start(t, enginetest.Options{ClientName: "caller", Wait: waitfor.Default})
	e2 := enginetest.Start(t, enginetest.Options{ClientName: "caller", Wait: waitfor.Default})
	redisBroker := func(c *client.Client) func(*Hub) Broker {
		return func(h *Hub) Broker {
			b, err := OpenRedisBroker(context.Background(), srv.URL, h, nil)
			assert.NilError(t, err)
			return b
		}
	}
	p1, p2 := dial(t, e1.URL, "pubsub"), dial(t, e2.URL, "pubsub")
	serve(t, p1, redisBroker(p1))
	serve(t, p2, redisBroker(p2))
	got := subscriber(t, dial(t, e2.URL, "app"), "app::on_user", "users")
	assert.DeepEqual(t, publishUntil(t, e1.Client, "users", "ada", got), []string{`"ada"`})
}

func TestRedisUnavailable(t *testing.T) {
	_, err := OpenRedisBroker(context.Background(), "redis://:secret@127.0.0.1:1", NewHub(&recorder{}, nil), nil)
	assert.Assert(t, err != nil)
	assert.Check(t, is.Contains(err.Error(), "redis does not answer"))
	assert.Check(t, !strings.Contains(err.Error(), "secret"), "the password is not in %v", err)
}
