package httpworker

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// TestThroughEngine: the worker on a real engine, its trigger type bound by
// another worker's RegisterTrigger, the function called through the
// engine with ClientInvoker.
func TestThroughEngine(t *testing.T) {
	env := enginetest.Start(t, enginetest.Options{ClientName: "test", Wait: waitfor.Default, CallTimeout: waitfor.Default})
	hc := env.Anonymous(t, "http")
	cfg, err := ParseConfig(json.RawMessage(`{"port":0,"default_timeout":5000}`))
	assert.NilError(t, err)
	w := New(cfg, Options{Invoker: ClientInvoker{C: hc}})
	assert.NilError(t, w.Listen())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
		defer cancel()
		assert.Check(t, w.Close(ctx))
	})
	assert.NilError(t, w.Register(hc, "http"))

	app := env.Anonymous(t, "app")
	_, err = app.RegisterFunction(client.FunctionDef{ID: "app::hi"}, func(_ context.Context, inv *client.Invocation) (any, error) {
		var r Request
		if err := json.Unmarshal(inv.Data, &r); err != nil {
			return nil, err
		}
		return map[string]any{"status_code": 202, "headers": map[string]string{"x-md": string(inv.Metadata)},
			"body": map[string]any{"hi": r.PathParams["name"], "n": r.Body}}, nil
	})
	assert.NilError(t, err)
	_, err = app.RegisterTrigger(client.TriggerDef{TriggerType: TriggerType, FunctionID: "app::hi",
		Config: json.RawMessage(`{"api_path":"/hi/:name","http_method":"PUT"}`), Metadata: json.RawMessage(`{"m":1}`)})
	assert.NilError(t, err)

	url := "http://" + w.Addr().String() + "/hi/ada"
	c := &http.Client{Timeout: waitfor.Default}
	var status int
	var body string
	var hdr http.Header
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		req, _ := http.NewRequest("PUT", url, jsonBody(`7`))
		resp, err := c.Do(req)
		if err != nil {
			return poll.Error(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 404 {
			return poll.Continue("the route is not there yet")
		}
		status, body, hdr = resp.StatusCode, string(b), resp.Header
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(20*time.Millisecond))
	assert.Check(t, is.Equal(status, 202), body)
	assert.Check(t, is.Equal(body, `{"hi":"ada","n":7}`))
	assert.Check(t, is.Equal(hdr.Get("X-Md"), `{"m":1}`), "the trigger's metadata reaches the function")
	assert.Check(t, is.Equal(w.Router().Len(), 1))

	// The registrant goes away: its trigger goes with it, and so does the route.
	ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
	defer cancel()
	assert.NilError(t, app.Close(ctx))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if n := w.Router().Len(); n != 0 {
			return poll.Continue("%d routes left", n)
		}
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(20*time.Millisecond))
}
