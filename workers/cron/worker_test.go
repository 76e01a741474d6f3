package cron

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func dial(t *testing.T, env *enginetest.Env, name string, onRegErr func(error)) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
	defer cancel()
	c, err := client.Dial(ctx, env.URL, client.Options{Name: name, IgnoreEnv: true,
		Reconnect: client.ReconnectPolicy{Disable: true}, OnRegistrationError: onRegErr})
	assert.NilError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

type fired struct {
	data     Payload
	metadata string
	ns       string
}

// TestThroughEngine: the trigger type served on a real engine (the
// scheduler on a fake clock): an app's cron trigger fires its function
// with upstream's payload and the registration's metadata, stops when the
// trigger is unregistered, and an invalid expression reaches the
// registrant as INVALID_CRON_EXPRESSION.
func TestThroughEngine(t *testing.T) {
	env := enginetest.Start(t, enginetest.Options{ClientName: "test", Wait: waitfor.Default})
	clk := newFakeClock("2026-01-01T00:00:00.25Z")
	provider := dial(t, env, "cron", nil)
	s := NewScheduler(SchedulerOptions{Clock: clk, Invoker: ClientInvoker{C: provider}})
	t.Cleanup(s.Close)
	assert.NilError(t, Triggers{S: s}.Register(provider))

	regErrs := make(chan error, 4)
	app := dial(t, env, "app", func(err error) { regErrs <- err })
	calls := make(chan fired, 16)
	_, err := app.RegisterFunction(client.FunctionDef{ID: "app::tick"}, func(_ context.Context, inv *client.Invocation) (any, error) {
		var p Payload
		if err := json.Unmarshal(inv.Data, &p); err != nil {
			return nil, err
		}
		calls <- fired{data: p, metadata: string(inv.Metadata), ns: inv.Namespace}
		return nil, nil
	})
	assert.NilError(t, err)
	unregister, err := app.RegisterTrigger(client.TriggerDef{ID: "job-1", TriggerType: TriggerType, FunctionID: "app::tick",
		Config: json.RawMessage(`{"expression":"*/2 * * * * *"}`), Metadata: json.RawMessage(`{"team":"ops"}`)})
	assert.NilError(t, err)

	for _, want := range []string{"2026-01-01T00:00:02Z", "2026-01-01T00:00:04Z"} {
		at := clk.armedAt(t)
		assert.Check(t, is.Equal(at.Format(time.RFC3339), want))
		clk.set(at.Add(3 * time.Millisecond))
		f := waitfor.Recv(t, calls, waitfor.Default, "the cron function")
		assert.Check(t, is.Equal(f.data, Payload{Trigger: "cron", JobID: "job-1", ScheduledTime: want,
			ActualTime: at.Add(3 * time.Millisecond).UTC().Format("2006-01-02T15:04:05.000Z")}))
		assert.Check(t, is.Equal(f.metadata, `{"team":"ops"}`))
	}
	clk.armedAt(t)
	unregister()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if n := s.Len(); n != 0 {
			return poll.Continue("%d jobs scheduled", n)
		}
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(5*time.Millisecond))
	clk.set(clk.Now().Add(time.Minute))
	select {
	case f := <-calls:
		t.Fatalf("fired after the trigger was unregistered: %+v", f)
	default:
	}

	_, err = app.RegisterTrigger(client.TriggerDef{ID: "job-bad", TriggerType: TriggerType, FunctionID: "app::tick",
		Config: json.RawMessage(`{"expression":"*/5 * * * *"}`)})
	assert.NilError(t, err)
	rerr := waitfor.Recv(t, regErrs, waitfor.Default, "the registration error")
	assert.Check(t, is.ErrorContains(rerr, "INVALID_CRON_EXPRESSION: invalid cron expression '*/5 * * * *': 5 fields"))
	assert.Check(t, is.Equal(s.Len(), 0))
}
