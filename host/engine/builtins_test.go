package engine

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/protocol"
)

func invokeJSON(t *testing.T, te *testEngine, fn string, in any) map[string]any {
	t.Helper()
	out, err := te.Invoke(context.Background(), "", fn, mustJSON(t, in))
	assert.NilError(t, err)
	var m map[string]any
	assert.NilError(t, json.Unmarshal(out, &m))
	return m
}

func invokeErr(t *testing.T, te *testEngine, fn string, in string) *protocol.ErrorBody {
	t.Helper()
	_, err := te.Invoke(context.Background(), "", fn, json.RawMessage(in))
	eb, ok := err.(*protocol.ErrorBody)
	assert.Assert(t, ok, "want *protocol.ErrorBody, got %T %v", err, err)
	return eb
}

func ids(list any, key string) []string {
	var out []string
	for _, it := range list.([]any) {
		out = append(out, it.(map[string]any)[key].(string))
	}
	return out
}

func TestBuiltinFunctionsList(t *testing.T) {
	te := startEngine(t, Options{})
	a := te.dialAdmin(t) // engine:: ids are reserved to the token's holder
	a.send(&protocol.RegisterFunction{ID: "math::add", Description: "Adds numbers", Metadata: json.RawMessage(`{"owner":"x"}`)})
	a.send(&protocol.RegisterFunction{ID: "math::mul", Description: "Multiplies"})
	a.send(&protocol.RegisterFunction{ID: "hidden::fn", Metadata: json.RawMessage(`{"internal":true}`)})
	a.send(&protocol.RegisterFunction{ID: "engine::queue::peek"})
	a.registerIn("", "math-worker")
	b := te.dial(t)
	b.registerIn("orders", "orders-worker", "orders::place")

	cases := []struct {
		name string
		in   map[string]any
		want []string
	}{
		{"all visible", map[string]any{}, []string{"engine::queue::peek", "math::add", "math::mul", "orders::place"}},
		{"prefix", map[string]any{"prefix": "math::"}, []string{"math::add", "math::mul"}},
		{"search matches id and description", map[string]any{"search": "MULTI"}, []string{"math::mul"}},
		{"worker", map[string]any{"worker": "orders-worker"}, []string{"orders::place"}},
		{"workers", map[string]any{"workers": []string{"orders-worker", "math-worker"}}, []string{"engine::queue::peek", "math::add", "math::mul", "orders::place"}},
		{"unknown worker", map[string]any{"worker": "nobody"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := invokeJSON(t, te, FnFunctionsList, tc.in)
			got := ids(out["functions"], "function_id")
			assert.DeepEqual(t, got, tc.want)
		})
	}

	t.Run("include_internal shows engine functions", func(t *testing.T) {
		out := invokeJSON(t, te, FnFunctionsList, map[string]any{"include_internal": true})
		got := ids(out["functions"], "function_id")
		for _, fn := range []string{FnFunctionsList, FnFunctionsInfo, FnWorkersList, FnWorkersInfo, FnWorkersRegister, FnChannelsCreate, "hidden::fn", "engine::queue::peek"} {
			assert.Check(t, slices.Contains(got, fn), "%s missing from %v", fn, got)
		}
	})

	t.Run("summary shape", func(t *testing.T) {
		out := invokeJSON(t, te, FnFunctionsList, map[string]any{"prefix": "math::add"})
		assert.DeepEqual(t, out["functions"], []any{map[string]any{
			"function_id": "math::add", "namespace": "default", "worker_name": "math-worker",
			"description": "Adds numbers", "metadata": map[string]any{"owner": "x"},
		}})
	})

	t.Run("engine::queue is not hidden", func(t *testing.T) {
		out := invokeJSON(t, te, FnFunctionsList, map[string]any{"prefix": "engine::"})
		assert.DeepEqual(t, ids(out["functions"], "function_id"), []string{"engine::queue::peek"})
	})
}

