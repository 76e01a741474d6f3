package pluginhost

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/protocol"
)

// opFunc serves one operation on a running instance: decode the JSON
// request, call the adapter, return the reply to encode.
type opFunc func(ctx context.Context, in *instance, data json.RawMessage) (any, error)

// unary adapts a decoder and an Adapter method into an opFunc.
func unary[Req, Resp any](decode func(json.RawMessage) (*Req, error), call func(contract.Adapter, context.Context, *Req) (*Resp, error)) opFunc {
	return func(ctx context.Context, in *instance, data json.RawMessage) (any, error) {
		req, err := decode(data)
		if err != nil {
			return nil, err
		}
		return call(in.adapter, ctx, req)
	}
}

// opTable maps each contract operation to its handler. It is built per
// Host, not kept in a package variable.
func opTable() map[string]opFunc {
	return map[string]opFunc{
		contract.OpCreate: withProgress(contract.OpCreate, contract.DecodeCreateRequest,
			func(q *contract.CreateRequest) *protocol.StreamChannelRef { return q.Progress }, contract.Adapter.Create),
		contract.OpExec: unary(contract.DecodeExecRequest, contract.Adapter.Exec),
		contract.OpRun: withProgress(contract.OpRun, contract.DecodeRunRequest,
			func(q *contract.RunRequest) *protocol.StreamChannelRef { return q.Progress }, contract.Adapter.Run),
		contract.OpList:        unary(contract.DecodeListRequest, contract.Adapter.List),
		contract.OpStop:        unary(contract.DecodeStopRequest, contract.Adapter.Stop),
		contract.OpCatalogList: unary(contract.DecodeCatalogListRequest, contract.Adapter.CatalogList),
		contract.OpFsLs:        unary(contract.DecodeFsLsRequest, contract.Adapter.FsLs),
		contract.OpFsStat:      unary(contract.DecodeFsStatRequest, contract.Adapter.FsStat),
		contract.OpFsMkdir:     unary(contract.DecodeFsMkdirRequest, contract.Adapter.FsMkdir),
		contract.OpFsWrite:     fsWrite,
		contract.OpFsRead:      fsRead,
		contract.OpFsRm:        unary(contract.DecodeFsRmRequest, contract.Adapter.FsRm),
		contract.OpFsChmod:     unary(contract.DecodeFsChmodRequest, contract.Adapter.FsChmod),
		contract.OpFsMv:        unary(contract.DecodeFsMvRequest, contract.Adapter.FsMv),
		contract.OpFsGrep:      unary(contract.DecodeFsGrepRequest, contract.Adapter.FsGrep),
		contract.OpFsSed:       unary(contract.DecodeFsSedRequest, contract.Adapter.FsSed),
		contract.OpAdapterInfo: func(ctx context.Context, in *instance, _ json.RawMessage) (any, error) {
			return in.adapter.Info(ctx)
		},
		contract.OpWorkerStart:  workerUnary(contract.DecodeWorkerStartRequest, contract.WorkerAdapter.WorkerStart),
		contract.OpWorkerStop:   workerUnary(contract.DecodeWorkerStopRequest, contract.WorkerAdapter.WorkerStop),
		contract.OpWorkerStatus: workerUnary(contract.DecodeWorkerStatusRequest, contract.WorkerAdapter.WorkerStatus),
		contract.OpWorkerList:   workerUnary(contract.DecodeWorkerListRequest, contract.WorkerAdapter.WorkerList),
		contract.OpWorkerLogs:   workerUnary(contract.DecodeWorkerLogsRequest, contract.WorkerAdapter.WorkerLogs),
		contract.OpWorkerRemove: workerUnary(contract.DecodeWorkerRemoveRequest, contract.WorkerAdapter.WorkerRemove),
	}
}

// progressDrain bounds how long the reply waits for progress events still
// on their way into the caller's channel: a caller that stopped reading
// must not hold the reply up.
const progressDrain = 2 * time.Second

