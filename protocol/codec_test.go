package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/golden"
)

func ptr[T any](v T) *T { return &v }

// goldenFrames holds one fully populated frame of every type in the
// catalogue; testdata/<name>.golden is its exact wire form.
func goldenFrames() []struct {
	name string
	msg  Message
} {
	timeout := uint64(1500)
	return []struct {
		name string
		msg  Message
	}{
		{"registerfunction", &RegisterFunction{ID: "math::add", Description: "Add two numbers",
			RequestFormat:  json.RawMessage(`{"type":"object","properties":{"a":{"type":"number"}}}`),
			ResponseFormat: json.RawMessage(`{"type":"number"}`), Metadata: json.RawMessage(`{"owner":"x"}`)}},
		{"registerfunction_http", &RegisterFunction{ID: "hook::post", Invocation: &HTTPInvocationRef{URL: "http://127.0.0.1:8080/hook",
			Method: "POST", TimeoutMS: &timeout, Headers: map[string]string{"x-a": "1"}, Auth: json.RawMessage(`{"type":"bearer","token_key":"T"}`)}}},
		{"unregisterfunction", &UnregisterFunction{ID: "math::add"}},
		{"registertriggertype", &RegisterTriggerType{ID: "cron", Description: "Cron schedules",
			TriggerRequestFormat: json.RawMessage(`{"type":"object"}`), CallRequestFormat: json.RawMessage(`{"type":"object"}`), Namespace: ptr("orders")}},
		{"unregistertriggertype", &UnregisterTriggerType{ID: "cron"}},
		{"registertrigger", &RegisterTrigger{ID: "t-1", TriggerType: "http", FunctionID: "math::add",
			Config: json.RawMessage(`{"api_path":"/math/add","http_method":"POST"}`), Metadata: json.RawMessage(`{"k":"v"}`),
			Namespace: ptr("orders"), TriggerNamespace: ptr("edge")}},
		{"triggerregistrationresult", &TriggerRegistrationResult{ID: "t-1", TriggerType: "http", FunctionID: "math::add",
			Error: &ErrorBody{Code: "trigger_registration_failed", Message: "bad path"}}},
		{"unregistertrigger", &UnregisterTrigger{ID: "t-1", TriggerType: "http"}},
		{"registerservice", &RegisterService{ID: "math", Name: "Math", Description: "Arithmetic", ParentServiceID: "root"}},
		{"invokefunction", &InvokeFunction{InvocationID: "9f3c2a54-1c1d-4c57-8f0e-3d2f1b7a6e90", FunctionID: "math::add",
			Data: json.RawMessage(`{"a":2,"b":3}`), Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			Baggage: "k=v", Metadata: json.RawMessage(`{"trigger":"t-1"}`), Namespace: ptr("orders")}},
		{"invokefunction_void", &InvokeFunction{FunctionID: "engine::workers::register", Data: json.RawMessage(`{"name":"w"}`),
			Action: &TriggerAction{Type: ActionVoid}}},
		{"invokefunction_enqueue", &InvokeFunction{InvocationID: "a1", FunctionID: "job", Action: &TriggerAction{Type: ActionEnqueue, Queue: "jobs"}}},
		{"invocationresult", &InvocationResult{InvocationID: "9f3c2a54-1c1d-4c57-8f0e-3d2f1b7a6e90", FunctionID: "math::add",
			Result: json.RawMessage(`{"c":5}`), Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Baggage: "k=v"}},
		{"invocationresult_error", &InvocationResult{InvocationID: "9f3c", FunctionID: "math::add",
			Error: &ErrorBody{Code: "invocation_failed", Message: "boom", Stacktrace: "Error: boom\n    at add"}}},
		{"ping", &Ping{}},
		{"pong", &Pong{}},
		{"reattach", &Reattach{PreviousWorkerID: "3f9c0000-0000-4000-8000-000000000001", ReattachToken: "tok-123"}},
		{"workerregistered", &WorkerRegistered{WorkerID: "3f9c0000-0000-4000-8000-000000000001", ReattachToken: "tok-123"}},
		{"registrationrejected", &RegistrationRejected{Code: CodeFuncNamespaceConflict, Namespace: "orders", FunctionID: "state::get",
			OwnerWorkerID: "3f9c0000-0000-4000-8000-000000000002"}},
		{"registrationrejected_worker", &RegistrationRejected{Code: CodeWorkerNamespaceConflict, Namespace: "default", WorkerName: "billing"}},
		{"error", &ErrorFrame{Error: ErrorBody{Code: "AUTH_ERROR", Message: "not allowed"}}},
	}
}

func TestGoldenFrames(t *testing.T) {
	seen := map[Type]bool{}
	for _, tc := range goldenFrames() {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Encode(tc.msg)
			assert.NilError(t, err)
			golden.Assert(t, string(b)+"\n", tc.name+".golden")
			seen[tc.msg.MessageType()] = true

			raw := bytes.TrimSpace(golden.Get(t, tc.name+".golden"))
			got, err := Decode(raw)
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.msg)
		})
	}
	for _, typ := range []Type{TypeRegisterFunction, TypeUnregisterFunction, TypeRegisterTriggerType, TypeUnregisterTriggerType,
		TypeRegisterTrigger, TypeTriggerRegistrationResult, TypeUnregisterTrigger, TypeRegisterService, TypeInvokeFunction,
		TypeInvocationResult, TypePing, TypePong, TypeReattach, TypeWorkerRegistered, TypeRegistrationRejected, TypeError} {
		assert.Check(t, seen[typ], "no golden frame for %s", typ)
	}
}

