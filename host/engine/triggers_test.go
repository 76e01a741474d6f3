package engine

import (
	"encoding/json"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/protocol"
)

func TestTriggers(t *testing.T) {
	te := startEngine(t, Options{})

	t.Run("forwarded to the provider, error back to the originator", func(t *testing.T) {
		provider := te.dial(t)
		provider.send(&protocol.RegisterTriggerType{ID: "cron", Description: "every so often"})
		provider.registerIn("", "cron-provider")
		origin := te.dial(t)
		origin.registerIn("", "origin", "job::run")

		origin.send(&protocol.RegisterTrigger{ID: "t1", TriggerType: "cron", FunctionID: "job::run", Config: json.RawMessage(`{"expr":"* * * * *"}`)})
		rt := provider.expect("registertrigger")
		assert.Equal(t, rt.str("id"), "t1")
		assert.Equal(t, rt.str("function_id"), "job::run")
		assert.DeepEqual(t, rt.obj("config"), frame{"expr": "* * * * *"})
		_, hasNS := rt["namespace"]
		assert.Assert(t, !hasNS, "default namespaces are not spelled out: %v", rt)

		// A success ack is not forwarded.
		provider.send(&protocol.TriggerRegistrationResult{ID: "t1", TriggerType: "cron", FunctionID: "job::run"})
		provider.sync()
		origin.sync()

		// Only the provider may ack.
		origin.send(&protocol.TriggerRegistrationResult{ID: "t1", TriggerType: "cron", FunctionID: "job::run",
			Error: &protocol.ErrorBody{Code: "x", Message: "forged"}})
		origin.sync()

		provider.send(&protocol.TriggerRegistrationResult{ID: "t1", TriggerType: "cron", FunctionID: "job::run",
			Error: &protocol.ErrorBody{Code: "trigger_registration_failed", Message: "bad expr"}})
		res := origin.expect("triggerregistrationresult")
		assert.Equal(t, res.str("id"), "t1")
		code, msg := errBody(t, res)
		assert.Equal(t, code, "trigger_registration_failed")
		assert.Equal(t, msg, "bad expr")

		// Registered again, then withdrawn: the provider hears both.
		origin.send(&protocol.RegisterTrigger{ID: "t2", TriggerType: "cron", FunctionID: "job::run"})
		provider.expect("registertrigger")
		origin.send(&protocol.UnregisterTrigger{ID: "t2", TriggerType: "cron"})
		un := provider.expect("unregistertrigger")
		assert.Equal(t, un.str("id"), "t2")
		assert.Equal(t, un.str("trigger_type"), "cron")
	})

	t.Run("parked until a provider registers, replayed when one does", func(t *testing.T) {
		origin := te.dial(t)
		origin.registerIn("", "origin2", "job::two")
		origin.send(&protocol.RegisterTrigger{ID: "p1", TriggerType: "queue-x", FunctionID: "job::two", Namespace: ptr("orders"),
			Metadata: json.RawMessage(`{"m":1}`)})
		origin.sync()

		provider := te.dial(t)
		provider.send(&protocol.RegisterTriggerType{ID: "queue-x"})
		provider.register(map[string]any{"name": "qx"})
		rt := provider.expect("registertrigger")
		assert.Equal(t, rt.str("id"), "p1")
		assert.Equal(t, rt.str("namespace"), "orders", "a non-default target namespace is forwarded")
		assert.DeepEqual(t, rt.obj("metadata"), frame{"m": 1.0})

		// The provider goes away: the binding is parked again and replayed
		// to the next provider.
		assert.NilError(t, provider.c.CloseNow())
		next := te.dial(t)
		next.send(&protocol.RegisterTriggerType{ID: "queue-x"})
		next.register(map[string]any{"name": "qx2"})
		rt = next.expect("registertrigger")
		assert.Equal(t, rt.str("id"), "p1")

		// The provider withdraws the type: parked again.
		next.send(&protocol.UnregisterTriggerType{ID: "queue-x"})
		next.sync()
		te.triggers.mu.Lock()
		parked := te.triggers.bindings["p1"].bound == nil
		te.triggers.mu.Unlock()
		assert.Assert(t, parked)

		// The originator goes away: its bindings go with it.
		next.send(&protocol.RegisterTriggerType{ID: "queue-x"})
		next.expect("registertrigger")
		assert.NilError(t, origin.c.CloseNow())
		un := next.expect("unregistertrigger")
		assert.Equal(t, un.str("id"), "p1")
	})

	t.Run("provider namespace resolution", func(t *testing.T) {
		defProvider := te.dial(t)
		defProvider.send(&protocol.RegisterTriggerType{ID: "evt"})
		defProvider.registerIn("", "evt-default")

		origin := te.dial(t)
		origin.registerIn("tenant", "origin3", "h")
		// No trigger_namespace: the originator's namespace first, then
		// default, so it lands on the default provider for now.
		origin.send(&protocol.RegisterTrigger{ID: "n1", TriggerType: "evt", FunctionID: "h"})
		rt := defProvider.expect("registertrigger")
		assert.Equal(t, rt.str("id"), "n1")

		// Strict trigger_namespace with no provider there: parked.
		origin.send(&protocol.RegisterTrigger{ID: "n2", TriggerType: "evt", FunctionID: "h", TriggerNamespace: ptr("tenant")})
		origin.sync()
		defProvider.sync()

		// A provider in the originator's namespace takes both over.
		tenantProvider := te.dial(t)
		tenantProvider.send(&protocol.RegisterTriggerType{ID: "evt"})
		tenantProvider.register(map[string]any{"name": "evt-tenant", "namespace": "tenant"})
		got := map[string]string{}
		for range 2 {
			rt := tenantProvider.expect("registertrigger")
			got[rt.str("id")] = rt.str("trigger_namespace")
		}
		assert.DeepEqual(t, got, map[string]string{"n1": "tenant", "n2": "tenant"})
		un := defProvider.expect("unregistertrigger")
		assert.Equal(t, un.str("id"), "n1")
	})

	t.Run("invalid namespace and id conflicts are answered", func(t *testing.T) {
		origin := te.dial(t)
		origin.registerIn("", "origin4")
		origin.send(&protocol.RegisterTrigger{ID: "bad", TriggerType: "evt", FunctionID: "h", Namespace: ptr(" ")})
		res := origin.expect("triggerregistrationresult")
		code, _ := errBody(t, res)
		assert.Equal(t, code, protocol.CodeInvalidNamespace)

		origin.send(&protocol.RegisterTrigger{ID: "mine", TriggerType: "nobody", FunctionID: "h"})
		origin.sync()
		other := te.dial(t)
		other.registerIn("", "origin5")
		other.send(&protocol.RegisterTrigger{ID: "mine", TriggerType: "nobody", FunctionID: "h"})
		res = other.expect("triggerregistrationresult")
		code, _ = errBody(t, res)
		assert.Equal(t, code, codeTriggerIDConflict)
		// And only the originator may withdraw it.
		other.send(&protocol.UnregisterTrigger{ID: "mine"})
		other.sync()
		te.triggers.mu.Lock()
		_, still := te.triggers.bindings["mine"]
		te.triggers.mu.Unlock()
		assert.Assert(t, still)
	})
}

func TestFunctionInfoListsRegisteredTriggers(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	w.registerIn("", "tw", "target::fn")
	w.send(&protocol.RegisterTrigger{ID: "rt1", TriggerType: "cron", FunctionID: "target::fn", Config: json.RawMessage(`{"e":1}`)})
	w.sync()
	res := w.call("i1", FnFunctionsInfo, nil, `{"function_id":"target::fn"}`)
	assert.DeepEqual(t, res.obj("result")["registered_triggers"], []any{map[string]any{"id": "rt1", "trigger_type": "cron", "config": map[string]any{"e": 1.0}}})
}
