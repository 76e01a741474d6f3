package sdktest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/iii-sandbox/iii/contract"
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

// AdapterCaller is a Caller (with Channels) that calls a contract.Adapter
// directly, doing what the engine's plugin host does between the JSON of a
// call and the adapter: decode and validate the request with package
// contract's decoders, call the adapter, encode the reply, and send
// errors through their wire form. Channels are kept in memory. Use it to
// run the suite against an adapter in-process, or over go-plugin with the
// contract's GRPCClient as the adapter (see StartPlugin).
type AdapterCaller struct {
	a contract.Adapter

	mu       sync.Mutex
	channels map[string]*memChannel
}

var (
	_ Caller   = (*AdapterCaller)(nil)
	_ Channels = (*AdapterCaller)(nil)
)

type memChannel struct {
	key  string
	data []byte
}

// NewAdapterCaller serves calls with a.
func NewAdapterCaller(a contract.Adapter) *AdapterCaller {
	return &AdapterCaller{a: a, channels: map[string]*memChannel{}}
}

// Call implements Caller.
func (c *AdapterCaller) Call(ctx context.Context, op string, payload any) (json.RawMessage, error) {
	raw, err := marshalPayload(payload)
	if err != nil {
		return nil, err
	}
	out, err := c.dispatch(ctx, op, raw)
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

func (c *AdapterCaller) dispatch(ctx context.Context, op string, raw json.RawMessage) (any, error) {
	switch op {
	case contract.OpAdapterInfo:
		return c.a.Info(ctx)
	case contract.OpCreate:
		return call(ctx, raw, contract.DecodeCreateRequest, c.a.Create)
	case contract.OpExec:
		return call(ctx, raw, contract.DecodeExecRequest, c.a.Exec)
	case contract.OpRun:
		return call(ctx, raw, contract.DecodeRunRequest, c.a.Run)
	case contract.OpList:
		return call(ctx, raw, contract.DecodeListRequest, c.a.List)
	case contract.OpStop:
		return call(ctx, raw, contract.DecodeStopRequest, c.a.Stop)
	case contract.OpCatalogList:
		return call(ctx, raw, contract.DecodeCatalogListRequest, c.a.CatalogList)
	case contract.OpFsLs:
		return call(ctx, raw, contract.DecodeFsLsRequest, c.a.FsLs)
	case contract.OpFsStat:
		return call(ctx, raw, contract.DecodeFsStatRequest, c.a.FsStat)
	case contract.OpFsMkdir:
		return call(ctx, raw, contract.DecodeFsMkdirRequest, c.a.FsMkdir)
	case contract.OpFsRm:
		return call(ctx, raw, contract.DecodeFsRmRequest, c.a.FsRm)
	case contract.OpFsChmod:
		return call(ctx, raw, contract.DecodeFsChmodRequest, c.a.FsChmod)
	case contract.OpFsMv:
		return call(ctx, raw, contract.DecodeFsMvRequest, c.a.FsMv)
	case contract.OpFsGrep:
		return call(ctx, raw, contract.DecodeFsGrepRequest, c.a.FsGrep)
	case contract.OpFsSed:
		return call(ctx, raw, contract.DecodeFsSedRequest, c.a.FsSed)
	case contract.OpFsWrite:
		return c.fsWrite(ctx, raw)
	case contract.OpFsRead:
		return c.fsRead(ctx, raw)
	case contract.OpPause, contract.OpResume:
		p, ok := c.a.(contract.PauseAdapter)
		if !ok {
			return nil, contract.PauseUnsupported("", op)
		}
		if op == contract.OpPause {
			return call(ctx, raw, contract.DecodePauseRequest, p.Pause)
		}
		return call(ctx, raw, contract.DecodeResumeRequest, p.Resume)
	}
	return nil, fmt.Errorf("unknown sandbox operation %q", op)
}

func call[Req, Resp any](ctx context.Context, raw json.RawMessage,
	decode func(json.RawMessage) (*Req, error), op func(context.Context, *Req) (*Resp, error),
) (any, error) {
	req, err := decode(raw)
	if err != nil {
		return nil, err
	}
	out, err := op(ctx, req)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *AdapterCaller) fsWrite(ctx context.Context, raw json.RawMessage) (any, error) {
	req, err := contract.DecodeFsWriteRequest(raw)
	if err != nil {
		return nil, err
	}
	var content io.Reader = bytes.NewReader(req.Content.Inline)
	if ref := req.Content.Channel; ref != nil {
		data, err := c.take(ref)
		if err != nil {
			return nil, err
		}
		content = bytes.NewReader(data)
	}
	req.Content = contract.WriteContent{}
	return c.a.FsWrite(ctx, req, content)
}

func (c *AdapterCaller) fsRead(ctx context.Context, raw json.RawMessage) (any, error) {
	req, err := contract.DecodeFsReadRequest(raw)
	if err != nil {
		return nil, err
	}
	meta, body, err := c.a.FsRead(ctx, req)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	data, err := io.ReadAll(body)
	if err != nil {
		return nil, contract.AsError(err, contract.S218)
	}
	ref := c.put(data)
	return &contract.FsReadResponse{
		Content: ref,
		Body:    contract.InlineBody(data),
		Size:    meta.Size,
		Mode:    meta.Mode,
		Mtime:   meta.Mtime,
	}, nil
}

func randomHex() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// put keeps data as a channel and returns its read end.
func (c *AdapterCaller) put(data []byte) protocol.StreamChannelRef {
	ref := protocol.StreamChannelRef{ChannelID: randomHex(), AccessKey: randomHex(), Direction: protocol.DirectionRead}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.channels[ref.ChannelID] = &memChannel{key: ref.AccessKey, data: data}
	return ref
}

// take hands out a channel's data once, as a real channel would.
func (c *AdapterCaller) take(ref *protocol.StreamChannelRef) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.channels[ref.ChannelID]
	if !ok || ch.key != ref.AccessKey {
		return nil, contract.NewError(contract.S218, "channel %s is unknown or was already read", ref.ChannelID)
	}
	delete(c.channels, ref.ChannelID)
	return ch.data, nil
}

// ReadChannel implements Channels.
func (c *AdapterCaller) ReadChannel(_ context.Context, ref protocol.StreamChannelRef) ([]byte, error) {
	return c.take(&ref)
}

// WriteChannel implements Channels.
func (c *AdapterCaller) WriteChannel(_ context.Context, data []byte) (protocol.StreamChannelRef, error) {
	return c.put(bytes.Clone(data)), nil
}
