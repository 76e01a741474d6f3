package schema

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/contract"
)

func compile(t *testing.T, name string, raw []byte) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	assert.NilError(t, err, "%s is JSON", name)
	c := jsonschema.NewCompiler()
	assert.NilError(t, c.AddResource(name, doc))
	s, err := c.Compile(name)
	assert.NilError(t, err, "%s compiles", name)
	return s
}

func validate(t *testing.T, s *jsonschema.Schema, instance string) error {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(instance)))
	assert.NilError(t, err)
	return s.Validate(v)
}

func TestEveryOpHasSchemas(t *testing.T) {
	for _, op := range append(contract.Ops(), contract.OpAdapterInfo) {
		assert.Assert(t, Request(op) != nil, "request schema of %s", op)
		assert.Assert(t, Response(op) != nil, "response schema of %s", op)
		assert.Assert(t, Description(op) != "", "description of %s", op)
		compile(t, op+".request.json", Request(op))
		compile(t, op+".response.json", Response(op))
	}
	assert.Assert(t, Request("nope") == nil)
	assert.Assert(t, Response("nope") == nil)
}

// The contract's own reply examples match the published reply schemas.
func TestResponsesMatchContractExamples(t *testing.T) {
	examples := map[string]string{
		"adapter-info.json": contract.OpAdapterInfo, "catalog-empty.json": contract.OpCatalogList, "catalog.json": contract.OpCatalogList,
		"create.json": contract.OpCreate, "exec-killed.json": contract.OpExec, "exec.json": contract.OpExec,
		"fs-chmod.json": contract.OpFsChmod, "fs-grep-empty.json": contract.OpFsGrep, "fs-grep.json": contract.OpFsGrep,
		"fs-ls-empty.json": contract.OpFsLs, "fs-ls.json": contract.OpFsLs, "fs-mkdir.json": contract.OpFsMkdir,
		"fs-mv.json": contract.OpFsMv, "fs-read-large.json": contract.OpFsRead, "fs-read.json": contract.OpFsRead,
		"fs-rm.json": contract.OpFsRm, "fs-sed-empty.json": contract.OpFsSed, "fs-sed.json": contract.OpFsSed,
		"fs-stat.json": contract.OpFsStat, "fs-write.json": contract.OpFsWrite, "list-empty.json": contract.OpList,
		"list.json": contract.OpList, "run-kept.json": contract.OpRun, "run.json": contract.OpRun, "stop.json": contract.OpStop,
	}
	for file, op := range examples {
		t.Run(file, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("..", "testdata", "json", file))
			assert.NilError(t, err)
			s := compile(t, op, Response(op))
			assert.NilError(t, validate(t, s, string(raw)))
		})
	}
}

func TestRequestSchemas(t *testing.T) {
	const id = `"1b4e6709-f265-4142-9178-3a7d83b46aa5"`
	for _, tc := range []struct {
		op, in string
		ok     bool
	}{
		{contract.OpRun, `{"image":"python","lang":"python","code":"print(2+2)"}`, true},
		{contract.OpRun, `{"image":"python","code":"print(2+2)"}`, false},
		{contract.OpExec, `{"sandbox_id":` + id + `,"cmd":"ls -l","env":{"A":"1"}}`, true},
		{contract.OpExec, `{"sandbox_id":` + id + `,"argv":["ls"],"env":["A=1"]}`, true},
		{contract.OpExec, `{"sandbox_id":` + id + `,"timeout_ms":0}`, false},
		{contract.OpFsWrite, `{"sandbox_id":` + id + `,"path":"/a","content":"hi"}`, true},
		{contract.OpFsWrite, `{"sandbox_id":` + id + `,"path":"/a","content":{"channel_id":"c","access_key":"k","direction":"read"}}`, true},
		{contract.OpFsWrite, `{"sandbox_id":` + id + `,"path":"/a","content":{"channel_id":"c","access_key":"k","direction":"write"}}`, false},
		{contract.OpFsWrite, `{"sandbox_id":` + id + `,"path":"/a"}`, false},
		{contract.OpFsWrite, `{"sandbox_id":` + id + `,"path":"/a","content":"x","content_b64":"eA=="}`, false},
		{contract.OpFsSed, `{"sandbox_id":` + id + `,"path":"/a","pattern":"x","replacement":""}`, true},
		{contract.OpFsSed, `{"sandbox_id":` + id + `,"pattern":"x","replacement":""}`, false},
		{contract.OpFsChmod, `{"sandbox_id":` + id + `,"path":"/a","mode":"0755"}`, true},
		{contract.OpFsChmod, `{"sandbox_id":` + id + `,"path":"/a"}`, false},
		{contract.OpCatalogList, `{}`, true},
		{contract.OpCreate, `{"image":"python","progress":{"channel_id":"c","access_key":"k","direction":"write"}}`, true},
		{contract.OpCreate, `{"image":"python","progress":{"channel_id":"c","access_key":"k","direction":"read"}}`, true},
		{contract.OpCreate, `{"image":"python","progress":"c"}`, false},
		{contract.OpRun, `{"image":"python","lang":"sh","code":"","progress":{"channel_id":"c","direction":"write"}}`, false},
		{contract.OpRun, `{"image":"python","lang":"sh","code":"","progress":{"channel_id":"c","access_key":"k","direction":"write"}}`, true},
	} {
		s := compile(t, tc.op, Request(tc.op))
		err := validate(t, s, tc.in)
		assert.Equal(t, err == nil, tc.ok, "%s %s: %v", tc.op, tc.in, err)
	}
}

// create and run mark their progress field for callers such as `iii call`;
// no other operation has a marked field.
func TestProgressMarker(t *testing.T) {
	for _, op := range contract.Ops() {
		var doc struct {
			Properties map[string]any `json:"properties"`
		}
		assert.NilError(t, json.Unmarshal(Request(op), &doc))
		props := doc.Properties
		var marked []string
		for name, p := range props {
			if pm, ok := p.(map[string]any); ok && pm[contract.ProgressSchemaMarker] == true {
				marked = append(marked, name)
			}
		}
		want := []string(nil)
		if op == contract.OpCreate || op == contract.OpRun {
			want = []string{contract.ProgressField}
		}
		assert.DeepEqual(t, marked, want)
	}
}
