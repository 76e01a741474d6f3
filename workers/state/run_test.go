package state

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/workers/workerkit"
)

func specWith(t *testing.T, env map[string]string) workerkit.Spec {
	s := Spec()
	s.Logger = hclog.NewNullLogger()
	s.Getenv = func(k string) string { return env[k] }
	return s
}

// TestRun runs the worker as its binary does (workerkit.MainContext with
// Run) against a real engine: a Go worker's state trigger is called through
// the engine with the event, and cancelling ends the worker cleanly.
func TestRun(t *testing.T) {
	env := enginetest.Start(t, enginetest.Options{ClientName: "admin", CallTimeout: 10 * time.Second, Wait: waitfor.Default})
	cfg := filepath.Join(t.TempDir(), "state.yaml")
	assert.NilError(t, os.WriteFile(cfg, []byte("adapter: {name: kv, config: {store_method: in_memory}}\nmax_value_bytes: 8\n"), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	go func() {
		exit <- workerkit.MainContext(ctx, specWith(t, map[string]string{workerkit.EnvURL: env.URL, workerkit.EnvConfig: cfg}), Run)
	}()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := env.Call(t, FnGet, map[string]string{"scope": "s", "key": "k"}); err != nil {
			return poll.Continue("state::get: %v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(20*time.Millisecond))

	app := env.Anonymous(t, "app")
	events := make(chan json.RawMessage, 8)
	_, err := app.RegisterFunction(client.FunctionDef{ID: "app::seen"}, func(_ context.Context, inv *client.Invocation) (any, error) {
		events <- inv.Data
		return nil, nil
	})
	assert.NilError(t, err)
	_, err = app.RegisterTrigger(client.TriggerDef{TriggerType: TriggerType, FunctionID: "app::seen", Config: json.RawMessage(`{"scope":"s"}`)})
	assert.NilError(t, err)
	// The trigger reaches the provider asynchronously: write until it fires.
	var ev map[string]any
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := env.Call(t, FnSet, map[string]any{"scope": "s", "key": "k", "value": 1}); err != nil {
			return poll.Error(err)
		}
		select {
		case raw := <-events:
			assert.NilError(t, json.Unmarshal(raw, &ev))
			return poll.Success()
		case <-time.After(100 * time.Millisecond):
			return poll.Continue("no state event yet")
		}
	}, poll.WithTimeout(waitfor.Default))
	assert.Check(t, is.Equal(ev["type"], "state"))
	assert.Check(t, is.Equal(ev["scope"], "s"))
	assert.Check(t, is.Equal(ev["new_value"], 1.0))
	// The file's max_value_bytes applies.
	_, err = env.Call(t, FnSet, map[string]any{"scope": "s", "key": "k", "value": "0123456789"})
	assert.Check(t, is.Equal(client.CodeOf(err), CodeValueTooLarge))

	cancel()
	assert.Equal(t, waitfor.Recv(t, exit, waitfor.Default, "the worker to stop"), 0)
}

// TestRunRefusesBadConfig: a configuration the worker cannot run with ends
// it at start with exit code 1, before it connects.
func TestRunRefusesBadConfig(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "state.yaml")
	assert.NilError(t, os.WriteFile(cfg, []byte("adapter: {name: bridge}\n"), 0o600))
	code := workerkit.MainContext(context.Background(), specWith(t, map[string]string{workerkit.EnvURL: "ws://127.0.0.1:1", workerkit.EnvConfig: cfg}), Run)
	assert.Equal(t, code, 1)
}
