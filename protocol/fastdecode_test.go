package protocol

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

// sameDecode checks that DecodeFast gives what Decode gives for data.
func sameDecode(t *testing.T, data []byte) {
	t.Helper()
	want, wantErr := Decode(data)
	got, gotErr := DecodeFast(data)
	if (wantErr == nil) != (gotErr == nil) {
		t.Fatalf("Decode error %v, DecodeFast error %v\nframe: %q", wantErr, gotErr, data)
	}
	if wantErr != nil {
		if wantErr.Error() != gotErr.Error() {
			t.Fatalf("errors differ: %v / %v", wantErr, gotErr)
		}
		var a, b *DecodeError
		if errors.As(wantErr, &a) != errors.As(gotErr, &b) || (a != nil && (a.Type != b.Type || a.InvocationID != b.InvocationID ||
			a.FunctionID != b.FunctionID || a.Err.Error() != b.Err.Error())) {
			t.Fatalf("decode errors differ: %#v / %#v", a, b)
		}
		return
	}
	if !reflect.DeepEqual(normRaw(want), normRaw(got)) {
		t.Fatalf("results differ:\nDecode     %#v\nDecodeFast %#v\nframe: %q", want, got, data)
	}
}

// normRaw makes the raw fields comparable: Decode's are copies, the fast
// path's sub-slices; both are nil when absent.
func normRaw(m Message) Message {
	switch m := m.(type) {
	case *InvokeFunction:
		c := *m
		return &c
	case *InvocationResult:
		c := *m
		return &c
	}
	return m
}

func TestDecodeFastTakesCallFrames(t *testing.T) {
	cases := []struct {
		frame string
		want  Message
	}{
		{`{"type":"invokefunction","invocation_id":"i-1","function_id":"math::add","data":{"a":1,"b":[true,null,"x\n"]},"metadata":{"m":1},"namespace":"orders","traceparent":"tp","baggage":"bg","action":{"type":"enqueue","queue":"q"}}`,
			&InvokeFunction{InvocationID: "i-1", FunctionID: "math::add", Data: json.RawMessage(`{"a":1,"b":[true,null,"x\n"]}`),
				Metadata: json.RawMessage(`{"m":1}`), Namespace: ptr("orders"), Traceparent: "tp", Baggage: "bg",
				Action: &TriggerAction{Type: ActionEnqueue, Queue: "q"}}},
		{` { "function_id" : "f" , "type" : "invokefunction" , "data" : null , "namespace" : null } `, &InvokeFunction{FunctionID: "f"}},
		{`{"type":"invocationresult","invocation_id":"i","function_id":"f","result":null}`,
			&InvocationResult{InvocationID: "i", FunctionID: "f", Result: json.RawMessage(`null`)}},
		{`{"type":"invocationresult","invocation_id":"i","function_id":"f","error":{"code":"c","message":"m"},"extra":[1,{"x":-1.5e3}]}`,
			&InvocationResult{InvocationID: "i", FunctionID: "f", Error: &ErrorBody{Code: "c", Message: "m"}}},
		// null leaves a string as it was, as with encoding/json; later duplicates win.
		{`{"type":"invokefunction","function_id":"f","function_id":null,"data":1,"data":2}`,
			&InvokeFunction{FunctionID: "f", Data: json.RawMessage(`2`)}},
	}
	for _, tc := range cases {
		var f CallFrame
		assert.Assert(t, ScanCallFrame([]byte(tc.frame), &f), "not taken by the fast path: %s", tc.frame)
		got, err := DecodeFast([]byte(tc.frame))
		assert.NilError(t, err)
		assert.DeepEqual(t, got, tc.want)
		sameDecode(t, []byte(tc.frame))
	}
}

func TestDecodeFastFallsBack(t *testing.T) {
	for _, frame := range []string{
		`{"type":"ping"}`,
		`{"type":"invokefunction","Function_ID":"f"}`,       // case-folded key
		`{"type":"invokefunction","function_id":"f\u0041"}`, // escaped id
		`{"type":"invokefunction","function_id":5}`,
		`{"type":"invokefunction","data":{"x":}`,
		`{"type":"invokefunction","data":01}`,
		`{"type":"invokefunction"} x`,
		"{\"type\":\"invokefunction\",\"function_id\":\"\xff\"}",
		`{"type":"invokefunction","data":` + strings.Repeat("[", maxFastDepth+5) + strings.Repeat("]", maxFastDepth+5) + `}`,
		`{"type":"invokefunction","data":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`,
	} {
		var f CallFrame
		assert.Assert(t, !ScanCallFrame([]byte(frame), &f), "taken by the fast path: %.80s", frame)
		sameDecode(t, []byte(frame))
	}
	// Scanned, but a nested field of the wrong shape: Decode answers.
	for _, frame := range []string{
		`{"type":"invokefunction","invocation_id":"x","action":"void"}`,
		`{"type":"invocationresult","invocation_id":"x","error":"boom"}`,
	} {
		_, err := DecodeFast([]byte(frame))
		var de *DecodeError
		assert.Assert(t, errors.As(err, &de), "%v", err)
		assert.Equal(t, de.InvocationID, "x")
		sameDecode(t, []byte(frame))
	}
}

