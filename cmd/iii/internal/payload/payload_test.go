package payload

import (
	"encoding/json"
	"errors"
	"testing"

	"gotest.tools/v3/assert"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		tokens  []string
		json    string
		jsonSet bool
		want    string
		code    string
		msg     string
	}{
		// Rule 1: nothing given.
		{name: "nothing", want: `{}`},
		// Rule 2: only --json, any JSON type, used as is.
		{name: "json object", json: `{"a": 1, "b": [true, null]}`, jsonSet: true, want: `{"a":1,"b":[true,null]}`},
		{name: "json array", json: `[1,"x"]`, jsonSet: true, want: `[1,"x"]`},
		{name: "json string", json: `"hi"`, jsonSet: true, want: `"hi"`},
		{name: "json number", json: ` 42 `, jsonSet: true, want: `42`},
		{name: "json null", json: `null`, jsonSet: true, want: `null`},
		{name: "json invalid", json: `{a:1}`, jsonSet: true, code: CodeInvalidJSON},
		{name: "json empty given", json: ``, jsonSet: true, code: CodeInvalidJSON, msg: "--json is not valid JSON: empty input"},
		{name: "json trailing garbage", json: `{} x`, jsonSet: true, code: CodeInvalidJSON},
		// Rule 3: only tokens; JSON values decoded, others stay strings.
		{name: "number", tokens: []string{"n=10"}, want: `{"n":10}`},
		{name: "float", tokens: []string{"f=1.5e3"}, want: `{"f":1.5e3}`},
		{name: "bool", tokens: []string{"b=true"}, want: `{"b":true}`},
		{name: "null", tokens: []string{"z=null"}, want: `{"z":null}`},
		{name: "array", tokens: []string{`a=["x", 1]`}, want: `{"a":["x",1]}`},
		{name: "object", tokens: []string{`o={"k": 1}`}, want: `{"o":{"k":1}}`},
		{name: "quoted string", tokens: []string{`s="10"`}, want: `{"s":"10"}`},
		{name: "plain string", tokens: []string{"name=alice"}, want: `{"name":"alice"}`},
		{name: "empty value", tokens: []string{"e="}, want: `{"e":""}`},
		{name: "split at first equals", tokens: []string{"q=a=b"}, want: `{"q":"a=b"}`},
		{name: "invalid json stays string", tokens: []string{`x={"y":`}, want: `{"x":"{\"y\":"}`},
		{name: "spaces around json", tokens: []string{"n= 7 "}, want: `{"n":7}`},
		{name: "spaces kept in strings", tokens: []string{"s= a b "}, want: `{"s":" a b "}`},
		{name: "unicode", tokens: []string{"greet=héllo"}, want: `{"greet":"héllo"}`},
		{name: "invalid utf-8 token", tokens: []string{"k=\xff"}, code: CodeBadToken, msg: `invalid argument "k=\xff": not valid UTF-8`},
		{name: "invalid utf-8 json", json: "\"\xff\"", jsonSet: true, code: CodeInvalidJSON},
		{name: "dotted key is literal", tokens: []string{"a.b=1"}, want: `{"a.b":1}`},
		{name: "order kept", tokens: []string{"z=1", "a=2", "m=3"}, want: `{"z":1,"a":2,"m":3}`},
		{name: "no equals", tokens: []string{"novalue"}, code: CodeBadToken, msg: `invalid argument "novalue": expected key=value`},
		{name: "empty key", tokens: []string{"=1"}, code: CodeBadToken, msg: `invalid argument "=1": empty key`},
		// Rule 4: both; --json must be an object, tokens override.
		{name: "merge", tokens: []string{"b=2", "c=x"}, json: `{"a":1,"b":1}`, jsonSet: true, want: `{"a":1,"b":2,"c":"x"}`},
		{name: "merge replaces nested wholesale", tokens: []string{`o={"y":2}`}, json: `{"o":{"x":1,"y":1}}`, jsonSet: true, want: `{"o":{"y":2}}`},
		{name: "merge into empty object", tokens: []string{"a=1"}, json: `{}`, jsonSet: true, want: `{"a":1}`},
		{name: "merge json array", tokens: []string{"a=1"}, json: `[1]`, jsonSet: true, code: CodeJSONNotObj,
			msg: "--json must be an object when combined with kv pairs"},
		{name: "merge json scalar", tokens: []string{"a=1"}, json: `3`, jsonSet: true, code: CodeJSONNotObj},
		{name: "merge json null", tokens: []string{"a=1"}, json: `null`, jsonSet: true, code: CodeJSONNotObj},
		{name: "merge invalid json", tokens: []string{"a=1"}, json: `{`, jsonSet: true, code: CodeInvalidJSON},
		{name: "merge bad token", tokens: []string{"a"}, json: `{}`, jsonSet: true, code: CodeBadToken},
		// Rule 5: a repeated key, last one wins (first position kept).
		{name: "repeated key", tokens: []string{"worker=a", "x=1", "worker=b"}, want: `{"worker":"b","x":1}`},
		{name: "repeated key over json", tokens: []string{"a=2", "a=3"}, json: `{"a":1}`, jsonSet: true, want: `{"a":3}`},
		{name: "duplicate in json", json: `{"a":1,"a":2}`, jsonSet: true, tokens: []string{"b=0"}, want: `{"a":2,"b":0}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.tokens, tc.json, tc.jsonSet)
			if tc.code != "" {
				var pe *Error
				assert.Assert(t, errors.As(err, &pe), "got %s, %v", got, err)
				assert.Equal(t, pe.Code, tc.code)
				if tc.msg != "" {
					assert.Equal(t, pe.Message, tc.msg)
				}
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, string(got), tc.want)
			assert.Assert(t, json.Valid(got))
		})
	}
}

// FuzzParse: for any tokens and --json, Parse returns valid JSON or a coded
// error, and the token rules hold on the result.
func FuzzParse(f *testing.F) {
	f.Add("a=1", "b=x", `{"c":true}`, true)
	f.Add("k=[1,2", "=", ``, false)
	f.Add("x", "y=\xff", `[1]`, true)
	f.Add("a=1", "a=2", `{"a":0}`, true)
	f.Fuzz(func(t *testing.T, tok1, tok2, jsonText string, jsonSet bool) {
		tokens := []string{tok1, tok2}
		got, err := Parse(tokens, jsonText, jsonSet)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Code == "" {
				t.Fatalf("uncoded error: %v", err)
			}
			return
		}
		if !json.Valid(got) {
			t.Fatalf("invalid JSON %q", got)
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(got, &obj); err != nil {
			t.Fatalf("tokens given but result is not an object: %q", got)
		}
		// The last token for a key decides its value.
		k2, v2, _ := cut(tok2)
		if _, ok := obj[k2]; !ok {
			t.Fatalf("key %q missing from %q", k2, got)
		}
		want := tokenValue(v2)
		var a, b any
		if json.Unmarshal(obj[k2], &a) != nil || json.Unmarshal(want, &b) != nil {
			t.Fatalf("value of %q does not decode", k2)
		}
		if ja, _ := json.Marshal(a); string(ja) != string(mustMarshal(b)) {
			t.Fatalf("key %q = %s, want %s", k2, obj[k2], want)
		}
	})
}

func cut(tok string) (string, string, bool) {
	for i := 0; i < len(tok); i++ {
		if tok[i] == '=' {
			return tok[:i], tok[i+1:], true
		}
	}
	return tok, "", false
}

func mustMarshal(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
