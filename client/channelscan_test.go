package client

import (
	"encoding/base64"
	"encoding/json"
	"reflect"
	"testing"
)

// The fast read of the engine's channels reply agrees with encoding/json
// whenever it takes a reply.
func sameChannelPairs(t *testing.T, raw []byte) {
	t.Helper()
	got, ok := scanChannelPairs(raw)
	if !ok {
		return
	}
	var out struct {
		Channels []ChannelPair `json:"channels"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("fast path took %q, encoding/json refuses it: %v", raw, err)
	}
	if !reflect.DeepEqual(got, out.Channels) {
		t.Fatalf("for %q:\nfast %#v\njson %#v", raw, got, out.Channels)
	}
}

func TestScanChannelPairs(t *testing.T) {
	common := `{"channels":[{"writer":{"channel_id":"a","access_key":"k","direction":"write"},"reader":{"channel_id":"a","access_key":"k","direction":"read"}},` +
		`{"writer":{"channel_id":"b","access_key":"k2","direction":"write"},"reader":{"channel_id":"b","access_key":"k2","direction":"read"}}]}`
	pairs, ok := scanChannelPairs([]byte(common))
	if !ok || len(pairs) != 2 || pairs[1].Reader.ChannelID != "b" || pairs[0].Writer.Direction != "write" {
		t.Fatalf("the engine's reply does not take the fast path: %v %#v", ok, pairs)
	}
	for _, raw := range []string{common, `{"channels":[]}`, `{"channels":null}`, `{"Channels":[]}`, `{"channels":[null]}`,
		`{"channels":[{"Writer":{"channel_id":"a"}}]}`, `{"channels":[{"writer":{"channel_id":"a"},"writer":{"access_key":"k"}}]}`,
		`{"channels":[{"writer":{"channel_id":null}}]}`, `{"channels":[{"writer":{"channel_id":"\u0061"}}]}`, `{"x":1}`, `[]`} {
		sameChannelPairs(t, []byte(raw))
	}
}

func FuzzScanChannelPairs(f *testing.F) {
	f.Add([]byte(`{"channels":[{"writer":{"channel_id":"a","access_key":"k","direction":"write"},"reader":{"channel_id":"a"}}]}`))
	f.Fuzz(func(t *testing.T, raw []byte) { sameChannelPairs(t, raw) })
}

// channelsPayload writes what encoding/json wrote for the same input.
func TestChannelsPayload(t *testing.T) {
	type spec struct {
		BufferSize int     `json:"buffer_size,omitempty"`
		Content    *string `json:"content,omitempty"`
	}
	for _, specs := range [][]ChannelSpec{
		{{Filled: true, Content: []byte("body")}, {}},
		{{BufferSize: 3, Filled: true}, {BufferSize: -1}},
		{{Filled: true, Content: []byte{0, 0xff, '"'}}},
		{},
	} {
		in := make([]spec, len(specs))
		for i, sp := range specs {
			in[i].BufferSize = sp.BufferSize
			if sp.Filled {
				b64 := base64.StdEncoding.EncodeToString(sp.Content)
				in[i].Content = &b64
			}
		}
		want, _ := json.Marshal(map[string]any{"channels": in})
		got, err := channelsPayload(specs)
		if err != nil || string(got) != string(want) {
			t.Fatalf("channelsPayload(%v) = %s, %v; want %s", specs, got, err, want)
		}
	}
	if _, err := channelsPayload([]ChannelSpec{{Filled: true, Content: make([]byte, MaxChannelContent+1)}}); CodeOf(err) != CodeInvalidArgument {
		t.Fatalf("oversized content: %v", err)
	}
}
