package schemadoc

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"
)

const sandboxRun = `{
  "type": "object",
  "description": "Run code once in a fresh sandbox.",
  "required": ["image", "code"],
  "properties": {
    "image": {"type": "string", "description": "Catalog image name.", "enum": ["python", "node"]},
    "code": {"type": "string", "description": "Source to run.\n  Multi-line\tdescriptions fold."},
    "timeout_ms": {"type": "integer", "default": 30000, "description": "Wall-clock limit."},
    "env": {"type": "object", "description": "Environment.", "properties": {
       "PATH": {"type": "string"},
       "extra": {"type": ["string", "null"], "default": null}
    }},
    "files": {"type": "array", "items": {"type": "object", "required": ["path"], "properties": {
       "path": {"type": "string", "format": "uri-reference"},
       "mode": {"const": 420}
    }}},
    "args": {"type": "array", "items": {"type": "string"}},
    "limits": {"$ref": "#/$defs/limits"},
    "anything": {},
    "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]}
  }
}`

func TestRender(t *testing.T) {
	tests := []struct {
		name   string
		schema string
	}{
		{"sandbox-run", sandboxRun},
		{"scalar", `{"type":"string","description":"A name."}`},
		{"empty-object", `{"type":"object"}`},
		{"true-schema", `true`},
		{"odd-keywords", `{"type":7,"properties":{"a":{"type":"string","required":"yes","enum":{"x":1}},"b":5},"required":[1]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Parse(json.RawMessage(tc.schema))
			assert.NilError(t, err)
			var b bytes.Buffer
			assert.NilError(t, d.Render(&b, "  "))
			golden.Assert(t, b.String(), tc.name+".golden")
		})
	}
}

func TestParseFields(t *testing.T) {
	d, err := Parse(json.RawMessage(sandboxRun))
	assert.NilError(t, err)
	assert.Equal(t, d.Type, "object")
	var paths []string
	for _, f := range d.Fields {
		paths = append(paths, f.Path)
	}
	assert.DeepEqual(t, paths, []string{"image", "code", "timeout_ms", "env", "env.PATH", "env.extra",
		"files", "files[].path", "files[].mode", "args", "limits", "anything", "either"})
	assert.DeepEqual(t, d.Fields[0], Field{Path: "image", Type: "string", Required: true,
		Description: "Catalog image name.", Enum: []string{`"python"`, `"node"`}})
	assert.Equal(t, d.Fields[2].Default, "30000")
	assert.Equal(t, d.Fields[6].Type, "array of object")
	assert.Assert(t, d.Fields[7].Required)
	assert.Equal(t, d.Fields[9].Type, "array of string")
	assert.Equal(t, d.Fields[10].Type, "see #/$defs/limits")
	assert.Equal(t, d.Fields[12].Type, "string|integer")
}

func TestParseErrors(t *testing.T) {
	for _, bad := range []string{``, `  `, `"string"`, `[`, `12`} {
		_, err := Parse(json.RawMessage(bad))
		assert.Assert(t, err != nil, bad)
	}
}

func TestLimits(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range maxFields + 20 {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"f` + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + `_` + string(rune('0'+i%10)) + strings.Repeat("y", i/26) + `":{"type":"string"}`)
	}
	b.WriteString(`}}`)
	d, err := Parse(json.RawMessage(b.String()))
	assert.NilError(t, err)
	assert.Equal(t, len(d.Fields), maxFields)
	assert.Assert(t, d.Truncated)

	deep := strings.Repeat(`{"type":"object","properties":{"n":`, 20) + `{}` + strings.Repeat(`}}`, 20)
	d, err = Parse(json.RawMessage(deep))
	assert.NilError(t, err)
	assert.Equal(t, len(d.Fields), maxDepth)

	long := `{"type":"object","properties":{"a":{"default":"` + strings.Repeat("z", 500) + `"}}}`
	d, err = Parse(json.RawMessage(long))
	assert.NilError(t, err)
	assert.Equal(t, len([]rune(d.Fields[0].Default)), maxCell)
}

// FuzzParse: any bytes give a doc that renders, or an error; never a panic.
func FuzzParse(f *testing.F) {
	f.Add([]byte(sandboxRun))
	f.Add([]byte(`{"anyOf":[{"anyOf":[{"type":"x"}]}],"items":{"items":{}}}`))
	f.Add([]byte(`{"properties":{"a":{"properties":{"a":{}}}},"required":["a"]}`))
	f.Add([]byte(`true`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		d, err := Parse(raw)
		if err != nil {
			return
		}
		var b bytes.Buffer
		if err := d.Render(&b, " "); err != nil {
			t.Fatal(err)
		}
		if len(d.Fields) > maxFields {
			t.Fatalf("%d fields", len(d.Fields))
		}
	})
}
