package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterjson"
	"github.com/iii-sandbox/iii/contract/adapterrpc"
	"github.com/iii-sandbox/iii/protocol"
)

// Caller sends one sandbox operation to an adapter the way callers of the
// engine do: op is the operation name without prefix ("exec",
// "fs::write", "adapter::info"), payload is marshalled to JSON, and the
// reply comes back as JSON. A sandbox failure must be returned as a
// *contract.Error parsed from the wire (contract.FromErrorBody or
// contract.ParseWire); any other error means the adapter could not be
// reached.
type Caller interface {
	Call(ctx context.Context, op string, payload any) (json.RawMessage, error)
}

// Channels is implemented by Callers that can carry file contents through
// streaming channels, as the engine does: fs::read always answers with the
// read end of a channel in "content", and fs::write accepts one instead of
// inline content. The suite tests large files through channels only when
// the Caller implements Channels.
type Channels interface {
	// ReadChannel returns all the bytes written to the channel whose
	// read end ref is.
	ReadChannel(ctx context.Context, ref protocol.StreamChannelRef) ([]byte, error)
	// WriteChannel makes a channel carrying data and returns its read
	// end, to pass as fs::write's content.
	WriteChannel(ctx context.Context, data []byte) (protocol.StreamChannelRef, error)
}

// AdapterCaller is a Caller (with Channels) that runs the calls exactly
// as the engine's transports do. Over go-plugin (NewAdapterCaller of the
// *adapterrpc.Client that StartPlugin dispenses) it hands the call's JSON
// to the adapter process, where package adapterjson decodes, validates
// and serves it, and the process reaches this caller's channels through
// the plugin's channel service. In process (NewAdapterCaller of any other
// contract.Adapter) it runs adapterjson itself. Either way the channels
// are kept in memory (adapterrpc.MemChannels).
type AdapterCaller struct {
	call func(ctx context.Context, op string, raw json.RawMessage) (json.RawMessage, error)
	ch   *adapterrpc.MemChannels
}

var (
	_ Caller   = (*AdapterCaller)(nil)
	_ Channels = (*AdapterCaller)(nil)
)

// NewAdapterCaller serves calls with a.
func NewAdapterCaller(a contract.Adapter) *AdapterCaller {
	if c, ok := a.(*adapterrpc.Client); ok {
		if mem, ok := c.Channels().(*adapterrpc.MemChannels); ok {
			return &AdapterCaller{ch: mem, call: func(ctx context.Context, op string, raw json.RawMessage) (json.RawMessage, error) {
				out, body, err := c.Call(ctx, op, raw)
				if err != nil {
					return nil, err
				}
				if body != nil {
					if e, ok := contract.FromErrorBody(body); ok {
						return nil, e
					}
					return nil, fmt.Errorf("the adapter answered %s with an error that is not a sandbox error: %s", op, body.Message)
				}
				return out, nil
			}}
		}
	}
	mem := adapterrpc.NewMemChannels()
	target := &adapterjson.Target{Adapter: a, Channels: mem}
	ops := adapterjson.Ops()
	return &AdapterCaller{ch: mem, call: func(ctx context.Context, op string, raw json.RawMessage) (json.RawMessage, error) {
		fn, ok := ops[op]
		if !ok {
			return nil, fmt.Errorf("unknown sandbox operation %q", op)
		}
		out, err := fn(ctx, target, raw)
		if err != nil {
			var se *contract.Error
			if !errors.As(err, &se) {
				return nil, err
			}
			// Through the wire form and back, so callers see exactly what
			// crosses the engine.
			parsed, ok := contract.FromErrorBody(se.ErrorBody())
			if !ok {
				return nil, fmt.Errorf("sandbox error %s did not survive its wire form: %s", se.Code, se.ToWire())
			}
			return nil, parsed
		}
		return contract.EncodeJSON(out)
	}}
}

// Call implements Caller.
func (c *AdapterCaller) Call(ctx context.Context, op string, payload any) (json.RawMessage, error) {
	raw, err := marshalPayload(payload)
	if err != nil {
		return nil, err
	}
	return c.call(ctx, op, raw)
}

func marshalPayload(payload any) (json.RawMessage, error) {
	switch p := payload.(type) {
	case nil:
		return json.RawMessage("{}"), nil
	case json.RawMessage:
		return p, nil
	case []byte:
		return json.RawMessage(p), nil
	}
	return json.Marshal(payload)
}

// ReadChannel implements Channels. A channel can be read once, as a real
// channel.
func (c *AdapterCaller) ReadChannel(ctx context.Context, ref protocol.StreamChannelRef) ([]byte, error) {
	r, err := c.ch.OpenReader(ctx, ref)
	if err != nil {
		return nil, contract.NewError(contract.S218, "channel %s is unknown or was already read: %v", ref.ChannelID, err)
	}
	defer r.Close()
	return io.ReadAll(r)
}

// WriteChannel implements Channels.
func (c *AdapterCaller) WriteChannel(_ context.Context, data []byte) (protocol.StreamChannelRef, error) {
	return c.ch.Fill(bytes.Clone(data)), nil
}
