package updateops

import (
	"encoding/json"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

func TestApplyOps(t *testing.T) {
	tests := []struct {
		name   string
		old    string // "" = the item does not exist
		ops    string
		want   string
		errors []string // the codes of skipped operations
	}{
		{name: "set field on new item", ops: `[{"type":"set","path":"a","value":1}]`, want: `{"a":1}`},
		{name: "set root", old: `{"a":1}`, ops: `[{"type":"set","path":"","value":[1]}]`, want: `[1]`},
		{name: "set field on non-object", old: `5`, ops: `[{"type":"set","path":"a","value":1}]`, want: `5`, errors: []string{"set.target_not_object"}},
		{name: "merge root", old: `{"a":1,"b":2}`, ops: `[{"type":"merge","value":{"b":3,"c":4}}]`, want: `{"a":1,"b":3,"c":4}`},
		{name: "merge nested path creates it", old: `{"a":1}`, ops: `[{"type":"merge","path":["x","y"],"value":{"z":true}}]`, want: `{"a":1,"x":{"y":{"z":true}}}`},
		{name: "merge not object", ops: `[{"type":"merge","value":3}]`, want: `{}`, errors: []string{"merge.value.not_an_object"}},
		{name: "merge proto key", ops: `[{"type":"merge","value":{"__proto__":{}}}]`, want: `{}`, errors: []string{"merge.value.proto_polluted"}},
		{name: "merge proto path", ops: `[{"type":"merge","path":["constructor"],"value":{}}]`, want: `{}`, errors: []string{"merge.path.proto_polluted"}},
		{name: "increment missing item", ops: `[{"type":"increment","path":"","by":3}]`, want: `3`},
		{name: "increment field", old: `{"n":1.5,"m":7}`, ops: `[{"type":"increment","path":"n","by":2},{"type":"increment","path":"m","by":-10},{"type":"increment","path":"k","by":1}]`, want: `{"k":1,"m":-3,"n":3.5}`},
		{name: "increment keeps big integers exact", old: `{"n":9007199254740993}`, ops: `[{"type":"increment","path":"n","by":1}]`, want: `{"n":9007199254740994}`},
		{name: "increment overflow", old: `{"n":9223372036854775807}`, ops: `[{"type":"increment","path":"n","by":1}]`, want: `{"n":9223372036854775808}`},
		{name: "increment not number", old: `{"n":"x"}`, ops: `[{"type":"increment","path":"n","by":1}]`, want: `{"n":"x"}`, errors: []string{"increment.not_number"}},
		{name: "decrement", old: `{"n":10}`, ops: `[{"type":"decrement","path":"n","by":4},{"type":"decrement","path":"m","by":2}]`, want: `{"m":-2,"n":6}`},
		{name: "append to array and string", old: `{"l":[1],"s":"ab"}`, ops: `[{"type":"append","path":"l","value":2},{"type":"append","path":"s","value":"c"},{"type":"append","path":"new","value":"x"},{"type":"append","path":["deep","list"],"value":"y"}]`, want: `{"deep":{"list":["y"]},"l":[1,2],"new":"x","s":"abc"}`},
		{name: "append mismatch", old: `{"s":"ab","n":1}`, ops: `[{"type":"append","path":"s","value":1},{"type":"append","path":"n","value":1}]`, want: `{"n":1,"s":"ab"}`, errors: []string{"append.type_mismatch", "append.type_mismatch"}},
		{name: "append root of missing item", ops: `[{"type":"append","value":{"a":1}}]`, want: `[{"a":1}]`},
		{name: "remove", old: `{"a":1,"b":2}`, ops: `[{"type":"remove","path":"a"}]`, want: `{"b":2}`},
		{name: "remove root", old: `{"a":1}`, ops: `[{"type":"remove","path":""}]`, want: `null`},
		{name: "empty segment", ops: `[{"type":"merge","path":["a",""],"value":{}}]`, want: `{}`, errors: []string{"merge.path.empty_segment"}},
		{name: "one bad op, others apply", old: `{"n":1}`, ops: `[{"type":"increment","path":"n","by":1},{"type":"merge","value":"x"},{"type":"set","path":"s","value":"ok"}]`, want: `{"n":2,"s":"ok"}`, errors: []string{"merge.value.not_an_object"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ops, err := Decode(json.RawMessage(tc.ops))
			assert.NilError(t, err)
			var old any
			if tc.old != "" {
				old, err = DecodeValue(json.RawMessage(tc.old))
				assert.NilError(t, err)
			}
			got, errs := Apply(old, tc.old != "", ops)
			b, err := json.Marshal(got)
			assert.NilError(t, err)
			assert.Equal(t, string(b), tc.want)
			var codes []string
			for _, e := range errs {
				codes = append(codes, e.Code)
			}
			assert.DeepEqual(t, codes, tc.errors)
		})
	}
}

func TestDecodeOpsRefuses(t *testing.T) {
	tests := []struct{ name, ops, want string }{
		{name: "not array", ops: `{}`, want: "ops must be an array"},
		{name: "null", ops: `null`, want: "ops must be an array"},
		{name: "no type", ops: `[{"path":"a"}]`, want: "must be an object with a type"},
		{name: "unknown type", ops: `[{"type":"explode"}]`, want: `unknown type "explode"`},
		{name: "set without path", ops: `[{"type":"set","value":1}]`, want: "needs path"},
		{name: "increment without by", ops: `[{"type":"increment","path":"n"}]`, want: "needs by"},
		{name: "increment float by", ops: `[{"type":"increment","path":"n","by":1.5}]`, want: "needs by"},
		{name: "merge without value", ops: `[{"type":"merge"}]`, want: "needs value"},
		{name: "merge path number", ops: `[{"type":"merge","path":5,"value":{}}]`, want: "path must be a string or an array"},
		{name: "too many", ops: "[" + strings.Repeat(`{"type":"remove","path":"a"},`, 256) + `{"type":"remove","path":"a"}]`, want: "at most 256"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(json.RawMessage(tc.ops))
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
