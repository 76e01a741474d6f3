package stream

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/protocol"
)

// TestJoinTriggerRunsAsItsRegistrant: a stream:join trigger that a worker
// without the engine token bound to a function before it existed does not
// run it once it is registered privileged (docs/security.md, "Authority
// when a call runs"); its other join trigger, the control, runs for the
// same join, after it.
func TestJoinTriggerRunsAsItsRegistrant(t *testing.T) {
	f := start(t, Config{})
	c := f.worker(t, "joiner")
	joins := &recorder{reply: map[string]any{"unauthorized": false}}
	_, err := c.RegisterFunction(client.FunctionDef{ID: "t::join"}, joins.handler)
	assert.NilError(t, err)
	// Join triggers run in id order: the privileged one first.
	_, err = c.RegisterTrigger(client.TriggerDef{ID: "a-gate", TriggerType: TriggerJoin, FunctionID: "t::gate"})
	assert.NilError(t, err)
	_, err = c.RegisterTrigger(client.TriggerDef{ID: "z-control", TriggerType: TriggerJoin, FunctionID: "t::join"})
	assert.NilError(t, err)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if len(f.w.trig.matching(TriggerJoin, "x", "y", nil)) < 2 {
			return poll.Continue("join triggers not bound")
		}
		return poll.Success()
	}, poll.WithTimeout(waitFor))

	lw, err := f.eng.AttachLocalWorker(engine.LocalWorkerSpec{Name: "gatekeeper"})
	assert.NilError(t, err)
	var gated atomic.Int32
	assert.NilError(t, lw.RegisterFunction(engine.FunctionDef{ID: "t::gate", Privileged: true},
		func(context.Context, *engine.Call) (json.RawMessage, error) {
			gated.Add(1)
			return json.RawMessage(`{"unauthorized":false}`), nil
		}))

	s, _, err := dialStream(t, f.w.Addr(), nil)
	assert.NilError(t, err)
	s.send(join("s1", "chat", "g", ""))
	assert.Equal(t, s.next()["event"].(map[string]any)["type"], "sync")
	assert.Equal(t, joins.wait(t, 1)[0]["subscription_id"], "s1")
	assert.Equal(t, gated.Load(), int32(0), "the privileged join function ran for a worker without the token")

	// The same function runs for the engine's own call: it is live.
	_, err = f.eng.Invoke(context.Background(), "", "t::gate", json.RawMessage(`{}`))
	assert.NilError(t, err)
	assert.Equal(t, gated.Load(), int32(1))
}

// TestCustomStreamFunctionRunsAsTheCaller: stream::get of a custom stream
// calls its stream::get(<name>) as the caller of stream::get, so a custom
// function registered privileged answers UNAUTHORIZED to a worker without
// the engine token, and runs for the engine's own call.
func TestCustomStreamFunctionRunsAsTheCaller(t *testing.T) {
	f := start(t, Config{})
	lw, err := f.eng.AttachLocalWorker(engine.LocalWorkerSpec{Name: "vault"})
	assert.NilError(t, err)
	var ran atomic.Int32
	assert.NilError(t, lw.RegisterFunction(engine.FunctionDef{ID: "stream::get(vault)", Privileged: true},
		func(context.Context, *engine.Call) (json.RawMessage, error) {
			ran.Add(1)
			return json.RawMessage(`"secret"`), nil
		}))
	c := f.worker(t, "reader")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	get := `{"stream_name":"vault","group_id":"g","item_id":"i"}`
	_, err = c.Call(ctx, "stream::get", json.RawMessage(get))
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb), "%v", err)
	assert.Equal(t, eb.Code, engine.CodeUnauthorized)
	assert.Equal(t, ran.Load(), int32(0))
	// Control: the same path for a caller with the engine's rights.
	assert.Equal(t, f.mustCall(t, "stream::get", get), `"secret"`)
	assert.Equal(t, ran.Load(), int32(1))
}
