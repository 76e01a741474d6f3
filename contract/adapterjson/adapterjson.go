// Package adapterjson is the one mapping between iii's JSON calls of
// <adapter>::<op> and a contract.Adapter: decode and validate the request,
// call the adapter, and move the bytes of fs::write, fs::read and the
// progress of create/run through the engine's streaming channels.
//
// Two transports use it: the engine's plugin host (host/pluginhost), which
// serves a go-plugin child's functions inside the engine, and the SDK's
// WebSocket transport (plugins/sdk), which serves a remote adapter's
// functions as an ordinary worker. Each reaches the channels its own way:
// the engine in process, the worker through the Go client (package
// client). Channels is the small interface both provide.
//
// The package does not turn an outcome into a wire reply: the plugin host
// knows when its child died (S301), a remote adapter does not. Encode
// the reply with contract.EncodeJSON and an error with
// (*contract.Error).ErrorBody.
package adapterjson

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/protocol"
)

// Channels opens the engine's streaming channels for the mapping.
type Channels interface {
	// OpenReader opens the read end ref names. Reads end when ctx ends.
	OpenReader(ctx context.Context, ref protocol.StreamChannelRef) (io.ReadCloser, error)
	// OpenWriter opens the write end ref names.
	OpenWriter(ctx context.Context, ref protocol.StreamChannelRef) (ChannelWriter, error)
	// Create makes a new channel with the engine's default buffer.
	Create(ctx context.Context) (writer, reader protocol.StreamChannelRef, err error)
	// Gone reports whether err only says that the other end has gone
	// (the reader stopped reading): not worth a log line.
	Gone(err error) bool
}

// ChannelWriter is the write end of a channel: binary bytes, text
// messages (progress events), a normal end, and an abort that tells the
// reader the stream broke (where the transport can say so).
type ChannelWriter interface {
	WriteContext(ctx context.Context, p []byte) (int, error)
	WriteText(ctx context.Context, s string) error
	Close() error
	Abort()
}

// Target is one adapter as the mapping serves it.
type Target struct {
	// Adapter serves the operations.
	Adapter contract.Adapter
	// Name is the adapter's name, for messages.
	Name string
	// Channels reaches the engine's channels.
	Channels Channels
	// Log receives what is worth knowing and nobody else sees (a stream
	// that broke off). Nil means none.
	Log hclog.Logger
	// Life bounds the streams fs::read leaves running after its reply:
	// they end with it. Nil means context.Background().
	Life context.Context
	// Go runs fs::read's stream in the background. An error refuses it
	// (the host is closing) and is returned as the call's error. Nil runs
	// a plain goroutine.
	Go func(func()) error
}

func (t *Target) log() hclog.Logger {
	if t.Log == nil {
		return hclog.NewNullLogger()
	}
	return t.Log
}

func (t *Target) life() context.Context {
	if t.Life == nil {
		return context.Background()
	}
	return t.Life
}

func (t *Target) spawn(f func()) error {
	if t.Go == nil {
		go f()
		return nil
	}
	return t.Go(f)
}

// OpFunc serves one operation: decode the JSON request, call the adapter,
// return the reply to encode.
type OpFunc func(ctx context.Context, t *Target, data json.RawMessage) (any, error)

