package httpworker

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/iii-sandbox/iii/protocol"
)

// marshalRequestJSON is the encoding/json reference marshalRequest must
// match byte for byte.
func marshalRequestJSON(r Request) []byte {
	body := r.Body
	if len(body) == 0 {
		body = json.RawMessage("null")
	}
	r.Body = nil
	rest, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	rest = bytes.Replace(rest, []byte(`,"body":null`), nil, 1)
	out := append([]byte(`{"body":`), body...)
	out = append(out, ',')
	return append(out, rest[1:]...)
}

func sameRequest(t *testing.T, r Request) {
	t.Helper()
	got, err := marshalRequest(r)
	if err != nil {
		t.Fatal(err)
	}
	if want := marshalRequestJSON(r); !bytes.Equal(got, want) {
		t.Fatalf("marshalRequest differs from encoding/json:\ngot  %s\nwant %s", got, want)
	}
}

func TestMarshalRequestMatchesEncodingJSON(t *testing.T) {
	sameRequest(t, Request{})
	sameRequest(t, Request{Method: "POST", Path: "/a/:id", PathParams: map[string]string{"id": "7", "b": "x"}, QueryParams: map[string]string{},
		Headers: map[string]string{"content-type": "application/json", "x-h": "<a & b>\u2028\u2029\xff\x00\x1f\t\n\r\b\f\"\\é"},
		Body:    json.RawMessage(`{"a":1}`), Trigger: RequestTrigger{Type: "http", Path: "/a/:id", Method: "POST"},
		RequestBody: &protocol.StreamChannelRef{ChannelID: "c", AccessKey: "k", Direction: "read"},
		Response:    &protocol.StreamChannelRef{ChannelID: "d", AccessKey: "k2", Direction: "write"}})
}

func FuzzMarshalRequest(f *testing.F) {
	f.Add("GET", "/x", "k", "v<\u2028\xff", "q", "1", []byte(`[1]`), true)
	f.Fuzz(func(t *testing.T, method, path, k, v, qk, qv string, body []byte, streams bool) {
		r := Request{Method: method, Path: path, PathParams: map[string]string{k: v, v: k}, QueryParams: map[string]string{qk: qv},
			Headers: map[string]string{k + qk: v + qv, "host": path}, Trigger: RequestTrigger{Type: "http", Path: path, Method: method}}
		if json.Valid(body) {
			r.Body = parseBody(body)
		}
		if streams {
			r.RequestBody = &protocol.StreamChannelRef{ChannelID: k, AccessKey: v, Direction: qk}
			r.Response = &protocol.StreamChannelRef{ChannelID: qv, AccessKey: path, Direction: method}
		} else {
			r.PathParams = nil
		}
		sameRequest(t, r)
	})
}

// sameResponse checks that BuildResponse's fast path answers what
// encoding/json's decoding of the envelope answers.
func sameResponse(t *testing.T, out []byte) {
	t.Helper()
	s1, h1, b1, e1 := buildResponse(out, true)
	s2, h2, b2, e2 := buildResponse(out, false)
	if (e1 == nil) != (e2 == nil) || (e1 != nil && e1.Error() != e2.Error()) {
		t.Fatalf("errors differ for %q: %v / %v", out, e1, e2)
	}
	if s1 != s2 || !bytes.Equal(b1, b2) || !reflect.DeepEqual(h1, h2) {
		t.Fatalf("responses differ for %q:\nfast %d %v %q\nslow %d %v %q", out, s1, h1, b1, s2, h2, b2)
	}
}

