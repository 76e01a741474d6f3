package jsonpretty

import (
	"bytes"
	"encoding/json"
	"testing"

	"gotest.tools/v3/assert"
)

func TestIndent(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"object order kept", `{"z":1,"a":{"y":[1,2],"b":{}},"e":[]}`,
			"{\n  \"z\": 1,\n  \"a\": {\n    \"y\": [\n      1,\n      2\n    ],\n    \"b\": {}\n  },\n  \"e\": []\n}"},
		{"scalars", ` "s" `, `"s"`},
		{"number text kept", `[1.50, 1e400, -0, 12345678901234567890]`, "[\n  1.50,\n  1e400,\n  -0,\n  12345678901234567890\n]"},
		{"escapes undone", `{"t":"\u003cb\u003e\u0026 \u00e9 \"q\" \\ \n"}`, "{\n  \"t\": \"<b>& é \\\"q\\\" \\\\ \\n\"\n}"},
		{"literals", `[true,false,null]`, "[\n  true,\n  false,\n  null\n]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Indent([]byte(tc.in))
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
		})
	}
	for _, bad := range []string{``, `{`, `{"a":1}x`, `{"a" 1}`, `[1,]`, `{} {}`, `nul`} {
		_, err := Indent([]byte(bad))
		assert.Assert(t, err != nil, bad)
	}
}

// FuzzIndent: valid JSON renders to JSON that means the same; invalid JSON
// is refused; never a panic.
func FuzzIndent(f *testing.F) {
	for _, s := range []string{`{"a":[1,{"b":null}]}`, `"x"`, `[`, `{"\u003c":1}`, `1e5`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		out, err := Indent(raw)
		if err != nil {
			return
		}
		if !json.Valid([]byte(out)) {
			t.Fatalf("output is not JSON: %q", out)
		}
		var a, b any
		da := json.NewDecoder(bytes.NewReader(raw))
		da.UseNumber()
		db := json.NewDecoder(bytes.NewReader([]byte(out)))
		db.UseNumber()
		if da.Decode(&a) != nil || db.Decode(&b) != nil {
			t.Fatalf("round trip failed for %q", raw)
		}
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if !bytes.Equal(ja, jb) {
			t.Fatalf("meaning changed: %s vs %s", ja, jb)
		}
	})
}
