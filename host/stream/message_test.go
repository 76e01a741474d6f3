package stream

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"gotest.tools/v3/assert"
)

func TestParseClientMessage(t *testing.T) {
	item := "msg-7"
	tests := []struct {
		name  string
		frame string
		want  ClientMessage
		err   string
	}{
		{name: "join group", frame: `{"type":"join","data":{"subscriptionId":"s1","streamName":"chat","groupId":"room-1"}}`,
			want: ClientMessage{Type: "join", SubscriptionID: "s1", StreamName: "chat", GroupID: "room-1"}},
		{name: "join item", frame: `{"type":"join","data":{"subscriptionId":"s1","streamName":"chat","groupId":"room-1","id":"msg-7"}}`,
			want: ClientMessage{Type: "join", SubscriptionID: "s1", StreamName: "chat", GroupID: "room-1", ItemID: &item}},
		{name: "leave with null id", frame: `{"type":"leave","data":{"subscriptionId":"s1","streamName":"chat","groupId":"room-1","id":null}}`,
			want: ClientMessage{Type: "leave", SubscriptionID: "s1", StreamName: "chat", GroupID: "room-1"}},
		{name: "blank", frame: "  \n", err: "empty message"},
		{name: "not json", frame: "not-json", err: "not a stream message"},
		{name: "unknown type", frame: `{"type":"subscribe","data":{}}`, err: `type must be "join" or "leave"`},
		{name: "no data", frame: `{"type":"join"}`, err: "data is missing"},
		{name: "missing group", frame: `{"type":"join","data":{"subscriptionId":"s1","streamName":"chat"}}`, err: "data.groupId is missing"},
		{name: "number id", frame: `{"type":"join","data":{"subscriptionId":1,"streamName":"chat","groupId":"g"}}`, err: "not a stream message"},
		{name: "empty stream", frame: `{"type":"join","data":{"subscriptionId":"s","streamName":"","groupId":"g"}}`, err: "data.streamName is empty"},
		{name: "long id", frame: `{"type":"join","data":{"subscriptionId":"s","streamName":"c","groupId":"g","id":"` + strings.Repeat("x", 300) + `"}}`, err: "data.id is 300 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseClientMessage([]byte(tc.frame), 256)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

// FuzzParseClientMessage: any frame gives a message or an error, never a
// panic, and an accepted message always satisfies the id rules.
func FuzzParseClientMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"join","data":{"subscriptionId":"s1","streamName":"chat","groupId":"room-1","id":"m"}}`,
		`{"type":"leave","data":{"subscriptionId":"s1","streamName":"chat","groupId":"room-1"}}`,
		`{"type":"join","data":null}`,
		`[]`, `null`, `{"type":"join","data":{"subscriptionId":"\u0000","streamName":"\ud800","groupId":"g"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		m, err := ParseClientMessage(frame, 16)
		if err != nil {
			return
		}
		if m.Type != "join" && m.Type != "leave" {
			t.Fatalf("accepted type %q", m.Type)
		}
		ids := []string{m.SubscriptionID, m.StreamName, m.GroupID}
		if m.ItemID != nil {
			ids = append(ids, *m.ItemID)
		}
		for _, id := range ids {
			if id == "" || len(id) > 16 || !utf8.ValidString(id) {
				t.Fatalf("accepted id %q", id)
			}
		}
	})
}

// FuzzUpdateOps: any ops array decodes or is refused, and applying what
// decodes to any value never panics and always encodes.
func FuzzUpdateOps(f *testing.F) {
	f.Add([]byte(`[{"type":"merge","path":["a","b"],"value":{"c":1}},{"type":"increment","path":"n","by":-9223372036854775808}]`), []byte(`{"a":[1]}`))
	f.Add([]byte(`[{"type":"append","value":"x"},{"type":"remove","path":""},{"type":"set","path":"a"}]`), []byte(`"s"`))
	f.Fuzz(func(t *testing.T, opsJSON, value []byte) {
		ops, err := decodeOps(opsJSON)
		if err != nil {
			return
		}
		old, err := decodeValue(value)
		exists := err == nil
		if !exists {
			old = nil
		}
		got, _ := applyOps(old, exists, ops)
		if _, err := json.Marshal(got); err != nil {
			t.Fatalf("result does not encode: %v", err)
		}
	})
}
