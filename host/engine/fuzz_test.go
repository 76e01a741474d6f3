package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/iii-sandbox/iii/protocol"
)

var fastSeeds = []string{
	`{"type":"invokefunction","invocation_id":"a","function_id":"f","data":{"x":[1,2,{"y":"z"}]},"namespace":"orders"}`,
	`{"type":"invokefunction","function_id":"f","action":{"type":"void"},"data":null,"metadata":{"m":true}}`,
	`{"type":"invocationresult","invocation_id":"a","function_id":"f","result":"s\u00e9\n","traceparent":"tp"}`,
	`{"type":"invocationresult","invocation_id":"a","error":{"code":"c","message":"m"}}`,
	`{"type":"invokefunction","invocation_id":"a\u0041","function_id":"f"}`,
	`{"Type":"invokefunction","function_id":"f"}`,
	`{"type":"invokefunction","function_id":"f","data":-0.5e+10}`,
	`{"type":"invokefunction","function_id":"f","data":01}`,
	`{"type":"invokefunction","function_id":"f"} x`,
	`{"type":"invokefunction","function_id":"f","namespace":5}`,
	`{"type":"invokefunction","type":"invocationresult","invocation_id":"d"}`,
	"{\"type\":\"invokefunction\",\"function_id\":\"\xff\"}",
	`{"type":"ping"}`,
	` { "type" : "invokefunction" , "function_id" : "f" , "data" : [ ] } `,
}

// FuzzScanHotFrame checks the fast path against the reference decoder: it
// may only accept valid JSON, only frames protocol.Decode accepts, and must
// read the same fields.
func FuzzScanHotFrame(f *testing.F) {
	for _, s := range fastSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var h hotFrame
		if !scanHotFrame(data, &h) {
			return
		}
		if !json.Valid(data) {
			t.Fatalf("fast path accepted invalid JSON: %q", data)
		}
		m, err := protocol.Decode(data)
		if err != nil {
			// The fast path defers action and error shapes to
			// encoding/json; anything else Decode refuses must have been
			// refused by the scanner.
			var act protocol.TriggerAction
			var eb protocol.ErrorBody
			if (nonNullRaw(h.action) != nil && json.Unmarshal(h.action, &act) != nil) ||
				(nonNullRaw(h.errorRaw) != nil && json.Unmarshal(h.errorRaw, &eb) != nil) {
				return
			}
			t.Fatalf("fast path accepted a frame Decode refuses (%v): %q", err, data)
		}
		same := func(name string, a, b []byte) {
			if !bytes.Equal(a, b) {
				t.Fatalf("%s differs: fast %q, decode %q (frame %q)", name, a, b, data)
			}
		}
		switch m := m.(type) {
		case *protocol.InvokeFunction:
			if h.typ != string(protocol.TypeInvokeFunction) || h.invocationID != m.InvocationID || h.functionID != m.FunctionID ||
				h.traceparent != m.Traceparent || h.baggage != m.Baggage {
				t.Fatalf("fields differ: %+v vs %+v", h, m)
			}
			if (h.namespace == nil) != (m.Namespace == nil) || (h.namespace != nil && *h.namespace != *m.Namespace) {
				t.Fatalf("namespace differs: %v vs %v", h.namespace, m.Namespace)
			}
			same("data", nonNullRaw(h.data), m.Data)
			same("metadata", nonNullRaw(h.metadata), m.Metadata)
		case *protocol.InvocationResult:
			if h.typ != string(protocol.TypeInvocationResult) || h.invocationID != m.InvocationID || h.functionID != m.FunctionID {
				t.Fatalf("fields differ: %+v vs %+v", h, m)
			}
			same("result", h.result, m.Result)
		default:
			t.Fatalf("fast path took a %s frame", m.MessageType())
		}
	})
}

// FuzzInjectCaller: the splice always yields valid JSON, and for objects
// the injected id is the value a JSON parser sees.
func FuzzInjectCaller(f *testing.F) {
	for _, s := range []string{`{}`, `{ }`, `{"a":1}`, `{"_caller_worker_id":"x"}`, `[1]`, `"s"`, `null`, ` {"a":{"b":[]}} `, `1`} {
		f.Add([]byte(s), "worker-1")
	}
	f.Fuzz(func(t *testing.T, data []byte, id string) {
		if !json.Valid(data) {
			return
		}
		out := injectCaller(data, id)
		if !json.Valid(out) {
			t.Fatalf("invalid JSON after splice: %q → %q", data, out)
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(bytes.TrimSpace(data), &obj) != nil || obj == nil {
			if !bytes.Equal(out, data) {
				t.Fatalf("non-object changed: %q → %q", data, out)
			}
			return
		}
		var got struct {
			ID string `json:"_caller_worker_id"`
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		var want string
		_ = json.Unmarshal(mustMarshal(id), &want)
		if got.ID != want {
			t.Fatalf("injected id reads back as %q, want %q", got.ID, want)
		}
	})
}

func mustMarshal(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// FuzzAppendString: the hand-written string encoder agrees with
// encoding/json on what the string decodes to.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", "q\"b\\", "\x00\x1f\n\t", "\xff\xfe", "é\u2028\u2029"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := appendString(nil, s)
		var got, want string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("invalid JSON %q: %v", b, err)
		}
		_ = json.Unmarshal(mustMarshal(s), &want)
		if got != want {
			t.Fatalf("%q decodes to %q, encoding/json gives %q", s, got, want)
		}
	})
}

// FuzzHandleFrame feeds arbitrary frames to a live worker's dispatcher: it
// must never panic, and whatever it sends back must be valid JSON frames.
func FuzzHandleFrame(f *testing.F) {
	for _, s := range fastSeeds {
		f.Add([]byte(s))
	}
	for _, s := range []string{`{"type":"registerfunction","id":"f"}`, `{"type":"reattach","previous_worker_id":"x","reattach_token":"y"}`,
		`{"type":"registertrigger","id":"t","trigger_type":"x","function_id":"f","namespace":" "}`,
		`{"type":"invokefunction","invocation_id":"i","function_id":"engine::workers::register","data":{"name":"n","namespace":"a"}}`,
		`{"type":"invokefunction","invocation_id":"j","function_id":"engine::channels::create","data":{"buffer_size":3}}`,
		`{"type":"invokefunction","invocation_id":"k","function_id":"engine::functions::info","data":{"function_ids":["a","b"]}}`,
		`{"type":"registertriggertype","id":"x","namespace":"n"}`, `{"type":"unregistertriggertype","id":"x"}`} {
		f.Add([]byte(s))
	}
	e := New(Options{})
	defer func() { _ = e.Close(context.Background()) }()
	f.Fuzz(func(t *testing.T, data []byte) {
		w := newWorker(e, newID())
		conn := &wsConn{e: e, w: w, token: "tok", out: make(chan []byte, outQueueSize), quit: make(chan struct{}), writerDone: make(chan struct{})}
		w.conn = conn
		// No socket: every frame goes through the queue, which is read here.
		conn.queued.Store(1 << 40)
		e.addWorker(w)
		conn.handleFrame(data, nil)
		conn.handleFrame(data, nil) // twice: duplicate ids, re-registrations
		conn.shutdown(statusGoingAway, "")
		w.teardown()
		for {
			select {
			case b := <-conn.out:
				if !json.Valid(b) {
					t.Fatalf("engine sent invalid JSON %q for input %q", b, data)
				}
				continue
			default:
			}
			break
		}
	})
}