// withProgress adapts create and run. When the request names a progress
// channel, the host takes its write end, hands the adapter a progress sink
// through the context (over gRPC that makes the client use CreateStream or
// RunStream), writes each event into the channel as one JSON text message,
// and closes the channel before the reply goes out, so a caller that reads
// the channel to its end has seen every event before it reads the result.
// The adapter never waits for the caller: events queue in a relay that
// keeps only the latest of a run of same-phase events.
func withProgress[Req, Resp any](op string, decode func(json.RawMessage) (*Req, error), progress func(*Req) *protocol.StreamChannelRef,
	call func(contract.Adapter, context.Context, *Req) (*Resp, error),
) opFunc {
	return func(ctx context.Context, in *instance, data json.RawMessage) (any, error) {
		req, err := decode(data)
		if err != nil {
			return nil, err
		}
		ref := progress(req)
		if ref == nil {
			return call(in.adapter, ctx, req)
		}
		w, err := in.m.h.eng.OpenChannelWriter(*ref)
		if err != nil {
			return nil, contract.NewError(contract.S001, "invalid %s request: the progress channel %s cannot be written: %v"+
				" (pass a ref of a channel you created with engine::channels::create, and read only its other end yourself)",
				contract.RouterFunctionID(op), ref.ChannelID, err)
		}
		relay := contract.NewProgressRelay(func(ctx context.Context, ev contract.ProgressEvent) error {
			b, err := contract.EncodeJSON(ev)
			if err != nil {
				return err
			}
			return w.WriteText(ctx, string(b))
		})
		out, err := call(in.adapter, contract.WithProgress(ctx, relay.Report), req)
		dctx, cancel := context.WithTimeout(ctx, progressDrain)
		relay.Close(dctx)
		cancel()
		if cerr := w.Close(); cerr != nil && !errors.Is(cerr, engine.ErrChannelClosed) {
			in.m.log.Debug("progress channel close", "op", op, "error", cerr)
		}
		return out, err
	}
}

