package stream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// ClientMessage is what a client sends on the stream socket:
//
//	{"type":"join","data":{"subscriptionId":"s1","streamName":"chat","groupId":"room-1","id":"msg-7"}}
//	{"type":"leave","data":{"subscriptionId":"s1","streamName":"chat","groupId":"room-1"}}
//
// id is optional: without it the subscription covers the whole group.
type ClientMessage struct {
	Type           string // "join" or "leave"
	SubscriptionID string
	StreamName     string
	GroupID        string
	ItemID         *string
}

// errEmptyMessage is a blank frame, which upstream ignores silently.
var errEmptyMessage = errors.New("empty message")

// ParseClientMessage decodes one frame. Every id must be a non-empty UTF-8
// string of at most maxID bytes. It never panics, whatever the input.
func ParseClientMessage(frame []byte, maxID int) (ClientMessage, error) {
	if len(bytes.TrimSpace(frame)) == 0 {
		return ClientMessage{}, errEmptyMessage
	}
	var raw struct {
		Type *string `json:"type"`
		Data *struct {
			SubscriptionID *string `json:"subscriptionId"`
			StreamName     *string `json:"streamName"`
			GroupID        *string `json:"groupId"`
			ID             *string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(frame, &raw); err != nil {
		return ClientMessage{}, fmt.Errorf("not a stream message: %w", err)
	}
	if raw.Type == nil || (*raw.Type != "join" && *raw.Type != "leave") {
		return ClientMessage{}, errors.New(`type must be "join" or "leave"`)
	}
	if raw.Data == nil {
		return ClientMessage{}, errors.New("data is missing")
	}
	m := ClientMessage{Type: *raw.Type}
	for _, f := range []struct {
		name string
		v    *string
		dst  *string
	}{
		{"subscriptionId", raw.Data.SubscriptionID, &m.SubscriptionID},
		{"streamName", raw.Data.StreamName, &m.StreamName},
		{"groupId", raw.Data.GroupID, &m.GroupID},
	} {
		if f.v == nil {
			return ClientMessage{}, fmt.Errorf("data.%s is missing", f.name)
		}
		if err := checkWireID(f.name, *f.v, maxID); err != nil {
			return ClientMessage{}, err
		}
		*f.dst = *f.v
	}
	if raw.Data.ID != nil {
		if err := checkWireID("id", *raw.Data.ID, maxID); err != nil {
			return ClientMessage{}, err
		}
		id := *raw.Data.ID
		m.ItemID = &id
	}
	return m, nil
}

func checkWireID(name, v string, maxID int) error {
	switch {
	case v == "":
		return fmt.Errorf("data.%s is empty", name)
	case len(v) > maxID:
		return fmt.Errorf("data.%s is %d bytes; at most %d are allowed", name, len(v), maxID)
	case !utf8.ValidString(v):
		return fmt.Errorf("data.%s is not valid UTF-8", name)
	}
	return nil
}

// Event is what the worker sends to subscribers and to stream triggers
// (upstream's StreamWrapperMessage): type is always "stream".
type Event struct {
	Type       string          `json:"type"`
	Timestamp  int64           `json:"timestamp"`
	StreamName string          `json:"streamName"`
	GroupID    string          `json:"groupId"`
	ID         *string         `json:"id"`
	Event      json.RawMessage `json:"event"`
}

// The inner event kinds: {"type":"sync"|"create"|"update"|"delete","data":…},
// {"type":"event","event":{"type":…,"data":…}} and {"type":"unauthorized"}.
func dataEvent(kind string, data json.RawMessage) json.RawMessage {
	if data == nil {
		data = json.RawMessage("null")
	}
	b, _ := json.Marshal(struct {
		Type string          `json:"type"`
		Data json.RawMessage `json:"data"`
	}{kind, data})
	return b
}

func customEvent(typ string, data json.RawMessage) json.RawMessage {
	if data == nil {
		data = json.RawMessage("null")
	}
	b, _ := json.Marshal(struct {
		Type  string `json:"type"`
		Event struct {
			Type string          `json:"type"`
			Data json.RawMessage `json:"data"`
		} `json:"event"`
	}{Type: "event", Event: struct {
		Type string          `json:"type"`
		Data json.RawMessage `json:"data"`
	}{typ, data}})
	return b
}

var unauthorizedEvent = json.RawMessage(`{"type":"unauthorized"}`)

// JoinLeave is the payload of stream:join and stream:leave triggers.
type JoinLeave struct {
	SubscriptionID string          `json:"subscription_id"`
	StreamName     string          `json:"stream_name"`
	GroupID        string          `json:"group_id"`
	ID             *string         `json:"id"`
	Context        json.RawMessage `json:"context"`
}
