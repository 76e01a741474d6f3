package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
)

// fastSeeds are call-path frames, valid and not, for the dispatcher
// (protocol's FuzzDecodeFast holds protocol.ScanCallFrame, the fast path's
// reader, to protocol.Decode).
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
