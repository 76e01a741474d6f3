package configuration

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzDecodeEntryFile: a hand-edited file never panics the worker, and an
// accepted file always yields a JSON value that survives a store round trip.
func FuzzDecodeEntryFile(f *testing.F) {
	for _, s := range []string{
		"id: http\nname: HTTP\ndescription: d\nvalue:\n  port: 8080\n",
		"id: http\nvalue: [1, 2.5, true, null, ~, 0x10, 1e3, '${P:1}']\n",
		"id: http\nvalue: &a {x: *a}\n",
		"id: http\nvalue: .inf\n",
		"id: http\nvalue: {? [a]: b}\n",
		"id: http\nvalue: !!binary aGVsbG8=\n",
		"id: http\nvalue: 2001-12-14t21:59:43.10-05:00\n",
		"id: http\nid: http\n",
		"- a\n",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := decodeEntryFile("http", data)
		if err != nil {
			return
		}
		if !json.Valid(e.Value) {
			t.Fatalf("invalid JSON %q", e.Value)
		}
		out, err := encodeEntryFile(e)
		if err != nil {
			t.Fatalf("accepted entry does not encode: %v", err)
		}
		back, err := decodeEntryFile("http", out)
		if err != nil {
			t.Fatalf("encoded entry does not decode: %v\n%s", err, out)
		}
		if !sameJSON(t, e.Value, back.Value) || back.Name != e.Name || back.Description != e.Description {
			t.Fatalf("round trip changed the entry: %+v -> %+v\n%s", e, back, out)
		}
	})
}

// FuzzJSONRoundTrip: JSON -> YAML node -> JSON keeps the value.
func FuzzJSONRoundTrip(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":[true,null,"x"]}`, `1e400`, `"\u0000"`, `[[[[]]]]`, `{"z":1,"a":2}`, `-0`, `123456789012345678901234567890`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := jsonToNode(data)
		if err != nil {
			return
		}
		out, err := nodeToJSON(n)
		if err != nil {
			return // numbers beyond float64 have no JSON form here
		}
		if !json.Valid(out) {
			t.Fatalf("invalid JSON out %q from %q", out, data)
		}
		if !sameJSON(t, data, out) {
			t.Fatalf("value changed: %q -> %q", data, out)
		}
	})
}

// FuzzExpandValue: expansion never panics and always yields JSON.
func FuzzExpandValue(f *testing.F) {
	for _, s := range []string{`{"p":"${P:1}"}`, `["${A}", "${B:x}y", "${C:.nan}"]`, `"${P:[1]}"`, `"${P:a: b}"`} {
		f.Add([]byte(s))
	}
	x := expander{lookup: env{"A": "true", "P": "80"}.lookup, version: "0.26.0"}
	f.Fuzz(func(t *testing.T, data []byte) {
		out, _, err := x.expand(data)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid JSON %q from %q", out, data)
		}
	})
}

// sameJSON compares two JSON texts as values (numbers by their float
// value, since YAML and JSON spell them differently).
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	// DeepEqual compares floats with ==, so -0 equals 0, as in JSON.
	return reflect.DeepEqual(va, vb)
}
