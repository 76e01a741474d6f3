package pluginhost

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/client"
)

func TestStderrTail(t *testing.T) {
	for _, tc := range []struct {
		desc, in, want string
	}{
		{"nothing", "", ""},
		{"plain lines: the last", "starting\nsomething broke\n", "something broke"},
		{"an unterminated last line counts", "a\nhalf a line", "half a line"},
		{"the last error-level hclog line wins", `{"@level":"error","@message":"the adapter could not be created","error":"no kvm"}` + "\n" +
			`{"@level":"info","@message":"adapter exiting","status":1}` + "\n", "the adapter could not be created: no kvm"},
		{"reason field", `{"@level":"error","@message":"configuration rejected; the adapter will exit","reason":"key \"x\": bad"}` + "\n", `configuration rejected; the adapter will exit: key "x": bad`},
		{"broken JSON is a plain line", "{\"@level\":\"error\"\n", `{"@level":"error"`},
		{"invalid UTF-8 is replaced", "bad \xff byte\n", "bad \uFFFD byte"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			var tail stderrTail
			// Written in small pieces, as a pipe may deliver it.
			for i := 0; i < len(tc.in); i += 3 {
				_, _ = tail.Write([]byte(tc.in[i:min(i+3, len(tc.in))]))
			}
			assert.Equal(t, tail.lastError(), tc.want)
		})
	}

	var tail stderrTail
	for i := range 100 {
		_, _ = tail.Write([]byte(strings.Repeat("x", 5000) + string(rune('a'+i%26)) + "\n"))
	}
	assert.Equal(t, len(tail.lines), tailLines, "only the last lines are kept")
	assert.Assert(t, len(tail.lastError()) <= 500+len("…"), "and they are clipped")
}

func FuzzStderrTail(f *testing.F) {
	f.Add([]byte(`{"@level":"error","@message":"m","error":"e"}` + "\n"))
	f.Add([]byte("plain\n\n\xff\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var tail stderrTail
		_, _ = tail.Write(data)
		_ = tail.lastError()
	})
}

func TestCondense(t *testing.T) {
	msg := "Unrecognized remote plugin message: \nFailed to read any lines from plugin's stdout\nThis usually means\n  the plugin was not compiled"
	assert.Equal(t, condense(msg), "Unrecognized remote plugin message: Failed to read any lines from plugin's stdout")
	assert.Equal(t, condense("plugin exited before we could connect"), "plugin exited before we could connect")
}

func TestDecodeAdaptersRequest(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want adaptersRequest
		err  string
	}{
		{`{"adapter":"a"}`, adaptersRequest{Adapter: "a"}, ""},
		{`{"adapter":"a","namespace":"ns","path":"/p","config":{"k":1},"_caller_worker_id":"w"}`,
			adaptersRequest{Adapter: "a", Namespace: "ns", Path: "/p", Config: json.RawMessage(`{"k":1}`)}, ""},
		{`{"adapter":"a","config":null}`, adaptersRequest{Adapter: "a"}, ""},
		{``, adaptersRequest{}, "adapter is required"},
		{`null`, adaptersRequest{}, "adapter is required"},
		{`{}`, adaptersRequest{}, "adapter is required"},
		{`"a"`, adaptersRequest{}, "must be a JSON object"},
		{`{"adapter":1}`, adaptersRequest{}, "adapter must be a string"},
		{`{"adapter":"a","namespace":[]}`, adaptersRequest{}, "namespace must be a string"},
		{`{"adapter":"a","config":"x"}`, adaptersRequest{}, "config must be a JSON object"},
		{`{"adapter":"a"`, adaptersRequest{}, "not valid JSON"},
	} {
		got, err := decodeAdaptersRequest(json.RawMessage(tc.in), true, true)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, "%s", tc.in)
			assert.Equal(t, client.CodeOf(err), CodeInvalidRequest)
			continue
		}
		assert.NilError(t, err, "%s", tc.in)
		assert.DeepEqual(t, got, tc.want)
	}
}

func FuzzDecodeAdaptersRequest(f *testing.F) {
	for _, s := range []string{`{"adapter":"a","config":{}}`, `{"adapter":"a","namespace":"Dev","path":1}`, `[]`, `{"config":{"a":[1,{}]}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := decodeAdaptersRequest(data, true, true)
		if err != nil {
			return
		}
		if req.Adapter == "" {
			t.Fatal("accepted a request without an adapter")
		}
		if req.Config != nil && !json.Valid(req.Config) {
			t.Fatalf("config %q is not JSON", req.Config)
		}
		if _, err := checkNames(req.Adapter, req.Namespace); err == nil && strings.ContainsAny(req.Adapter, "/\\.") {
			t.Fatalf("adapter name %q could escape a directory", req.Adapter)
		}
	})
}

func TestNormConfig(t *testing.T) {
	for in, want := range map[string]string{``: `{}`, `null`: `{}`, ` {"a":1} `: `{"a":1}`} {
		got, err := normConfig(json.RawMessage(in))
		assert.NilError(t, err)
		assert.Equal(t, string(got), want)
	}
	for _, in := range []string{`[]`, `1`, `{`, `"x"`} {
		_, err := normConfig(json.RawMessage(in))
		var eb interface{ Error() string }
		assert.Assert(t, errors.As(err, &eb), "%s", in)
		assert.Equal(t, client.CodeOf(err), CodeInvalidRequest)
	}
}