// workerUnary adapts a worker decoder and a WorkerAdapter method. The
// host's gRPC client always has the worker side; the adapter behind it
// answers S300 if it has none (the host publishes worker::* only for
// adapters that announce the capability, so that is a stale caller).
func workerUnary[Req, Resp any](decode func(json.RawMessage) (*Req, error), call func(contract.WorkerAdapter, context.Context, *Req) (*Resp, error)) opFunc {
	return func(ctx context.Context, in *instance, data json.RawMessage) (any, error) {
		req, err := decode(data)
		if err != nil {
			return nil, err
		}
		w, ok := in.adapter.(contract.WorkerAdapter)
		if !ok {
			return nil, contract.NewError(contract.S300, "sandbox adapter %q does not run worker VMs", in.m.key.adapter)
		}
		return call(w, ctx, req)
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

	out, err := fn(cctx, in, data)
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

// contextReader reads a channel with the call's context, so a stopped
// call does not leave the read blocked.
type contextReader struct {
	ctx context.Context
	r   *engine.ChannelReader
}

func (c contextReader) Read(p []byte) (int, error) { return c.r.ReadContext(c.ctx, p) }

// fsWrite feeds the adapter from the request: inline bytes, or the read
// end of a channel the caller streams into.
func fsWrite(ctx context.Context, in *instance, data json.RawMessage) (any, error) {
	req, err := contract.DecodeFsWriteRequest(data)
	if err != nil {
		return nil, err
	}
	var content io.Reader
	if ref := req.Content.Channel; ref != nil {
		r, err := in.m.h.eng.OpenChannelReader(*ref)
		if err != nil {
			return nil, contract.NewError(contract.S210, "invalid sandbox::fs::write request: content channel %s cannot be read: %v"+
				" (pass the reader ref of a channel you created, and take only its writer end yourself)", ref.ChannelID, err)
		}
		defer r.Close()
		content = contextReader{ctx: ctx, r: r}
	} else {
		content = bytes.NewReader(req.Content.Inline)
	}
	req.Content = contract.WriteContent{}
	return in.adapter.FsWrite(ctx, req, content)
}

// fsRead answers with the read end of a new channel and streams the file
// into its write end in the background. A file under the inline limit is
// read first so the reply can carry it as body too; a larger one is never
// held in memory beyond the channel's buffer.
func fsRead(ctx context.Context, in *instance, data json.RawMessage) (any, error) {
	req, err := contract.DecodeFsReadRequest(data)
	if err != nil {
		return nil, err
	}
	h := in.m.h
	// The stream outlives this call: it ends with the instance, when the
	// file is sent, or when the channel goes away.
	sctx, scancel := context.WithCancel(in.ctx)
	// Until the reply is sent, the caller leaving ends the stream too.
	detach := context.AfterFunc(ctx, scancel)
	// abandon ends the stream before any reply; detach drops the hook,
	// which would otherwise live as long as ctx (for socket callers, the
	// lifetime of the adapter's worker).
	abandon := func(body io.Closer) {
		detach()
		if body != nil {
			_ = body.Close()
		}
		scancel()
	}
	meta, body, err := in.adapter.FsRead(sctx, req)
	if err != nil {
		abandon(nil)
		return nil, err
	}
	var prefix []byte
	complete := false
	if meta.Size < contract.InlineBodyLimit {
		prefix, complete, err = readUpTo(ctx, body, contract.InlineBodyLimit)
		if err != nil {
			abandon(body)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, contract.AsError(err, contract.S216)
		}
	}
	if !detach() {
		abandon(body)
		return nil, ctx.Err()
	}
	wref, rref := h.eng.CreateChannel(0)
	w, err := h.eng.OpenChannelWriter(wref)
	if err != nil {
		abandon(body)
		return nil, contract.NewError(contract.S218, "open the channel for fs::read of %s: %v", req.Path, err)
	}
	if !h.tasks.Add() {
		w.Abort()
		abandon(body)
		return nil, in.m.diedError(contract.OpFsRead, errHostClosed)
	}
	go func() {
		defer h.tasks.Done()
		defer scancel()
		defer body.Close()
		in.streamFile(sctx, w, prefix, complete, body, req.Path)
	}()
	resp := &contract.FsReadResponse{Content: rref, Size: meta.Size, Mode: meta.Mode, Mtime: meta.Mtime}
	if complete {
		resp.Body = contract.InlineBody(prefix)
	}
	return resp, nil
}

// readUpTo reads r until EOF or limit bytes. complete is true when EOF came
// first (the whole file is in the returned bytes).
func readUpTo(ctx context.Context, r io.Reader, limit int) (data []byte, complete bool, err error) {
	var buf []byte
	chunk := make([]byte, contract.ChunkSize)
	for len(buf) < limit {
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
		n, err := r.Read(chunk[:min(len(chunk), limit-len(buf))])
		buf = append(buf, chunk[:n]...)
		if errors.Is(err, io.EOF) {
			return buf, true, nil
		}
		if err != nil {
			return nil, false, err
		}
	}
	return buf, false, nil
}

// streamFile writes the already read prefix and then the rest of body
// into the channel. A failure aborts the channel, so the reader sees a
// broken stream rather than a short file.
func (in *instance) streamFile(ctx context.Context, w *engine.ChannelWriter, prefix []byte, complete bool, body io.Reader, path string) {
	fail := func(err error) {
		w.Abort()
		if ctx.Err() == nil && !errors.Is(err, engine.ErrChannelClosed) {
			in.m.log.Warn("fs::read stream broke off", "path", path, "error", err)
		}
	}
	for len(prefix) > 0 {
		n := min(len(prefix), contract.ChunkSize)
		if _, err := w.WriteContext(ctx, prefix[:n]); err != nil {
			fail(err)
			return
		}
		prefix = prefix[n:]
	}
	if !complete {
		buf := make([]byte, contract.ChunkSize)
		for {
			n, err := body.Read(buf)
			if n > 0 {
				if _, werr := w.WriteContext(ctx, buf[:n]); werr != nil {
					fail(werr)
					return
				}
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				fail(fmt.Errorf("read from the adapter: %w", err))
				return
			}
		}
	}
	if err := w.Close(); err != nil && !errors.Is(err, engine.ErrChannelClosed) {
		in.m.log.Debug("fs::read channel close", "path", path, "error", err)
	}
}

// handler is the engine handler of op for one publication of the
// adapter: served by a running instance, or answered with down (S301 or
// S302) while it does not run.
func (m *managed) handler(op string, fn opFunc, in *instance, down *contract.Error) engine.Handler {
	return func(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
		if in == nil {
			return nil, down.ErrorBody()
		}
		return in.serve(ctx, op, fn, call.Data)
	}
}