func TestBuiltinFunctionsInfo(t *testing.T) {
	te := startEngine(t, Options{})
	a := te.dial(t)
	a.send(&protocol.RegisterFunction{ID: "svc::get", Description: "Get", RequestFormat: json.RawMessage(`{"type":"object"}`)})
	a.registerIn("", "svc-default")
	b := te.dial(t)
	b.registerIn("orders", "svc-orders", "svc::get", "only::orders", "dup::x")
	c := te.dial(t)
	c.registerIn("billing", "svc-billing", "dup::x")

	t.Run("single, default wins", func(t *testing.T) {
		out := invokeJSON(t, te, FnFunctionsInfo, map[string]any{"function_id": "svc::get"})
		assert.DeepEqual(t, out, map[string]any{
			"function_id": "svc::get", "namespace": "default", "worker_name": "svc-default", "description": "Get",
			"request_schema": map[string]any{"type": "object"}, "registered_triggers": []any{},
		})
	})
	t.Run("single, unique non-default resolves", func(t *testing.T) {
		out := invokeJSON(t, te, FnFunctionsInfo, map[string]any{"function_id": "only::orders"})
		assert.Equal(t, out["namespace"], "orders")
	})
	t.Run("single, strict namespace", func(t *testing.T) {
		out := invokeJSON(t, te, FnFunctionsInfo, map[string]any{"function_id": "svc::get", "namespace": "orders"})
		assert.Equal(t, out["worker_name"], "svc-orders")
		eb := invokeErr(t, te, FnFunctionsInfo, `{"function_id":"only::orders","namespace":"billing"}`)
		assert.Equal(t, eb.Code, CodeNotFound)
		assert.Check(t, is.Contains(eb.Message, "It is registered in namespace(s): orders."))
	})
	t.Run("single, ambiguous", func(t *testing.T) {
		eb := invokeErr(t, te, FnFunctionsInfo, `{"function_id":"dup::x"}`)
		assert.Equal(t, eb.Code, CodeNotFound)
		assert.Check(t, is.Contains(eb.Message, "ambiguous"))
		assert.Check(t, is.Contains(eb.Message, "billing, orders"))
	})
	t.Run("batch", func(t *testing.T) {
		out := invokeJSON(t, te, FnFunctionsInfo, map[string]any{"function_ids": []string{"svc::get", "nope", "svc::get", "dup::x"}})
		fns := out["functions"].([]any)
		assert.Equal(t, len(fns), 3, "deduplicated in request order")
		assert.Equal(t, fns[0].(map[string]any)["namespace"], "default")
		assert.DeepEqual(t, fns[1], map[string]any{"function_id": "nope", "error": "not_found"})
		assert.DeepEqual(t, fns[2], map[string]any{"function_id": "dup::x", "error": "not_found"})
	})
	t.Run("builtins carry schemas", func(t *testing.T) {
		for _, fn := range []string{FnFunctionsList, FnFunctionsInfo, FnWorkersList, FnWorkersInfo, FnWorkersRegister, FnChannelsCreate} {
			out := invokeJSON(t, te, FnFunctionsInfo, map[string]any{"function_id": fn})
			assert.Equal(t, out["worker_name"], builtinWorkerName)
			req, _ := out["request_schema"].(map[string]any)
			resp, _ := out["response_schema"].(map[string]any)
			assert.Check(t, req != nil && resp != nil, "%s has schemas: %v", fn, out)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		for _, in := range []string{`{}`, `{"function_id":"a","function_ids":["b"]}`, `"x"`, `{"function_id":5}`} {
			eb := invokeErr(t, te, FnFunctionsInfo, in)
			assert.Equal(t, eb.Code, CodeInvalidArgument, "input %s", in)
		}
		many := make([]string, 33)
		for i := range many {
			many[i] = "f" + itoa(i)
		}
		eb := invokeErr(t, te, FnFunctionsInfo, string(mustJSON(t, map[string]any{"function_ids": many})))
		assert.Equal(t, eb.Code, CodeInvalidArgument)
		eb = invokeErr(t, te, FnFunctionsInfo, `{"function_id":"a","namespace":"Bad"}`)
		assert.Equal(t, eb.Code, protocol.CodeInvalidNamespace)
	})
}

func TestBuiltinWorkers(t *testing.T) {
	te := startEngine(t, Options{Version: "9.9.9"})
	w := te.dial(t)
	w.call("r", FnWorkersRegister, nil, `{"name":"node-w","runtime":"node","version":"0.22.1","os":"linux","pid":77,"namespace":"orders","description":"d"}`)
	w.send(&protocol.RegisterFunction{ID: "w::f"})
	w.send(&protocol.RegisterTriggerType{ID: "tt", Description: "a type"})
	w.send(&protocol.RegisterTrigger{ID: "trg", TriggerType: "nobody", FunctionID: "w::f", Config: json.RawMessage(`{"c":1}`)})
	w.sync()
	lw, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "local-w", Runtime: "go-plugin", Version: "1.0", PID: 1234, Description: "local"})
	assert.NilError(t, err)
	defer lw.Detach()

	t.Run("list", func(t *testing.T) {
		out := invokeJSON(t, te, FnWorkersList, map[string]any{})
		names := []string{}
		for _, it := range out["workers"].([]any) {
			if n, ok := it.(map[string]any)["name"].(string); ok {
				names = append(names, n)
			}
		}
		assert.DeepEqual(t, names, []string{"local-w", "node-w"})
		out = invokeJSON(t, te, FnWorkersList, map[string]any{"include_internal": true})
		assert.Check(t, slices.Contains(ids(out["workers"], "id"), te.builtins.ID()))
	})
	t.Run("filters", func(t *testing.T) {
		out := invokeJSON(t, te, FnWorkersList, map[string]any{"runtime": "go-plugin"})
		assert.DeepEqual(t, ids(out["workers"], "name"), []string{"local-w"})
		out = invokeJSON(t, te, FnWorkersList, map[string]any{"search": "NODE"})
		assert.DeepEqual(t, ids(out["workers"], "name"), []string{"node-w"})
		out = invokeJSON(t, te, FnWorkersList, map[string]any{"status": "available"})
		assert.DeepEqual(t, ids(out["workers"], "name"), []string{"local-w"})
	})
	t.Run("summary shape", func(t *testing.T) {
		out := invokeJSON(t, te, FnWorkersList, map[string]any{"search": "node-w"})
		s := out["workers"].([]any)[0].(map[string]any)
		assert.Equal(t, s["id"], w.workerID)
		assert.Equal(t, s["namespace"], "orders")
		assert.Equal(t, s["runtime"], "node")
		assert.Equal(t, s["version"], "0.22.1")
		assert.Equal(t, s["os"], "linux")
		assert.Equal(t, s["status"], "connected")
		assert.Equal(t, s["function_count"], 1.0)
		assert.Equal(t, s["active_invocations"], 0.0)
		assert.Equal(t, s["ip_address"], "127.0.0.1")
		assert.Equal(t, s["isolation"], nil)
		assert.Assert(t, s["connected_at_ms"].(float64) > 0)

		out = invokeJSON(t, te, FnWorkersList, map[string]any{"search": "local-w"})
		l := out["workers"].([]any)[0].(map[string]any)
		assert.Equal(t, l["runtime"], "go-plugin")
		assert.Equal(t, l["version"], "1.0")
		assert.Equal(t, l["status"], "available")
		assert.Equal(t, l["namespace"], "default")
	})
	t.Run("info", func(t *testing.T) {
		out := invokeJSON(t, te, FnWorkersInfo, map[string]any{"name": "node-w"})
		wk := out["worker"].(map[string]any)
		assert.Equal(t, wk["pid"], 77.0)
		assert.Equal(t, wk["internal"], false)
		assert.DeepEqual(t, ids(out["functions"], "function_id"), []string{"w::f"})
		assert.DeepEqual(t, out["trigger_types"], []any{map[string]any{"id": "tt", "namespace": "orders", "worker_name": "node-w", "description": "a type"}})
		assert.DeepEqual(t, out["registered_triggers"], []any{map[string]any{"id": "trg", "trigger_type": "nobody", "function_id": "w::f",
			"worker_name": "node-w", "status": "pending", "config": map[string]any{"c": 1.0}}})

		out = invokeJSON(t, te, FnWorkersInfo, map[string]any{"name": builtinWorkerName})
		wk = out["worker"].(map[string]any)
		assert.Equal(t, wk["internal"], true)
		assert.Equal(t, wk["version"], "9.9.9")
		assert.Equal(t, wk["pid"], float64(os.Getpid()))
		assert.Equal(t, len(out["functions"].([]any)), len(builtinTable()))
	})
	t.Run("info resolution", func(t *testing.T) {
		other := te.dial(t)
		other.registerIn("billing", "node-w")
		eb := invokeErr(t, te, FnWorkersInfo, `{"name":"node-w"}`)
		assert.Equal(t, eb.Code, CodeNotFound)
		assert.Check(t, is.Contains(eb.Message, "billing, orders"))
		out := invokeJSON(t, te, FnWorkersInfo, map[string]any{"name": "node-w", "namespace": "billing"})
		assert.Equal(t, out["worker"].(map[string]any)["id"], other.workerID)
		eb = invokeErr(t, te, FnWorkersInfo, `{"name":"node-w","namespace":"nowhere"}`)
		assert.Equal(t, eb.Code, CodeNotFound)
		eb = invokeErr(t, te, FnWorkersInfo, `{"name":"ghost"}`)
		assert.Equal(t, eb.Code, CodeNotFound)
		eb = invokeErr(t, te, FnWorkersInfo, `{}`)
		assert.Equal(t, eb.Code, CodeInvalidArgument)
	})
	t.Run("register from in-process needs a connected worker", func(t *testing.T) {
		eb := invokeErr(t, te, FnWorkersRegister, `{"name":"x"}`)
		assert.Equal(t, eb.Code, CodeNotFound)
		eb = invokeErr(t, te, FnWorkersRegister, string(mustJSON(t, map[string]any{"_caller_worker_id": lw.ID()})))
		assert.Equal(t, eb.Code, CodeInvalidArgument)
	})
}

func TestActiveInvocationsCounted(t *testing.T) {
	te := startEngine(t, Options{})
	owner := te.dial(t)
	owner.registerIn("", "busy", "busy::f")
	caller := te.dial(t)
	caller.send(&protocol.InvokeFunction{InvocationID: "a1", FunctionID: "busy::f"})
	owner.expect("invokefunction")
	out := invokeJSON(t, te, FnWorkersInfo, map[string]any{"name": "busy"})
	assert.Equal(t, out["worker"].(map[string]any)["active_invocations"], 1.0)
	owner.send(&protocol.InvocationResult{InvocationID: "a1", FunctionID: "busy::f", Result: json.RawMessage(`1`)})
	caller.expect("invocationresult")
	out = invokeJSON(t, te, FnWorkersInfo, map[string]any{"name": "busy"})
	assert.Equal(t, out["worker"].(map[string]any)["active_invocations"], 0.0)
}