// Ops maps every operation the mapping serves (contract.Ops(),
// adapter::info and contract.WorkerOps()) to its function. It returns a
// new map on each call.
func Ops() map[string]OpFunc {
	return map[string]OpFunc{
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
		contract.OpFsWrite:     FsWrite,
		contract.OpFsRead:      FsRead,
		contract.OpFsRm:        unary(contract.DecodeFsRmRequest, contract.Adapter.FsRm),
		contract.OpFsChmod:     unary(contract.DecodeFsChmodRequest, contract.Adapter.FsChmod),
		contract.OpFsMv:        unary(contract.DecodeFsMvRequest, contract.Adapter.FsMv),
		contract.OpFsGrep:      unary(contract.DecodeFsGrepRequest, contract.Adapter.FsGrep),
		contract.OpFsSed:       unary(contract.DecodeFsSedRequest, contract.Adapter.FsSed),
		contract.OpAdapterInfo: func(ctx context.Context, t *Target, _ json.RawMessage) (any, error) {
			return t.Adapter.Info(ctx)
		},
		contract.OpWorkerStart:  workerUnary(contract.DecodeWorkerStartRequest, contract.WorkerAdapter.WorkerStart),
		contract.OpWorkerStop:   workerUnary(contract.DecodeWorkerStopRequest, contract.WorkerAdapter.WorkerStop),
		contract.OpWorkerStatus: workerUnary(contract.DecodeWorkerStatusRequest, contract.WorkerAdapter.WorkerStatus),
		contract.OpWorkerList:   workerUnary(contract.DecodeWorkerListRequest, contract.WorkerAdapter.WorkerList),
		contract.OpWorkerLogs:   workerUnary(contract.DecodeWorkerLogsRequest, contract.WorkerAdapter.WorkerLogs),
		contract.OpWorkerRemove: workerUnary(contract.DecodeWorkerRemoveRequest, contract.WorkerAdapter.WorkerRemove),
		contract.OpPause:        pauseUnary(contract.OpPause, contract.DecodePauseRequest, contract.PauseAdapter.Pause),
		contract.OpResume:       pauseUnary(contract.OpResume, contract.DecodeResumeRequest, contract.PauseAdapter.Resume),
	}
}

// pauseUnary adapts sandbox::pause or sandbox::resume: an adapter without
// PauseAdapter answers S006.
func pauseUnary[Req any](op string, decode func(json.RawMessage) (*Req, error), call func(contract.PauseAdapter, context.Context, *Req) (*contract.SandboxStatus, error)) OpFunc {
	return func(ctx context.Context, t *Target, data json.RawMessage) (any, error) {
		p, ok := t.Adapter.(contract.PauseAdapter)
		if !ok {
			return nil, contract.PauseUnsupported(t.Name, op)
		}
		req, err := decode(data)
		if err != nil {
			return nil, err
		}
		return call(p, ctx, req)
	}
}

// unary adapts a decoder and an Adapter method into an OpFunc.
func unary[Req, Resp any](decode func(json.RawMessage) (*Req, error), call func(contract.Adapter, context.Context, *Req) (*Resp, error)) OpFunc {
	return func(ctx context.Context, t *Target, data json.RawMessage) (any, error) {
		req, err := decode(data)
		if err != nil {
			return nil, err
		}
		return call(t.Adapter, ctx, req)
	}
}

// ProgressDrain bounds how long the reply waits for progress events still
// on their way into the caller's channel: a caller that stopped reading
// must not hold the reply up.
const ProgressDrain = 2 * time.Second

// withProgress adapts create and run. When the request names a progress
// channel, the mapping takes its write end, hands the adapter a progress
// sink through the context (over gRPC that makes the client use
// CreateStream or RunStream), writes each event into the channel as one
// JSON text message, and closes the channel before the reply goes out, so
// a caller that reads the channel to its end has seen every event before
// it reads the result. The adapter never waits for the caller: events
// queue in a relay that keeps only the latest of a run of same-phase
// events.
func withProgress[Req, Resp any](op string, decode func(json.RawMessage) (*Req, error), progress func(*Req) *protocol.StreamChannelRef,
	call func(contract.Adapter, context.Context, *Req) (*Resp, error),
) OpFunc {
	return func(ctx context.Context, t *Target, data json.RawMessage) (any, error) {
		req, err := decode(data)
		if err != nil {
			return nil, err
		}
		ref := progress(req)
		if ref == nil {
			return call(t.Adapter, ctx, req)
		}
		w, err := t.Channels.OpenWriter(ctx, *ref)
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
		out, err := call(t.Adapter, contract.WithProgress(ctx, relay.Report), req)
		dctx, cancel := context.WithTimeout(ctx, ProgressDrain)
		relay.Close(dctx)
		cancel()
		if cerr := w.Close(); cerr != nil && !t.Channels.Gone(cerr) {
			t.log().Debug("progress channel close", "op", op, "error", cerr)
		}
		return out, err
	}
}

