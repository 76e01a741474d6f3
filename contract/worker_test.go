package contract

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

const fullWorkerStart = `{"vm_id":"shop-3f2a1b9c-default-api","name":"api","namespace":"shop","image":"node",
"host_dir":"/srv/shop/./workers/api/","workdir":"src","install":"npm ci","command":"node index.mjs",
"env":{"B":"2","A":"1"},"config":{"file_name":"api.yaml","content":"port: 1\n"},"cpus":2,"memory_mb":1024,
"engine_url":"ws://127.0.0.1:49134","exclude":["/srv/shop/state/"],"include":["node_modules"],"wait":true,"engine_credential":"c0ffee","_caller_worker_id":"x"}`

func TestDecodeWorkerStart(t *testing.T) {
	got, err := DecodeWorkerStartRequest(json.RawMessage(fullWorkerStart))
	assert.NilError(t, err)
	two, mem := uint32(2), uint32(1024)
	assert.DeepEqual(t, got, &WorkerStartRequest{
		VMID: "shop-3f2a1b9c-default-api", Name: "api", Namespace: "shop", Image: "node",
		HostDir: "/srv/shop/workers/api", Workdir: "/workspace/src", Install: "npm ci", Command: "node index.mjs",
		Env: []string{"A=1", "B=2"}, Config: &WorkerConfigFile{FileName: "api.yaml", Content: "port: 1\n"},
		CPUs: &two, MemoryMB: &mem, EngineURL: "ws://127.0.0.1:49134", Exclude: []string{"/srv/shop/state"}, Include: []string{"node_modules"}, Wait: true, EngineCredential: "c0ffee",
	})

	base := `"vm_id":"w1","name":"w","image":"node","host_dir":"/d","command":"node .","engine_url":"ws://localhost:1"`
	for _, tc := range []struct {
		name, body, want string
	}{
		{"minimal", `{` + base + `}`, ""},
		{"absolute workdir", `{` + base + `,"workdir":"/app/../srv"}`, ""},
		{"not an object", `[]`, "must be a JSON object"},
		{"missing vm_id", `{"name":"w"}`, `field "vm_id" is required`},
		{"upper-case vm_id", `{` + strings.Replace(base, `"w1"`, `"W1"`, 1) + `}`, "not path-safe"},
		{"dot-dot vm_id", `{` + strings.Replace(base, `"w1"`, `".."`, 1) + `}`, "not path-safe"},
		{"slash in vm_id", `{` + strings.Replace(base, `"w1"`, `"a/b"`, 1) + `}`, "not path-safe"},
		{"long vm_id", `{` + strings.Replace(base, `"w1"`, `"`+strings.Repeat("a", MaxVMIDLen+1)+`"`, 1) + `}`, "not path-safe"},
		{"relative host_dir", `{` + strings.Replace(base, `"/d"`, `"d"`, 1) + `}`, "must be an absolute host path"},
		{"workdir escapes", `{` + base + `,"workdir":"../x"}`, "leaves /workspace"},
		{"blank command", `{` + strings.Replace(base, `"node ."`, `"  "`, 1) + `}`, "is blank"},
		{"engine token in env", `{` + base + `,"env":{"III_ENGINE_TOKEN":"t"}}`, "must never be readable inside a VM"},
		{"engine token in env list", `{` + base + `,"env":["III_ENGINE_TOKEN=t"]}`, "must never be readable inside a VM"},
		{"bad namespace", `{` + base + `,"namespace":"Shop"}`, "namespace"},
		{"http engine url", `{` + strings.Replace(base, `ws://localhost:1`, `http://localhost:1`, 1) + `}`, "must be a ws://"},
		{"config not object", `{` + base + `,"config":"x"}`, `field "config" must be an object`},
		{"config with directory", `{` + base + `,"config":{"file_name":"a/b","content":""}}`, "plain file name"},
		{"config without content", `{` + base + `,"config":{"file_name":"a"}}`, "config.content is required"},
		{"zero cpus", `{` + base + `,"cpus":0}`, "at least 1"},
		{"relative exclude", `{` + base + `,"exclude":["x"]}`, "must be an absolute host path"},
		{"include a path", `{` + base + `,"include":["lib/dist"]}`, "must be a plain name"},
		{"include dot-dot", `{` + base + `,"include":[".."]}`, "must be a plain name"},
		{"include empty", `{` + base + `,"include":[""]}`, "must be a plain name"},
		{"include .iii", `{` + base + `,"include":[".iii"]}`, "never enters a VM"},
		{"include not strings", `{` + base + `,"include":[1]}`, "include"},
		{"include too many", `{` + base + `,"include":[` + strings.TrimSuffix(strings.Repeat(`"dist",`, MaxWorkerInclude+1), ",") + `]}`, "at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeWorkerStartRequest(json.RawMessage(tc.body))
			if tc.want == "" {
				assert.NilError(t, err)
				return
			}
			e := sandboxErr(t, err, S001)
			assert.Check(t, is.Contains(e.Message, "invalid worker::start request"))
			assert.Check(t, is.Contains(e.Message, tc.want))
		})
	}
}

