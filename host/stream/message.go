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

// eventOverhead is what an Event adds around its value: ids, timestamp,
// field names and escaping.
const eventOverhead = 16 << 10

// DecodeEvent reads a change event another engine (or this one) published
// on Redis: upstream's StreamWrapperMessage, type "stream", with ids within
// limits and an inner event of a kind this package sends (create, update,
// delete, sync, unauthorized, or a custom event). The inner event is
// re-encoded compact, so what reaches a client is always well-formed. It
// never panics, whatever the input.
func DecodeEvent(payload []byte, limits Limits) (*Event, error) {
	l := limits.withDefaults()
	if len(payload) > l.ValueBytes+eventOverhead {
		return nil, fmt.Errorf("the event is %d bytes; at most %d are allowed", len(payload), l.ValueBytes+eventOverhead)
	}
	var raw struct {
		Type       *string         `json:"type"`
		Timestamp  *int64          `json:"timestamp"`
		StreamName *string         `json:"streamName"`
		GroupID    *string         `json:"groupId"`
		ID         *string         `json:"id"`
		Event      json.RawMessage `json:"event"`
	}
	if err := json.Unmarshal(payload, &raw); err != nil {
		return nil, fmt.Errorf("not a stream event: %w", err)
	}
	if raw.Type == nil || *raw.Type != "stream" {
		return nil, errors.New(`type must be "stream"`)
	}
	if raw.Timestamp == nil {
		return nil, errors.New("timestamp is missing")
	}
	ev := &Event{Type: "stream", Timestamp: *raw.Timestamp}
	for _, f := range []struct {
		name string
		v    *string
		dst  *string
	}{{"streamName", raw.StreamName, &ev.StreamName}, {"groupId", raw.GroupID, &ev.GroupID}} {
		if f.v == nil {
			return nil, fmt.Errorf("%s is missing", f.name)
		}
		if err := l.checkID(f.name, *f.v); err != nil {
			return nil, err
		}
		*f.dst = *f.v
	}
	if raw.ID != nil {
		if err := l.checkID("id", *raw.ID); err != nil {
			return nil, err
		}
		id := *raw.ID
		ev.ID = &id
	}
	inner, err := decodeInnerEvent(raw.Event, l)
	if err != nil {
		return nil, err
	}
	ev.Event = inner
	return ev, nil
}

// decodeInnerEvent checks and re-encodes an Event's event field.
func decodeInnerEvent(b json.RawMessage, l Limits) (json.RawMessage, error) {
	var in struct {
		Type  *string         `json:"type"`
		Data  json.RawMessage `json:"data"`
		Event *struct {
			Type *string         `json:"type"`
			Data json.RawMessage `json:"data"`
		} `json:"event"`
	}
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		return nil, errors.New("event is missing")
	}
	if err := json.Unmarshal(b, &in); err != nil || in.Type == nil {
		return nil, errors.New("event must be an object with a type")
	}
	value := func(d json.RawMessage) (json.RawMessage, error) {
		if d == nil {
			return nil, errors.New("event.data is missing")
		}
		v, err := l.compactValue(d)
		if err != nil {
			return nil, fmt.Errorf("event.data: %w", err)
		}
		return v, nil
	}
	switch kind := *in.Type; kind {
	case "sync", "create", "update", "delete":
		v, err := value(in.Data)
		if err != nil {
			return nil, err
		}
		return dataEvent(kind, v), nil
	case "unauthorized":
		return unauthorizedEvent, nil
	case "event":
		if in.Event == nil || in.Event.Type == nil {
			return nil, errors.New("event.event must be an object with a type")
		}
		if err := l.checkID("event.event.type", *in.Event.Type); err != nil {
			return nil, err
		}
		v, err := value(in.Event.Data)
		if err != nil {
			return nil, err
		}
		return customEvent(*in.Event.Type, v), nil
	default:
		return nil, fmt.Errorf("event.type %q is not sync, create, update, delete, event or unauthorized", truncate([]byte(kind)))
	}
}