func TestBuildResponseFastPath(t *testing.T) {
	for _, out := range []string{
		`{"status_code":200,"body":{"name":"Alice"}}`,
		`{"status_code":201,"headers":{"X-A":"1","content-type":"text/plain"},"body":"hi"}`,
		`{"status_code":null}`, `{"headers":null}`, `{"body":null}`, `{"a":1}`, `{}`, `{"Status_Code":204}`,
		`{"status_code":200.0}`, `{"status_code":2e2}`, `{"status_code":"200"}`, `{"status_code":99999999999999999999}`,
		`{"status_code":-0}`, `{"status_code":1000}`, `{"status_code":200,"status_code":null}`, `{"body":1,"body":2}`,
		`{"body":{"x":`, `{"st\u0061tus_code":404}`, `[1]`, `null`, `3`, ` {"status_code" : 202 } `,
	} {
		sameResponse(t, []byte(out))
	}
	_, present, ok := scanEnvelope([]byte(`{"status_code":200,"body":{"name":"Alice"}}`))
	if !present || !ok {
		t.Fatal("the common envelope does not take the fast path")
	}
}

// TestWriteResponseAsBuildResponse: WriteResponse, which adds a result's
// headers to the writer's own map, answers what BuildResponse's status,
// headers and body copied onto the writer answer, headers already set
// (CORS, a Content-Type) included.
func TestWriteResponseAsBuildResponse(t *testing.T) {
	for _, out := range []string{
		`{"status_code":200,"body":{"name":"Alice"}}`,
		`{"status_code":201,"headers":{"X-A":"1","content-type":"text/plain"},"body":"hi"}`,
		`{"headers":["X-B: 2","X-B: 3"],"body":{"a":1}}`, `{"headers":{"X-C":["a","b"]},"body":null}`,
		`{"headers":{"Content-Type":"text/html"},"body":{"a":1}}`, `{"headers":null,"body":"s"}`,
		`{"status_code":204}`, `{"body":null}`, `{}`, `{"a":1}`, `[1]`, `null`, ``, `3`,
		`{"status_code":1000}`, `{"headers":{"Bad Name":"x"}}`, `{"headers":7}`,
	} {
		for _, preset := range []http.Header{{}, {"Access-Control-Allow-Origin": {"*"}, "Vary": {"Origin"}}, {"Content-Type": {"text/x"}}} {
			got := httptest.NewRecorder()
			for k, v := range preset {
				got.Header()[k] = slices.Clone(v)
			}
			gotErr := WriteResponse(got, json.RawMessage(out))

			want := httptest.NewRecorder()
			for k, v := range preset {
				want.Header()[k] = slices.Clone(v)
			}
			status, h, body, wantErr := BuildResponse(json.RawMessage(out))
			if wantErr == nil {
				for k, v := range h {
					want.Header()[k] = append(want.Header()[k], v...)
				}
				want.Header().Set("Content-Length", strconv.Itoa(len(body)))
				want.WriteHeader(status)
				_, _ = want.Write(body)
			}
			if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
				t.Fatalf("%q: errors differ: %v / %v", out, gotErr, wantErr)
			}
			if got.Code != want.Code || !reflect.DeepEqual(got.Header(), want.Header()) || !bytes.Equal(got.Body.Bytes(), want.Body.Bytes()) {
				t.Fatalf("%q with %v:\ngot  %d %v %q\nwant %d %v %q", out, preset, got.Code, got.Header(), got.Body, want.Code, want.Header(), want.Body)
			}
		}
	}
}

func FuzzBuildResponseFastPath(f *testing.F) {
	for _, s := range []string{`{"status_code":200,"body":{"a":1}}`, `{"headers":["A: b"],"body":"x"}`, `{"Body":1}`, `{"status_code":1e3}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, out []byte) { sameResponse(t, out) })
}

// The header-name table holds names as net/http canonicalises them (or it
// would never be hit), and lowerHeaders lower-cases every name, in the
// table or not.
func TestLowerHeaders(t *testing.T) {
	for k, v := range lowerNames {
		if http.CanonicalHeaderKey(k) != k || strings.ToLower(k) != v {
			t.Fatalf("table entry %q → %q", k, v)
		}
	}
	h := http.Header{"Content-Type": {"a"}, "X-Custom-Thing": {"b", "c"}, "Accept": nil}
	got := lowerHeaders(h)
	want := map[string]string{"content-type": "a", "x-custom-thing": "b, c", "accept": ""}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("lowerHeaders = %v", got)
	}
}
