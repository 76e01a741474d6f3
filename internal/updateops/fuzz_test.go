package updateops

import (
	"encoding/json"
	"testing"
)

// FuzzUpdateOps: decoding and applying any ops list (stream::update and
// state::update) to any old value never
// panics, and the result is JSON.
func FuzzUpdateOps(f *testing.F) {
	f.Add(`[{"type":"set","path":"a","value":1}]`, `{"a":0}`)
	f.Add(`[{"type":"merge","path":["x","y"],"value":{"z":true}}]`, ``)
	f.Add(`[{"type":"increment","path":"n","by":9223372036854775807}]`, `{"n":18446744073709551615}`)
	f.Add(`[{"type":"append","path":["a","b"],"value":"s"},{"type":"remove","path":""}]`, `"str"`)
	f.Add(`[{"type":"decrement","path":"","by":-9223372036854775808}]`, `1e308`)
	f.Fuzz(func(t *testing.T, ops, old string) {
		decoded, err := Decode(json.RawMessage(ops))
		if err != nil {
			return
		}
		var cur any
		exists := old != ""
		if exists {
			if cur, err = DecodeValue(json.RawMessage(old)); err != nil {
				return
			}
		}
		out, _ := Apply(cur, exists, decoded)
		if _, err := json.Marshal(out); err != nil {
			t.Fatalf("result is not JSON: %v", err)
		}
	})
}