func TestGoldenFramesDecodeFast(t *testing.T) {
	for _, tc := range goldenFrames() {
		b, err := Encode(tc.msg)
		assert.NilError(t, err)
		sameDecode(t, b)
	}
}

// FuzzDecodeFast: on any input DecodeFast and Decode agree, result and
// error alike.
func FuzzDecodeFast(f *testing.F) {
	for _, tc := range goldenFrames() {
		if b, err := Encode(tc.msg); err == nil {
			f.Add(b)
		}
	}
	entries, _ := os.ReadDir("testdata")
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".golden") {
			if b, err := os.ReadFile(filepath.Join("testdata", e.Name())); err == nil {
				f.Add(b)
			}
		}
	}
	for _, s := range []string{`{"type":"invokefunction","invocation_id":"x","function_id":5}`, `{"type":"invocationresult","result":null}`,
		`{"type":"invokefunction","data":{ "a" : [1, 2e-3, "\u00e9"] },"namespace":null}`, `{"type":"invokefunction","action":{"type":"void"}}`,
		`{"type":"invocationresult","invocation_id":"i","error":{"code":"c","message":"m","stacktrace":"s"}}`, "\xff",
		// The engine's fast path reads frames with ScanCallFrame: seeds from
		// its former fuzz target of its own copy.
		`{"type":"invokefunction","type":"invocationresult","invocation_id":"d"}`, `{"Type":"invokefunction","function_id":"f"}`,
		`{"type":"invokefunction","function_id":"f","function_id":null}`, `{"type":"invokefunction","function_id":"f"} x`,
		` { "type" : "invokefunction" , "function_id" : "f" , "data" : [ ] } `, "{\"type\":\"invokefunction\",\"function_id\":\"\xff\"}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { sameDecode(t, data) })
}

func TestObjectMembers(t *testing.T) {
	var keys, vals []string
	ok := ObjectMembers([]byte(` {"a":1, "b" : {"c":[true]},"a":"x y"} `), func(k, v []byte) bool {
		keys, vals = append(keys, string(k)), append(vals, string(v))
		return true
	})
	assert.Assert(t, ok)
	assert.DeepEqual(t, keys, []string{"a", "b", "a"})
	assert.DeepEqual(t, vals, []string{"1", `{"c":[true]}`, `"x y"`})
	assert.Assert(t, ObjectMembers([]byte(`{}`), func(k, v []byte) bool { return false }))
	for _, bad := range []string{`[]`, `{"a":}`, `{"a":1}x`, `{"\u0061":1}`, `{"a":1,}`, ``} {
		assert.Assert(t, !ObjectMembers([]byte(bad), func(k, v []byte) bool { return true }), bad)
	}
	assert.Assert(t, !ObjectMembers([]byte(`{"a":1}`), func(k, v []byte) bool { return false }))
}

func TestPlainString(t *testing.T) {
	for in, want := range map[string]string{`"abc"`: "abc", `""`: "", `"é x"`: "é x"} {
		got, ok := PlainString([]byte(in))
		assert.Assert(t, ok, in)
		assert.Equal(t, got, want)
	}
	for _, bad := range []string{`null`, `"a\"b"`, `"a"b"`, "\"\xff\"", `"`, `1`, "\"\n\""} {
		_, ok := PlainString([]byte(bad))
		assert.Assert(t, !ok, bad)
	}
	assert.Assert(t, PlainKey([]byte("status_code2")) && !PlainKey([]byte("Status")))
}

func TestValid(t *testing.T) {
	for _, in := range []string{` {"a":[1,-2.5e3,true,false,null,"x\u00e9\n"]} `, `1`, `"\xff"`, `{}`, ``, ` `, `{"a":}`, `01`, `[1,]`, `"a`,
		`1 2`, `{"a":1}}`, `-`, `1.`, `1e`, `"\x01"`, `"\q"`, strings.Repeat("[", 9500) + strings.Repeat("]", 9500),
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001), `nul`, `tru`, `[` + strings.Repeat(`"abcdefghij",`, 20) + `0]`} {
		assert.Equal(t, Valid([]byte(in)), json.Valid([]byte(in)), "%.60q", in)
	}
}

func FuzzValid(f *testing.F) {
	f.Add([]byte(`{"a":[1,2,{"b":"c"}]}`))
	f.Add([]byte(`  -0.1e+5 `))
	f.Fuzz(func(t *testing.T, data []byte) {
		if Valid(data) != json.Valid(data) {
			t.Fatalf("Valid(%q) = %v, json.Valid says %v", data, Valid(data), json.Valid(data))
		}
	})
}
