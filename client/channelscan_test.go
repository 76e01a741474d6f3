package client

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/iii-sandbox/iii/protocol"
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

// The engine's reply, as json.Marshal writes it, is read by the exact
// match; the general scan and encoding/json read the same.
func TestMatchChannelPairs(t *testing.T) {
	type pair = map[string]protocol.StreamChannelRef
	ref := func(id, key, dir string) protocol.StreamChannelRef {
		return protocol.StreamChannelRef{ChannelID: id, AccessKey: key, Direction: dir}
	}
	for _, n := range []int{0, 1, 2, 16} {
		out := make([]pair, n)
		for i := range out {
			id, key := fmt.Sprintf("0f8fad5b-d9cb-469f-a165-70867728950%d", i%10), fmt.Sprintf("7c9e6679-7425-40de-944b-e07fc1f90ae%d", i%10)
			out[i] = pair{"writer": ref(id, key, protocol.DirectionWrite), "reader": ref(id, key, protocol.DirectionRead)}
		}
		raw, err := json.Marshal(map[string]any{"channels": out})
		if err != nil {
			t.Fatal(err)
		}
		got, ok := matchChannelPairs(raw)
		if !ok || len(got) != n {
			t.Fatalf("the engine's reply %s does not take the exact match: %v %d", raw, ok, len(got))
		}
		sameChannelPairs(t, raw)
	}
	// Near misses go to the general scan (sameChannelPairs compares).
	for _, raw := range []string{
		`{"channels":[{"reader":{"channel_id":"a","access_key":"k","direction":"read"},"writer":{"channel_id":"a","access_key":"k","direction":"write"}}]}x`,
		`{"channels":[{"reader":{"channel_id":"a\u0062","access_key":"k","direction":"read"},"writer":{"channel_id":"a","access_key":"k","direction":"write"}}]}`,
		`{"channels":[{"reader":{"channel_id":"a","access_key":"k","direction":"write"},"writer":{"channel_id":"a","access_key":"k","direction":"read"}}]}`,
		`{"channels":[{"reader":{"channel_id":"ÿ","access_key":"k","direction":"read"},"writer":{"channel_id":"a","access_key":"k","direction":"write"}}]}`,
		`{"channels":[{"reader":{"channel_id":"a","access_key":"k","direction":"read"},"writer":{"channel_id":"a","access_key":"k","direction":"write"}},]}`,
	} {
		if _, ok := matchChannelPairs([]byte(raw)); ok {
			t.Fatalf("exact match took %s", raw)
		}
		sameChannelPairs(t, []byte(raw))
	}
}

// dropPayload writes what Call's encoder writes for the same refs.
func TestDropPayload(t *testing.T) {
	type ref struct {
		ChannelID string `json:"channel_id"`
		AccessKey string `json:"access_key"`
	}
	for _, refs := range [][]protocol.StreamChannelRef{
		{{ChannelID: "0f8fad5b-d9cb-469f-a165-708677289501", AccessKey: "7c9e6679-7425-40de-944b-e07fc1f90ae7", Direction: "read"}},
		{{ChannelID: "a", AccessKey: "b"}, {ChannelID: "c<&>", AccessKey: "d"}},
		{{ChannelID: "a\"b", AccessKey: "\n\u2028é"}},
		{},
	} {
		in := make([]ref, len(refs))
		for i, r := range refs {
			in[i] = ref{r.ChannelID, r.AccessKey}
		}
		want, err := marshalValue(map[string]any{"channels": in})
		if err != nil {
			t.Fatal(err)
		}
		got, err := marshalValue(dropPayload(refs))
		if err != nil || string(got) != string(want) {
			t.Fatalf("dropPayload(%v) = %s, %v; want %s", refs, got, err, want)
		}
	}
}
