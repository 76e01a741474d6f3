package pluginhost

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterjson"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/protocol"
)

// The engine hands a call's JSON to the adapter untouched and answers with
// the adapter's reply JSON or its error body: the adapter decodes and
// validates the request (package adapterjson, inside the adapter process)
// and reaches the engine's channels through the channel service each
// instance serves it (package adapterrpc).

// engineChannels gives an adapter process the engine's channels. Writers
// (fs::read's stream, progress) count as the host's tasks, so Close waits
// for them; they end with the instance, whose process's connection carries
// them.
type engineChannels struct {
	eng *engine.Engine
	h   *Host
	// owner is what the channels this adapter creates count against
	// (Options.MaxChannels) until the reply carrying one reaches the
	// engine and the channel becomes the caller's connection's
	// (engine.ChargeReplyChannels): one adapter in one namespace, across
	// its processes.
	owner string
}

// channelOwner names m's channels in the engine's table while they are
// the adapter's: from creation until the reply that carries them reaches
// the engine (handler, and the sandbox router), which hands them to the
// caller's connection.
func (m *managed) channelOwner() string { return engine.AdapterChannelOwner(m.key.ns, m.key.adapter) }

var _ adapterjson.Channels = engineChannels{}

func (c engineChannels) OpenReader(ctx context.Context, ref protocol.StreamChannelRef) (io.ReadCloser, error) {
	r, err := c.eng.OpenChannelReader(ref)
	if err != nil {
		return nil, err
	}
	return contextReader{ctx: ctx, r: r}, nil
}

func (c engineChannels) OpenWriter(_ context.Context, ref protocol.StreamChannelRef) (adapterjson.ChannelWriter, error) {
	if !c.h.tasks.Add() {
		return nil, errHostClosed
	}
	w, err := c.eng.OpenChannelWriter(ref)
	if err != nil {
		c.h.tasks.Done()
		return nil, err
	}
	return &taskWriter{ChannelWriter: w, done: c.h.tasks.Done}, nil
}

func (c engineChannels) Create(context.Context) (writer, reader protocol.StreamChannelRef, err error) {
	return c.eng.CreateOwnedChannel(c.owner, c.h.opts.MaxChannels)
}

func (engineChannels) Gone(err error) bool { return errors.Is(err, engine.ErrChannelClosed) }

// taskWriter ends its task when the writer ends.
type taskWriter struct {
	adapterjson.ChannelWriter
	once sync.Once
	done func()
}

func (w *taskWriter) Close() error {
	err := w.ChannelWriter.Close()
	w.once.Do(w.done)
	return err
}

func (w *taskWriter) Abort() {
	w.ChannelWriter.Abort()
	w.once.Do(w.done)
}

// contextReader reads a channel with the call's context, so a stopped
// call does not leave the read blocked.
type contextReader struct {
	ctx context.Context
	r   *engine.ChannelReader
}

func (c contextReader) Read(p []byte) (int, error) { return c.r.ReadContext(c.ctx, p) }

func (c contextReader) Close() error { return c.r.Close() }

// ReadChunk hands the channel's items to the adapter's stream without a
// copy.
func (c contextReader) ReadChunk(max int) ([]byte, error) { return c.r.ReadChunk(c.ctx, max) }

var _ contract.ChunkReader = contextReader{}

// serve forwards one engine call to the adapter and returns its reply or
// its error body as they came.
func (in *instance) serve(ctx context.Context, op string, data json.RawMessage) (json.RawMessage, error) {
	if in.ctx.Err() != nil {
		return nil, in.m.diedError(op, context.Cause(in.ctx)).ErrorBody()
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A crash or a stop ends the call at once, whatever gRPC does.
	stop := context.AfterFunc(in.ctx, cancel)
	defer stop()

	out, body, err := in.adapter.Call(cctx, op, data)
	switch {
	case err == nil && body != nil:
		// The adapter's own error (or the request's S001/S210) goes to
		// the caller as it is.
		return nil, body
	case err == nil:
		return out, nil
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
func (m *managed) handler(op string, in *instance, down *contract.Error) engine.Handler {
	return func(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
		cur, serr := m.admit(ctx, in, down)
		if serr != nil {
			return nil, serr.ErrorBody()
		}
		defer cur.leave()
		out, err := cur.serve(ctx, op, call.Data)
		if err != nil {
			return nil, err
		}
		// A direct caller's (one holding the engine token: the functions
		// are privileged) channels die with its connection; a call through
		// the sandbox router comes from the engine, and the router hands
		// them to its own caller.
		if cerr := m.h.eng.ChargeReplyChannels(m.channelOwner(), call, out); cerr != nil {
			return nil, contract.NewError(contract.S218, "%s: the channel of its reply: %v", op, cerr).ErrorBody()
		}
		return out, nil
	}
}