func TestGoldenFilesAreAllUsed(t *testing.T) {
	names := map[string]bool{}
	for _, tc := range goldenFrames() {
		names[tc.name+".golden"] = true
	}
	files, err := filepath.Glob(filepath.Join("testdata", "*.golden"))
	assert.NilError(t, err)
	for _, f := range files {
		assert.Check(t, names[filepath.Base(f)], "stale golden file %s", f)
	}
}

func TestEncodeShape(t *testing.T) {
	cases := []struct {
		name string
		msg  Message
		want string
	}{
		{"type first, absent optionals omitted", &InvokeFunction{FunctionID: "f"}, `{"type":"invokefunction","function_id":"f"}`},
		{"empty message", &Ping{}, `{"type":"ping"}`},
		{"rejection keeps empty owner", &RegistrationRejected{Code: "C", Namespace: "n"}, `{"type":"registrationrejected","code":"C","namespace":"n","owner_worker_id":""}`},
		{"blank namespace is kept, not dropped", &InvokeFunction{FunctionID: "f", Namespace: ptr("")}, `{"type":"invokefunction","function_id":"f","namespace":""}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Encode(tc.msg)
			assert.NilError(t, err)
			assert.Equal(t, string(b), tc.want)
		})
	}
}

func TestDecodeCompat(t *testing.T) {
	cases := []struct {
		name  string
		frame string
		want  Message
	}{
		{"unknown fields ignored", `{"type":"ping","extra":{"deep":[1]}}`, &Ping{}},
		{"null optionals are absent", `{"type":"invokefunction","invocation_id":null,"function_id":"f","namespace":null,"data":null,"metadata":null,"action":null}`,
			&InvokeFunction{FunctionID: "f"}},
		{"type need not be first", `{"function_id":"f","type":"invokefunction"}`, &InvokeFunction{FunctionID: "f"}},
		{"result null is kept", `{"type":"invocationresult","invocation_id":"i","function_id":"f","result":null}`,
			&InvocationResult{InvocationID: "i", FunctionID: "f", Result: json.RawMessage(`null`)}},
		{"node sdk unregistertriggertype carries the whole type", `{"type":"unregistertriggertype","id":"cron","description":"d"}`,
			&UnregisterTriggerType{ID: "cron"}},
		{"fields of other frame types are ignored, whatever their type", `{"type":"invokefunction","function_id":"f","id":0,"result":[],"error":"x","code":false}`,
			&InvokeFunction{FunctionID: "f"}},
		{"registerservice name defaults to empty", `{"type":"registerservice","id":"s"}`, &RegisterService{ID: "s"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode([]byte(tc.frame))
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	cases := []struct {
		name       string
		frame      string
		typ, invID string
		unknown    bool
	}{
		{"not json", `nope`, "", "", false},
		{"not an object", `[1]`, "", "", false},
		{"missing type", `{"invocation_id":"a"}`, "", "a", false},
		{"unknown type", `{"type":"frob","invocation_id":"b"}`, "frob", "b", true},
		{"wrong field type", `{"type":"invokefunction","invocation_id":"c","function_id":5}`, "invokefunction", "c", false},
		{"truncated after the id", `{"type":"invokefunction","invocation_id":"d","data":{"x":`, "invokefunction", "d", false},
		{"id not a string", `{"type":"invokefunction","invocation_id":7}`, "invokefunction", "", false},
		{"error frame without error", `{"type":"error"}`, "error", "", false},
		{"action of the wrong shape", `{"type":"invokefunction","invocation_id":"e","function_id":"f","action":"void"}`, "invokefunction", "e", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.frame))
			var de *DecodeError
			assert.Assert(t, errors.As(err, &de), "%v", err)
			assert.Equal(t, de.Type, tc.typ)
			assert.Equal(t, de.InvocationID, tc.invID)
			assert.Equal(t, errors.Is(err, ErrUnknownType), tc.unknown)
			assert.Check(t, is.Contains(err.Error(), "decode"))
		})
	}
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range goldenFrames() {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Encode(tc.msg)
			assert.NilError(t, err)
			got, err := Decode(b)
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.msg)
			again, err := Encode(got)
			assert.NilError(t, err)
			assert.Equal(t, string(again), string(b))
		})
	}
}

func FuzzDecode(f *testing.F) {
	for _, tc := range goldenFrames() {
		b, err := Encode(tc.msg)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	entries, _ := os.ReadDir("testdata")
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".golden") {
			if b, err := os.ReadFile(filepath.Join("testdata", e.Name())); err == nil {
				f.Add(b)
			}
		}
	}
	for _, s := range []string{`{}`, `{"type":"invokefunction","invocation_id":"x","function_id":5}`, `{"type":"error","error":null}`,
		`{"type":"invocationresult","result":null}`, `{"type":"invokefunction","data":{ "a" : [1, 2] }}`, "\xff", `{"type":"ping"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error is not a *DecodeError: %T %v", err, err)
			}
			return
		}
		// Decode∘Encode is stable: what decodes re-encodes to a frame that
		// decodes to the same thing and re-encodes byte for byte.
		b1, err := Encode(m)
		if err != nil {
			t.Fatalf("encode of a decoded frame failed: %v", err)
		}
		m2, err := Decode(b1)
		if err != nil {
			t.Fatalf("re-decode failed: %v\nframe: %s", err, b1)
		}
		if m2.MessageType() != m.MessageType() {
			t.Fatalf("type changed: %s → %s", m.MessageType(), m2.MessageType())
		}
		b2, err := Encode(m2)
		if err != nil {
			t.Fatalf("re-encode failed: %v", err)
		}
		if !bytes.Equal(b1, b2) {
			t.Fatalf("encoding not stable:\n%s\n%s", b1, b2)
		}
	})
}