// workerUnary adapts a worker decoder and a WorkerAdapter method; an
// adapter without the worker side answers S300.
func workerUnary[Req, Resp any](decode func(json.RawMessage) (*Req, error), call func(contract.WorkerAdapter, context.Context, *Req) (*Resp, error)) OpFunc {
	return func(ctx context.Context, t *Target, data json.RawMessage) (any, error) {
		req, err := decode(data)
		if err != nil {
			return nil, err
		}
		w, ok := t.Adapter.(contract.WorkerAdapter)
		if !ok {
			return nil, contract.NewError(contract.S300, "sandbox adapter %q does not run worker VMs", t.Name)
		}
		return call(w, ctx, req)
	}
}

// FsWrite feeds the adapter from the request: inline bytes, or the read
// end of a channel the caller streams into.
func FsWrite(ctx context.Context, t *Target, data json.RawMessage) (any, error) {
	req, err := contract.DecodeFsWriteRequest(data)
	if err != nil {
		return nil, err
	}
	var content io.Reader
	if ref := req.Content.Channel; ref != nil {
		r, err := t.Channels.OpenReader(ctx, *ref)
		if err != nil {
			return nil, contract.NewError(contract.S210, "invalid sandbox::fs::write request: content channel %s cannot be read: %v"+
				" (pass the reader ref of a channel you created, and take only its writer end yourself)", ref.ChannelID, err)
		}
		defer r.Close()
		content = r
	} else {
		content = bytes.NewReader(req.Content.Inline)
	}
	req.Content = contract.WriteContent{}
	return t.Adapter.FsWrite(ctx, req, content)
}

// FsRead answers with the read end of a new channel and streams the file
// into its write end in the background. A file under the inline limit is
// read first so the reply can carry it as body too; a larger one is never
// held in memory beyond the channel's buffer.
func FsRead(ctx context.Context, t *Target, data json.RawMessage) (any, error) {
	req, err := contract.DecodeFsReadRequest(data)
	if err != nil {
		return nil, err
	}
	// The stream outlives this call: it ends with t.Life, when the file
	// is sent, or when the channel goes away.
	sctx, scancel := context.WithCancel(t.life())
	// Until the reply is sent, the caller leaving ends the stream too.
	detach := context.AfterFunc(ctx, scancel)
	// abandon ends the stream before any reply; detach drops the hook,
	// which would otherwise live as long as ctx.
	abandon := func(body io.Closer) {
		detach()
		if body != nil {
			_ = body.Close()
		}
		scancel()
	}
	meta, body, err := t.Adapter.FsRead(sctx, req)
	if err != nil {
		abandon(nil)
		return nil, err
	}
	var prefix []byte
	complete := false
	if meta.Size < contract.InlineBodyLimit {
		prefix, complete, err = ReadUpTo(ctx, body, contract.InlineBodyLimit)
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
	wref, rref, err := t.Channels.Create(ctx)
	if err != nil {
		abandon(body)
		return nil, contract.NewError(contract.S218, "create the channel for fs::read of %s: %v", req.Path, err)
	}
	w, err := t.Channels.OpenWriter(ctx, wref)
	if err != nil {
		abandon(body)
		return nil, contract.NewError(contract.S218, "open the channel for fs::read of %s: %v", req.Path, err)
	}
	if err := t.spawn(func() {
		defer scancel()
		defer body.Close()
		t.streamFile(sctx, w, prefix, complete, body, req.Path)
	}); err != nil {
		w.Abort()
		abandon(body)
		return nil, err
	}
	resp := &contract.FsReadResponse{Content: rref, Size: meta.Size, Mode: meta.Mode, Mtime: meta.Mtime}
	if complete {
		resp.Body = contract.InlineBody(prefix)
	}
	return resp, nil
}

// ReadUpTo reads r until EOF or limit bytes. complete is true when EOF
// came first (the whole file is in the returned bytes).
func ReadUpTo(ctx context.Context, r io.Reader, limit int) (data []byte, complete bool, err error) {
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
// broken stream rather than a short file (where the transport can say so).
func (t *Target) streamFile(ctx context.Context, w ChannelWriter, prefix []byte, complete bool, body io.Reader, path string) {
	fail := func(err error) {
		w.Abort()
		if ctx.Err() == nil && !t.Channels.Gone(err) {
			t.log().Warn("fs::read stream broke off", "path", path, "error", err)
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
	if err := w.Close(); err != nil && !t.Channels.Gone(err) {
		t.log().Debug("fs::read channel close", "path", path, "error", err)
	}
}
