package pluginhost

import (
	"context"
	"encoding/json"
	"errors"
	"io"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterjson"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/protocol"
)

// opFunc serves one operation on a running instance: decode the JSON
// request, call the adapter, return the reply to encode. The mapping is
// package adapterjson's, shared with the SDK's WebSocket transport.
type opFunc = adapterjson.OpFunc

// opTable maps each contract operation to its handler. It is built per
// Host, not kept in a package variable.
func opTable() map[string]opFunc { return adapterjson.Ops() }

// engineChannels gives the mapping the engine's channels, in process.
type engineChannels struct{ eng *engine.Engine }

var _ adapterjson.Channels = engineChannels{}

func (c engineChannels) OpenReader(ctx context.Context, ref protocol.StreamChannelRef) (io.ReadCloser, error) {
	r, err := c.eng.OpenChannelReader(ref)
	if err != nil {
		return nil, err
	}
	return contextReader{ctx: ctx, r: r}, nil
}

func (c engineChannels) OpenWriter(_ context.Context, ref protocol.StreamChannelRef) (adapterjson.ChannelWriter, error) {
	w, err := c.eng.OpenChannelWriter(ref)
	if err != nil {
		return nil, err
	}
	return w, nil
}

func (c engineChannels) Create(context.Context) (writer, reader protocol.StreamChannelRef, err error) {
	writer, reader = c.eng.CreateChannel(0)
	return writer, reader, nil
}

func (engineChannels) Gone(err error) bool { return errors.Is(err, engine.ErrChannelClosed) }

// contextReader reads a channel with the call's context, so a stopped
// call does not leave the read blocked.
type contextReader struct {
	ctx context.Context
	r   *engine.ChannelReader
}

func (c contextReader) Read(p []byte) (int, error) { return c.r.ReadContext(c.ctx, p) }

func (c contextReader) Close() error { return c.r.Close() }

// ReadChunk hands the channel's items to fs::write without a copy.
func (c contextReader) ReadChunk(max int) ([]byte, error) { return c.r.ReadChunk(c.ctx, max) }

var _ contract.ChunkReader = contextReader{}

// newTarget is the instance as the mapping serves it: fs::read streams
// end with the instance and count as the host's tasks.
func (in *instance) newTarget() *adapterjson.Target {
	h := in.m.h
	return &adapterjson.Target{
		Adapter:  in.adapter,
		Name:     in.m.key.adapter,
		Channels: engineChannels{eng: h.eng},
		Log:      in.m.log,
		Life:     in.ctx,
		Go: func(f func()) error {
			if !h.tasks.Add() {
				return in.m.diedError(contract.OpFsRead, errHostClosed)
			}
			go func() {
				defer h.tasks.Done()
				f()
			}()
			return nil
		},
	}
}

// serve runs op for one engine call and turns the outcome into the reply
// or the error body callers see.
func (in *instance) serve(ctx context.Context, op string, fn opFunc, data json.RawMessage) (json.RawMessage, error) {
	if in.ctx.Err() != nil {
		return nil, in.m.diedError(op, context.Cause(in.ctx)).ErrorBody()
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A crash or a stop ends the call at once, whatever gRPC does.
	stop := context.AfterFunc(in.ctx, cancel)
	defer stop()

	out, err := fn(cctx, in.target, data)
	if err == nil {
		b, err := contract.EncodeJSON(out)
		if err != nil {
			return nil, contract.NewError(contract.S300, "encode the adapter's %s reply: %v", op, err).ErrorBody()
		}
		return b, nil
	}
	var serr *contract.Error
	switch {
	case errors.As(err, &serr):
		// The adapter's own error (or the request's S001/S210) goes to
		// the caller as it is.
		return nil, serr.ErrorBody()
	case in.ctx.Err() != nil:
		return nil, in.m.diedError(op, context.Cause(in.ctx)).ErrorBody()
	case ctx.Err() != nil:
		// The caller went away; nobody reads this.
		return nil, ctx.Err()
	default:
		// The adapter could not be reached or broke the protocol: as far
		// as the caller is concerned it is not running. Check it now.
		in.poke()
		return nil, contract.NewError(contract.S301, "sandbox adapter %q in namespace %q did not answer %s: %v; the engine checks it and restarts it if it died: retry",
			in.m.key.adapter, in.m.key.ns, op, err).ErrorBody()
	}
}

// handler is the engine handler of op for one publication of the
// adapter: served by a running instance, or answered with down (S301 or
// S302) while it does not run.
func (m *managed) handler(op string, fn opFunc, in *instance, down *contract.Error) engine.Handler {
	return func(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
		cur, serr := m.admit(ctx, in, down)
		if serr != nil {
			return nil, serr.ErrorBody()
		}
		defer cur.leave()
		return cur.serve(ctx, op, fn, call.Data)
	}
}
