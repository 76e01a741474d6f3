package stream

import (
	"bytes"
	"context"
	"encoding/json"
	"unicode/utf8"
)

// Backends (docs/stream.md's adapter.name).
const (
	// BackendKV is the built-in store (Store): this engine's items, this
	// engine's subscribers.
	BackendKV = "kv"
	// BackendRedis keeps the items in Redis and carries the change events
	// over its pub/sub, so several engines on one Redis share both.
	BackendRedis = "redis"
)

// backend is where a worker keeps its items and how its change events
// reach the socket subscribers. Every method validates its ids and values
// against the worker's Limits, and answers *protocol.ErrorBody errors with
// this package's codes.
type backend interface {
	// Set stores data as the item; old is nil when it was created, stored
	// is data as kept (compact JSON).
	Set(ctx context.Context, streamName, groupID, itemID string, data json.RawMessage) (old, stored json.RawMessage, err error)
	// Get returns the item's value, nil when there is none.
	Get(ctx context.Context, streamName, groupID, itemID string) (json.RawMessage, error)
	// Delete removes the item and returns its value (nil: there was none).
	Delete(ctx context.Context, streamName, groupID, itemID string) (json.RawMessage, error)
	// List returns the group's values ([] when it has none).
	List(ctx context.Context, streamName, groupID string) ([]json.RawMessage, error)
	// Groups returns the stream's group ids, sorted ([] when none).
	Groups(ctx context.Context, streamName string) ([]string, error)
	// All returns every stream with its sorted groups, sorted by id.
	All(ctx context.Context) ([]Meta, error)
	// Update applies ops to the item atomically (creating it when
	// missing), with applyOps' semantics.
	Update(ctx context.Context, streamName, groupID, itemID string, ops []UpdateOp) (old, updated json.RawMessage, errs []OpError, err error)
	// Publish hands a change event to the socket subscribers: the kv
	// backend delivers it here and now; Redis publishes it, and every
	// engine on that Redis, this one included, delivers it when it comes
	// back from the subscription, so it is delivered once per engine.
	Publish(ctx context.Context, ev *Event) error
	// Where describes the backend for the log (never a password).
	Where() string
	// Close releases the backend (the kv store saves what changed).
	Close() error
}

// kvBackend is the built-in store with in-process delivery.
type kvBackend struct {
	*Store
	deliver func(*Event)
}

var _ backend = kvBackend{}

func (b kvBackend) Publish(_ context.Context, ev *Event) error {
	b.deliver(ev)
	return nil
}

func (b kvBackend) Where() string {
	if p := b.Path(); p != "" {
		return p
	}
	return "in memory"
}

// checkID validates one id: not empty, at most IDBytes, UTF-8.
func (l Limits) checkID(what, id string) error {
	switch {
	case id == "":
		return errorf(CodeInvalidInput, "%s is empty", what)
	case len(id) > l.IDBytes:
		return errorf(CodeInvalidInput, "%s is %d bytes; at most %d are allowed", what, len(id), l.IDBytes)
	case !utf8.ValidString(id):
		return errorf(CodeInvalidInput, "%s is not valid UTF-8", what)
	}
	return nil
}

func (l Limits) checkGroup(streamName, groupID string) error {
	if err := l.checkID("stream_name", streamName); err != nil {
		return err
	}
	return l.checkID("group_id", groupID)
}

func (l Limits) checkKey(streamName, groupID, itemID string) error {
	if err := l.checkGroup(streamName, groupID); err != nil {
		return err
	}
	return l.checkID("item_id", itemID)
}

// compactValue validates and compacts a value against ValueBytes.
func (l Limits) compactValue(v json.RawMessage) (json.RawMessage, error) {
	if len(v) > 4*l.ValueBytes {
		return nil, errorf(CodeValueTooLarge, "the value is over %d bytes; store smaller items", l.ValueBytes)
	}
	var b bytes.Buffer
	if err := json.Compact(&b, v); err != nil {
		return nil, errorf(CodeInvalidInput, "the value is not JSON: %v", err)
	}
	if b.Len() > l.ValueBytes {
		return nil, errorf(CodeValueTooLarge, "the value is %d bytes as compact JSON; at most %d are allowed per item", b.Len(), l.ValueBytes)
	}
	return b.Bytes(), nil
}