func TestDecodeWorkerOthers(t *testing.T) {
	stop, err := DecodeWorkerStopRequest(json.RawMessage(`{"vm_id":"a"}`))
	assert.NilError(t, err)
	assert.Equal(t, stop.TimeoutMS, DefaultWorkerStopTimeoutMS)
	stop, err = DecodeWorkerStopRequest(json.RawMessage(`{"vm_id":"a","timeout_ms":0}`))
	assert.NilError(t, err)
	assert.Equal(t, stop.TimeoutMS, uint64(0))
	_, err = DecodeWorkerStopRequest(json.RawMessage(`{"vm_id":"a","timeout_ms":600001}`))
	sandboxErr(t, err, S001)

	logs, err := DecodeWorkerLogsRequest(json.RawMessage(`{"vm_id":"a"}`))
	assert.NilError(t, err)
	assert.DeepEqual(t, logs, &WorkerLogsRequest{VMID: "a", Tail: DefaultWorkerLogsTail})
	logs, err = DecodeWorkerLogsRequest(json.RawMessage(`{"vm_id":"a","tail":5,"cursor":0}`))
	assert.NilError(t, err)
	assert.Equal(t, *logs.Cursor, uint64(0))
	_, err = DecodeWorkerLogsRequest(json.RawMessage(`{"vm_id":"a","tail":1001}`))
	sandboxErr(t, err, S001)
	_, err = DecodeWorkerLogsRequest(json.RawMessage(`{"vm_id":"a","cursor":-1}`))
	sandboxErr(t, err, S001)

	_, err = DecodeWorkerStatusRequest(json.RawMessage(`{}`))
	sandboxErr(t, err, S001)
	_, err = DecodeWorkerRemoveRequest(json.RawMessage(`{"vm_id":7}`))
	sandboxErr(t, err, S001)
	_, err = DecodeWorkerListRequest(json.RawMessage(`null`))
	assert.NilError(t, err)
}

// workerDecoders maps each worker op to its decoder, for the fuzz target.
func workerDecoders() map[string]func(json.RawMessage) (any, error) {
	return map[string]func(json.RawMessage) (any, error){
		OpWorkerStart:  func(r json.RawMessage) (any, error) { return unwrap(DecodeWorkerStartRequest(r)) },
		OpWorkerStop:   func(r json.RawMessage) (any, error) { return unwrap(DecodeWorkerStopRequest(r)) },
		OpWorkerStatus: func(r json.RawMessage) (any, error) { return unwrap(DecodeWorkerStatusRequest(r)) },
		OpWorkerList:   func(r json.RawMessage) (any, error) { return unwrap(DecodeWorkerListRequest(r)) },
		OpWorkerLogs:   func(r json.RawMessage) (any, error) { return unwrap(DecodeWorkerLogsRequest(r)) },
		OpWorkerRemove: func(r json.RawMessage) (any, error) { return unwrap(DecodeWorkerRemoveRequest(r)) },
	}
}

// FuzzDecodeWorker drives the worker decoders with arbitrary payloads:
// nothing panics, every refusal is S001, and an accepted request survives
// its own JSON encoding unchanged.
func FuzzDecodeWorker(f *testing.F) {
	ops := WorkerOps()
	seeds := map[string][]string{
		OpWorkerStart:  {fullWorkerStart, `{"vm_id":"a","name":"n","image":"i","host_dir":"/","command":"c","engine_url":"ws://h"}`},
		OpWorkerStop:   {`{"vm_id":"a","timeout_ms":5}`},
		OpWorkerStatus: {`{"vm_id":"a"}`},
		OpWorkerList:   {`{}`},
		OpWorkerLogs:   {`{"vm_id":"a","tail":3,"cursor":9}`},
		OpWorkerRemove: {`{"vm_id":"a.b_c-d"}`},
	}
	for i, op := range ops {
		for _, s := range seeds[op] {
			f.Add(uint8(i), []byte(s))
		}
	}
	dec := workerDecoders()
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		op := ops[int(which)%len(ops)]
		got, err := dec[op](data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code != S001 {
				t.Fatalf("%s: refusal is not S001: %T %v", op, err, err)
			}
			return
		}
		b, err := json.Marshal(got)
		if err != nil {
			t.Fatalf("%s: cannot marshal %#v: %v", op, got, err)
		}
		again, err := dec[op](b)
		if err != nil {
			t.Fatalf("%s: re-encoded request %s refused: %v", op, b, err)
		}
		if diff := cmp.Diff(got, again, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%s: round trip changed the request (-first +second):\n%s", op, diff)
		}
	})
}

func TestWorkerJSON(t *testing.T) {
	b, err := EncodeJSON(WorkerListResponse{})
	assert.NilError(t, err)
	assert.Equal(t, string(b), `{"workers":[]}`)
	b, err = EncodeJSON(WorkerLogsResponse{VMID: "v"})
	assert.NilError(t, err)
	assert.Equal(t, string(b), `{"vm_id":"v","entries":[],"cursor":0,"truncated":false,"more":false}`)

	info := AdapterInfo{Adapter: "a", Contract: Current(), Capabilities: []string{CapabilityWorker}, Facts: map[string]any{"capabilities": "shadowed"}}
	b, err = json.Marshal(info)
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), `"capabilities":["worker"]`))
	var back AdapterInfo
	assert.NilError(t, json.Unmarshal(b, &back))
	assert.Check(t, back.HasCapability(CapabilityWorker))
	assert.Check(t, !back.HasCapability("other"))

	e := UnknownWorker("w1")
	assert.Equal(t, e.Code, S002)
	assert.Check(t, is.Contains(e.FixNote, "worker::list"))
}

// sandboxErr asserts err is a sandbox error of code and returns it.
func sandboxErr(t *testing.T, err error, code Code) *Error {
	t.Helper()
	var e *Error
	assert.Assert(t, errors.As(err, &e), "want a sandbox error %s, got %T: %v", code, err, err)
	assert.Equal(t, e.Code, code, "message: %s", e.Message)
	info, ok := LookupCode(code)
	assert.Assert(t, ok)
	assert.Equal(t, e.Type, info.Type)
	assert.Equal(t, e.Retryable, info.Retryable)
	assert.Equal(t, e.DocsURL, DocsURL(code))
	return e
}
