package protocol

import (
	"bytes"
	"encoding/json"
	"testing"

	"gotest.tools/v3/assert"
)

// sameEncode checks that EncodeFast writes what Encode writes, byte for
// byte, and fails where it fails.
func sameEncode(t *testing.T, m Message) {
	t.Helper()
	want, wantErr := Encode(m)
	got, gotErr := EncodeFast(m)
	if (wantErr == nil) != (gotErr == nil) {
		t.Fatalf("Encode error %v, EncodeFast error %v for %#v", wantErr, gotErr, m)
	}
	if !bytes.Equal(want, got) {
		t.Fatalf("frames differ:\nEncode     %s\nEncodeFast %s", want, got)
	}
}

func TestEncodeFastMatchesEncode(t *testing.T) {
	for _, tc := range goldenFrames() {
		sameEncode(t, tc.msg)
	}
	ns := ""
	for _, m := range []Message{
		&InvokeFunction{FunctionID: "f"},
		&InvokeFunction{FunctionID: "f", Namespace: &ns, Data: json.RawMessage(`{"a":"x y","b":[1,2]}`)},
		&InvokeFunction{FunctionID: "f", Data: json.RawMessage(`{"a": 1}`)},      // compacted by Encode
		&InvokeFunction{FunctionID: "f", Data: json.RawMessage(`{"a":"<b>&"}`)},  // escaped by Encode
		&InvokeFunction{FunctionID: "f", Data: json.RawMessage("\"\u2028\"")},    // escaped by Encode
		&InvokeFunction{FunctionID: "f", Data: json.RawMessage(`{"a":`)},         // invalid: both fail
		&InvokeFunction{FunctionID: "f\"<é", Data: json.RawMessage(`"\"x\\\\"`)}, // strings that need escaping
		&InvokeFunction{FunctionID: "f", Data: json.RawMessage(`null`), Metadata: json.RawMessage(`{}`)},
		&InvocationResult{InvocationID: "i", FunctionID: "f"},
		&InvocationResult{InvocationID: "i", FunctionID: "f", Result: json.RawMessage(`null`)},
		&InvocationResult{InvocationID: "i", FunctionID: "f", Error: &ErrorBody{Code: "c", Message: "line\nbreak"}},
		&InvocationResult{InvocationID: "i", FunctionID: "f", Error: &ErrorBody{Code: "c", Message: "m", Stacktrace: "s"}, Traceparent: "t", Baggage: "b"},
		&Ping{},
	} {
		sameEncode(t, m)
	}
	// The common frames take the fast path.
	b, ok := appendInvoke(&InvokeFunction{InvocationID: "i", FunctionID: "f", Data: json.RawMessage(`{"s":"a b"}`), Action: &TriggerAction{Type: ActionVoid}})
	assert.Assert(t, ok)
	assert.Equal(t, string(b), `{"type":"invokefunction","invocation_id":"i","function_id":"f","data":{"s":"a b"},"action":{"type":"void"}}`)
	_, ok = appendResult(&InvocationResult{InvocationID: "i", FunctionID: "f", Result: json.RawMessage(`[1,"x"]`)})
	assert.Assert(t, ok)
}

func FuzzEncodeFast(f *testing.F) {
	f.Add("i", "math::add", []byte(`{"a":1}`), []byte(`{"m":"x"}`), "ns", true, "code", "tp")
	f.Add("", "f", []byte(`{"a": "<"}`), []byte(nil), "", false, "", "")
	f.Add("i\n", "f\u2028", []byte("\"\u2029\""), []byte(`[1,2`), "\x00", true, "c\"", "")
	f.Fuzz(func(t *testing.T, id, fn string, data, meta []byte, ns string, nsSet bool, code, tp string) {
		in := &InvokeFunction{InvocationID: id, FunctionID: fn, Data: data, Metadata: meta, Traceparent: tp}
		if nsSet {
			in.Namespace = &ns
		}
		if code != "" {
			in.Action = &TriggerAction{Type: ActionType(code), Queue: ns}
		}
		sameEncode(t, in)
		res := &InvocationResult{InvocationID: id, FunctionID: fn, Result: data, Baggage: tp}
		if nsSet {
			res.Error = &ErrorBody{Code: code, Message: ns, Stacktrace: tp}
		}
		sameEncode(t, res)
		// Whatever decodes re-encodes the same way on both paths.
		if m, err := DecodeFast(data); err == nil {
			sameEncode(t, m)
		}
	})
}
