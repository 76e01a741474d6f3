package engine

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// A queue provider credential registers engine::queue::enqueue and the
// engine::queue::* views in default and nothing else (no other engine::
// id, no plain id, no trigger type); it calls nothing privileged; and its
// deliveries of enqueued calls are checked as their enqueuers, as an
// admin provider's are.
func TestQueueProviderCredential(t *testing.T) {
	te, logs := authorityEngine(t)
	admin := te.dialAdmin(t)
	admin.registerIn("", "admin")

	for i, tc := range []struct{ payload, msg string }{
		{`{"namespace":"proj","queue_provider":true}`, "namespace is default"},
		{`{"namespace":"default","queue_provider":true,"sandbox_host":{"adapter":"remote","host_name":"h1"}}`, "no registration guard"},
	} {
		code, msg := errBody(t, admin.call("bad"+string(rune('0'+i)), FnCredentialsIssue, nil, tc.payload))
		assert.Equal(t, code, CodeInvalidArgument)
		assert.Check(t, is.Contains(msg, tc.msg))
	}
	tok := issue(t, admin, "q", `{"label":"compose/proj/queue","namespace":"default","allow":{"proj":["*"]},"queue_provider":true}`)

	q := te.dialWith(t, http.Header{"Authorization": {"Bearer " + tok}})
	ids := append([]string(nil), QueueProviderFunctions...)
	ids = append(ids, "engine::queue::purge", "engine::credentials::issue", "compose::up", "app::x", "stream::set")
	for _, id := range ids {
		q.send(&protocol.RegisterFunction{ID: id})
	}
	q.send(&protocol.RegisterTriggerType{ID: "durable:subscriber", Description: "x"})
	q.register(map[string]any{"name": "queue-engine", "namespace": "default"})
	var rejected []string
	for range 5 {
		rej := q.expect("registrationrejected")
		assert.Equal(t, rej.str("code"), CodeForbidden, "%v", rej)
		rejected = append(rejected, rej.str("function_id"))
	}
	q.sync()
	assert.Check(t, is.DeepEqual(rejected, []string{"engine::queue::purge", "engine::credentials::issue", "compose::up", "app::x", "stream::set"}))
	assert.Check(t, is.Contains(logs.String(), "registertriggertype refused: this session may not register trigger types"))
	for _, id := range QueueProviderFunctions {
		assert.Check(t, hasFn(te, DefaultNamespace, id), id)
	}
	assert.Check(t, !hasFn(te, DefaultNamespace, "app::x"))

	// Privileged functions stay out of reach.
	for i, fn := range []string{FnCredentialsIssue, FnCredentialsRevoke} {
		f := q.call("p"+string(rune('0'+i)), fn, nil, `{"namespace":"default"}`)
		assert.Assert(t, f.obj("error") != nil, "%s: %v", fn, f)
	}

	// A second holder of the credential cannot take the provider over.
	other := te.dialWith(t, http.Header{"Authorization": {"Bearer " + tok}})
	other.send(&protocol.RegisterFunction{ID: EnqueueProviderFunctionID})
	other.register(map[string]any{"name": "queue-engine-2", "namespace": "default"})
	rej := other.expect("registrationrejected")
	assert.Check(t, is.Equal(rej.str("code"), protocol.CodeFuncNamespaceConflict), "%v", rej)

	// The enqueue reaches the credential's provider, and its delivery is
	// checked as the enqueuer: a revoked enqueuer's is refused.
	handed := make(chan frame, 8)
	go func() {
		for {
			var m inbound
			select {
			case m = <-q.in:
			case <-q.closed:
				return
			}
			if m.f.typ() == "invokefunction" {
				handed <- m.f.obj("data")
				b := appendResultFrame(nil, m.f.str("invocation_id"), m.f.str("function_id"), json.RawMessage(`{}`), nil, "", "")
				_ = q.c.Write(context.Background(), websocket.MessageText, b)
				continue
			}
			handed <- m.f
		}
	}()
	vmTok := issue(t, admin, "v", `{"label":"vm","namespace":"default"}`)
	vm := te.dialWith(t, http.Header{"Authorization": {"Bearer " + vmTok}})
	vm.send(&protocol.InvokeFunction{InvocationID: "e1", FunctionID: "ops::log", Data: json.RawMessage(`{}`),
		Action: &protocol.TriggerAction{Type: protocol.ActionEnqueue, Queue: "jobs"}})
	res := vm.expect("invocationresult")
	assert.Assert(t, res.obj("error") == nil, "%v", res)
	assert.Equal(t, waitfor.Recv(t, handed, waitFor, "the provider to be handed ops::log").str("function_id"), "ops::log")
	ops := te.dialAdmin(t)
	ops.registerIn("", "ops", "ops::log")
	f := admin.call("r", FnCredentialsRevoke, nil, `{"token":"`+vmTok+`"}`)
	assert.Assert(t, f.obj("error") == nil, "%v", f)
	q.send(&protocol.InvokeFunction{InvocationID: "d1", FunctionID: "ops::log", Data: json.RawMessage(`{}`)})
	code, msg := errBody(t, waitfor.Recv(t, handed, waitFor, "the answer to the delivery"))
	assert.Equal(t, code, CodeForbidden)
	assert.Check(t, strings.Contains(msg, "revoked"), msg)
	assert.Check(t, is.Contains(logs.String(), "label=vm"))
}
