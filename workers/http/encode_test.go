package httpworker

import (
	"bytes"
	"encoding/json"
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
