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

func TestDecodeEvent(t *testing.T) {
	small := Limits{IDBytes: 8, ValueBytes: 32}
	tests := []struct {
		name, payload, want, err string
	}{
		{name: "create", payload: `{"type":"stream","timestamp":1,"streamName":"chat","groupId":"r1","id":"m1","event":{"type":"create","data":{ "t" : 1 }}}`,
			want: `{"type":"stream","timestamp":1,"streamName":"chat","groupId":"r1","id":"m1","event":{"type":"create","data":{"t":1}}}`},
		{name: "upstream group event, extra fields ignored", payload: `{"type":"stream","timestamp":2,"streamName":"chat","groupId":"r1","id":null,"event":{"type":"sync","data":[]},"x":1}`,
			want: `{"type":"stream","timestamp":2,"streamName":"chat","groupId":"r1","id":null,"event":{"type":"sync","data":[]}}`},
		{name: "custom", payload: `{"type":"stream","timestamp":3,"streamName":"c","groupId":"g","event":{"type":"event","event":{"type":"typing","data":null}}}`,
			want: `{"type":"stream","timestamp":3,"streamName":"c","groupId":"g","id":null,"event":{"type":"event","event":{"type":"typing","data":null}}}`},
		{name: "unauthorized", payload: `{"type":"stream","timestamp":3,"streamName":"c","groupId":"g","event":{"type":"unauthorized"}}`,
			want: `{"type":"stream","timestamp":3,"streamName":"c","groupId":"g","id":null,"event":{"type":"unauthorized"}}`},
		{name: "not json", payload: `not json`, err: "not a stream event"},
		{name: "array", payload: `[]`, err: "not a stream event"},
		{name: "wrong type", payload: `{"type":"queue","timestamp":1,"streamName":"c","groupId":"g","event":{"type":"create","data":1}}`, err: `type must be "stream"`},
		{name: "no timestamp", payload: `{"type":"stream","streamName":"c","groupId":"g","event":{"type":"create","data":1}}`, err: "timestamp is missing"},
		{name: "float timestamp", payload: `{"type":"stream","timestamp":1.5,"streamName":"c","groupId":"g","event":{"type":"create","data":1}}`, err: "not a stream event"},
		{name: "no group", payload: `{"type":"stream","timestamp":1,"streamName":"c","event":{"type":"create","data":1}}`, err: "groupId is missing"},
		{name: "long id", payload: `{"type":"stream","timestamp":1,"streamName":"c","groupId":"g","id":"123456789","event":{"type":"create","data":1}}`, err: "id is 9 bytes"},
		{name: "no event", payload: `{"type":"stream","timestamp":1,"streamName":"c","groupId":"g"}`, err: "event is missing"},
		{name: "unknown kind", payload: `{"type":"stream","timestamp":1,"streamName":"c","groupId":"g","event":{"type":"explode","data":1}}`, err: `event.type "explode"`},
		{name: "no data", payload: `{"type":"stream","timestamp":1,"streamName":"c","groupId":"g","event":{"type":"update"}}`, err: "event.data is missing"},
		{name: "value too large", payload: `{"type":"stream","timestamp":1,"streamName":"c","groupId":"g","event":{"type":"update","data":"` + strings.Repeat("x", 40) + `"}}`, err: "at most 32 are allowed"},
		{name: "custom without type", payload: `{"type":"stream","timestamp":1,"streamName":"c","groupId":"g","event":{"type":"event","event":{"data":1}}}`, err: "event.event must be an object with a type"},
		{name: "oversized", payload: `{"type":"stream","pad":"` + strings.Repeat("x", 32+eventOverhead) + `"}`, err: "the event is"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := DecodeEvent([]byte(tc.payload), small)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			got, err := json.Marshal(ev)
			assert.NilError(t, err)
			assert.Equal(t, string(got), tc.want)
		})
	}
}

// FuzzDecodeEvent: any pub/sub message decodes or is refused, never a
// panic; what decodes keeps the id and value rules and decodes again to
// the same event once encoded (what a client receives is well-formed).
func FuzzDecodeEvent(f *testing.F) {
	for _, s := range []string{
		`{"type":"stream","timestamp":1,"streamName":"chat","groupId":"r1","id":"m1","event":{"type":"create","data":{"t":1}}}`,
		`{"type":"stream","timestamp":-9223372036854775808,"streamName":"c","groupId":"g","id":null,"event":{"type":"event","event":{"type":"x","data":[1,{"a":null}]}}}`,
		`{"type":"stream","timestamp":3,"streamName":"c","groupId":"g","event":{"type":"unauthorized"}}`,
		`{"type":"stream","timestamp":1,"streamName":"\ud800","groupId":"g","event":{"type":"sync","data":"\u0000"}}`,
		`null`, `[]`, `{"event":{"type":"event","event":null}}`,
	} {
		f.Add([]byte(s))
	}
	limits := Limits{IDBytes: 16, ValueBytes: 256}
	f.Fuzz(func(t *testing.T, payload []byte) {
		ev, err := DecodeEvent(payload, limits)
		if err != nil {
			return
		}
		ids := []string{ev.StreamName, ev.GroupID}
		if ev.ID != nil {
			ids = append(ids, *ev.ID)
		}
		for _, id := range ids {
			if id == "" || len(id) > 16 || !utf8.ValidString(id) {
				t.Fatalf("accepted id %q", id)
			}
		}
		enc, err := json.Marshal(ev)
		if err != nil {
			t.Fatalf("accepted event does not encode: %v", err)
		}
		again, err := DecodeEvent(enc, limits)
		if err != nil {
			t.Fatalf("re-encoded event %s refused: %v", enc, err)
		}
		enc2, _ := json.Marshal(again)
		if string(enc) != string(enc2) {
			t.Fatalf("not stable: %s then %s", enc, enc2)
		}
	})
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"redis://localhost:6379":             "redis://localhost:6379",
		"redis://:s3cret@cache:6379/1":       "redis://:xxxxx@cache:6379/1",
		"rediss://default:s3cret@cache:6380": "rediss://default:xxxxx@cache:6380",
		"redis://:s3cret@cache:port":         "redis://xxxxx@cache:port",
		"redis://:s3c@ret@cache:port":        "redis://xxxxx@cache:port",
		"unix:///run/redis.sock":             "unix:///run/redis.sock",
		"::not a url:s3cret@host":            "xxxxx@host",
		"redis://u:p%zz@h":                   "redis://xxxxx@h",
	} {
		assert.Equal(t, RedactURL(in), want, in)
	}
}
