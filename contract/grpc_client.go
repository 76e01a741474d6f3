package contract

import (
	"context"
	"errors"
	"fmt"
	"io"

	pb "github.com/iii-sandbox/iii/contract/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// GRPCClient implements Adapter by calling an adapter's gRPC service. Errors
// it returns are one of:
//
//   - *Error: the adapter answered with a sandbox error;
//   - *ConfigRejectedError: from Configure, the adapter refused its config;
//   - the caller's context error, wrapped, when ctx ended first;
//   - any other error: the adapter could not be reached or broke the
//     protocol. Hosts report those as S301 (adapter not running).
type GRPCClient struct {
	client pb.SandboxAdapterClient
}

var _ Adapter = (*GRPCClient)(nil)

// NewGRPCClient talks to the adapter on conn.
func NewGRPCClient(conn grpc.ClientConnInterface) *GRPCClient {
	return &GRPCClient{client: pb.NewSandboxAdapterClient(conn)}
}

// callOpts lets replies up to MaxMessageBytes through whatever dial options
// the host's gRPC connection has.
func callOpts() []grpc.CallOption {
	return []grpc.CallOption{grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)}
}

// statusError turns a failed call back into the error the adapter returned.
func statusError(ctx context.Context, op string, err error) error {
	if st, ok := status.FromError(err); ok {
		for _, d := range st.Details() {
			if se, ok := d.(*pb.SandboxError); ok {
				return errorFromProto(se)
			}
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("sandbox adapter %s: %w", op, ctx.Err())
	}
	return fmt.Errorf("sandbox adapter %s: %w", op, err)
}

// call runs one unary operation.
func call[Req, PbReq, PbResp, Resp any](ctx context.Context, op string, req *Req, to func(*Req) PbReq,
	rpc func(context.Context, PbReq, ...grpc.CallOption) (PbResp, error), from func(PbResp) Resp,
) (Resp, error) {
	var zero Resp
	out, err := rpc(ctx, to(req), callOpts()...)
	if err != nil {
		return zero, statusError(ctx, op, err)
	}
	return from(out), nil
}

// Info calls adapter::info.
func (c *GRPCClient) Info(ctx context.Context) (*AdapterInfo, error) {
	out, err := c.client.Info(ctx, &pb.InfoRequest{}, callOpts()...)
	if err != nil {
		return nil, statusError(ctx, OpAdapterInfo, err)
	}
	return infoFromProto(out), nil
}

// Configure hands the adapter its configuration.
func (c *GRPCClient) Configure(ctx context.Context, configJSON []byte) error {
	_, err := c.client.Configure(ctx, &pb.ConfigureRequest{ConfigJson: configJSON}, callOpts()...)
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("sandbox adapter configure: %w", ctx.Err())
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		return statusError(ctx, "configure", err)
	}
	rej := &ConfigRejectedError{Reason: st.Message()}
	for _, d := range st.Details() {
		if se, ok := d.(*pb.SandboxError); ok {
			rej.Err = errorFromProto(se)
			rej.Reason = rej.Err.Message
		}
	}
	return rej
}

// Create calls create. When ctx carries a progress sink (WithProgress) it
// calls CreateStream and hands the adapter's progress events to the sink;
// an adapter without CreateStream is called the unary way, without
// progress.
func (c *GRPCClient) Create(ctx context.Context, req *CreateRequest) (*CreateResponse, error) {
	if sink := ProgressFrom(ctx); sink != nil {
		out, err := streamCall(ctx, OpCreate, sink,
			func(ctx context.Context) (grpc.ServerStreamingClient[pb.CreateStreamMessage], error) {
				return c.client.CreateStream(ctx, createRequestToProto(req), callOpts()...)
			},
			func(m *pb.CreateStreamMessage) (*pb.ProgressEvent, *CreateResponse) {
				if r := m.GetResponse(); r != nil {
					return nil, createResponseFromProto(r)
				}
				return m.GetProgress(), nil
			})
		if !errors.Is(err, errStreamUnimplemented) {
			return out, err
		}
	}
	return call(ctx, OpCreate, req, createRequestToProto, c.client.Create, createResponseFromProto)
}

// Exec calls exec.
func (c *GRPCClient) Exec(ctx context.Context, req *ExecRequest) (*ExecResponse, error) {
	return call(ctx, OpExec, req, execRequestToProto, c.client.Exec, execResponseFromProto)
}

// Run calls run, through RunStream when ctx carries a progress sink (see
// Create).
func (c *GRPCClient) Run(ctx context.Context, req *RunRequest) (*RunResponse, error) {
	if sink := ProgressFrom(ctx); sink != nil {
		out, err := streamCall(ctx, OpRun, sink,
			func(ctx context.Context) (grpc.ServerStreamingClient[pb.RunStreamMessage], error) {
				return c.client.RunStream(ctx, runRequestToProto(req), callOpts()...)
			},
			func(m *pb.RunStreamMessage) (*pb.ProgressEvent, *RunResponse) {
				if r := m.GetResponse(); r != nil {
					return nil, runResponseFromProto(r)
				}
				return m.GetProgress(), nil
			})
		if !errors.Is(err, errStreamUnimplemented) {
			return out, err
		}
	}
	return call(ctx, OpRun, req, runRequestToProto, c.client.Run, runResponseFromProto)
}

// errStreamUnimplemented: the adapter predates the streaming RPC; the
// caller falls back to the unary one.
var errStreamUnimplemented = errors.New("the adapter has no streaming variant of this operation")

// streamCall runs a CreateStream/RunStream call: progress messages go to
// sink, the one response message ends the call. split returns a message's
// progress event or its response. An Unimplemented status before any
// message is errStreamUnimplemented, so nothing has happened yet and the
// unary call is safe to make instead.
func streamCall[Msg any, Resp any](ctx context.Context, op string, sink ProgressSink,
	open func(context.Context) (grpc.ServerStreamingClient[Msg], error), split func(*Msg) (*pb.ProgressEvent, *Resp),
) (*Resp, error) {
	sctx, cancel := context.WithCancel(ctx)
	// The server ends the stream right after the response; cancelling
	// releases it without waiting for that.
	defer cancel()
	stream, err := open(sctx)
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return nil, errStreamUnimplemented
		}
		return nil, statusError(ctx, op, err)
	}
	for first := true; ; first = false {
		msg, err := stream.Recv()
		switch {
		case errors.Is(err, io.EOF):
			return nil, fmt.Errorf("sandbox adapter %s: the stream ended without a reply", op)
		case err != nil && first && status.Code(err) == codes.Unimplemented:
			return nil, errStreamUnimplemented
		case err != nil:
			return nil, statusError(ctx, op, err)
		}
		ev, resp := split(msg)
		if resp != nil {
			return resp, nil
		}
		if ev != nil {
			sink(progressEventFromProto(ev))
		}
	}
}

// List calls list.
func (c *GRPCClient) List(ctx context.Context, req *ListRequest) (*ListResponse, error) {
	return call(ctx, OpList, req, func(*ListRequest) *pb.ListRequest { return &pb.ListRequest{} },
		c.client.List, listResponseFromProto)
}

// Stop calls stop.
func (c *GRPCClient) Stop(ctx context.Context, req *StopRequest) (*StopResponse, error) {
	return call(ctx, OpStop, req, stopRequestToProto, c.client.Stop, stopResponseFromProto)
}

// CatalogList calls catalog::list.
func (c *GRPCClient) CatalogList(ctx context.Context, req *CatalogListRequest) (*CatalogListResponse, error) {
	return call(ctx, OpCatalogList, req, func(*CatalogListRequest) *pb.CatalogListRequest { return &pb.CatalogListRequest{} },
		c.client.CatalogList, catalogListResponseFromProto)
}

// FsLs calls fs::ls.
func (c *GRPCClient) FsLs(ctx context.Context, req *FsLsRequest) (*FsLsResponse, error) {
	return call(ctx, OpFsLs, req, fsLsRequestToProto, c.client.FsLs, fsLsResponseFromProto)
}

// FsStat calls fs::stat.
func (c *GRPCClient) FsStat(ctx context.Context, req *FsStatRequest) (*FsEntry, error) {
	return call(ctx, OpFsStat, req, fsStatRequestToProto, c.client.FsStat, fsStatResponseFromProto)
}

// FsMkdir calls fs::mkdir.
func (c *GRPCClient) FsMkdir(ctx context.Context, req *FsMkdirRequest) (*FsMkdirResponse, error) {
	return call(ctx, OpFsMkdir, req, fsMkdirRequestToProto, c.client.FsMkdir, fsMkdirResponseFromProto)
}

// FsRm calls fs::rm.
func (c *GRPCClient) FsRm(ctx context.Context, req *FsRmRequest) (*FsRmResponse, error) {
	return call(ctx, OpFsRm, req, fsRmRequestToProto, c.client.FsRm, fsRmResponseFromProto)
}

// FsChmod calls fs::chmod.
func (c *GRPCClient) FsChmod(ctx context.Context, req *FsChmodRequest) (*FsChmodResponse, error) {
	return call(ctx, OpFsChmod, req, fsChmodRequestToProto, c.client.FsChmod, fsChmodResponseFromProto)
}

// FsMv calls fs::mv.
func (c *GRPCClient) FsMv(ctx context.Context, req *FsMvRequest) (*FsMvResponse, error) {
	return call(ctx, OpFsMv, req, fsMvRequestToProto, c.client.FsMv, fsMvResponseFromProto)
}

// FsGrep calls fs::grep.
func (c *GRPCClient) FsGrep(ctx context.Context, req *FsGrepRequest) (*FsGrepResponse, error) {
	return call(ctx, OpFsGrep, req, fsGrepRequestToProto, c.client.FsGrep, fsGrepResponseFromProto)
}

// FsSed calls fs::sed.
func (c *GRPCClient) FsSed(ctx context.Context, req *FsSedRequest) (*FsSedResponse, error) {
	return call(ctx, OpFsSed, req, fsSedRequestToProto, c.client.FsSed, fsSedResponseFromProto)
}

// FsWrite streams content to the adapter after the request header. When
// content fails mid-way the call is abandoned and the failure reported as
// S218 (the source stream aborted), unless it already is a sandbox error.
func (c *GRPCClient) FsWrite(ctx context.Context, req *FsWriteRequest, content io.Reader) (*FsWriteResponse, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.client.FsWrite(sctx, callOpts()...)
	if err != nil {
		return nil, statusError(ctx, OpFsWrite, err)
	}
	header := &pb.FsWriteChunk{Payload: &pb.FsWriteChunk_Header{Header: fsWriteHeaderToProto(req)}}
	sendErr := stream.Send(header)
	if content == nil {
		content = eofReader{}
	}
	chunks, _ := content.(ChunkReader)
	for sendErr == nil {
		var (
			buf  []byte
			n    int
			rerr error
		)
		if chunks != nil {
			buf, rerr = chunks.ReadChunk(ChunkSize)
			n = len(buf)
		} else {
			// A fresh buffer per chunk: gRPC may still hold the previous
			// message after Send returns.
			buf = make([]byte, ChunkSize)
			n, rerr = io.ReadFull(content, buf)
		}
		if n > 0 {
			sendErr = stream.Send(&pb.FsWriteChunk{Payload: &pb.FsWriteChunk_Data{Data: buf[:n]}})
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			cancel()
			if ctx.Err() != nil {
				return nil, fmt.Errorf("sandbox adapter %s: %w", OpFsWrite, ctx.Err())
			}
			var e *Error
			if errors.As(rerr, &e) {
				return nil, e
			}
			return nil, NewError(S218, "the content for fs::write of %s broke off: %v", req.Path, rerr)
		}
	}
	// io.EOF from Send means the adapter ended the call early; its reason
	// comes with CloseAndRecv.
	if sendErr != nil && !errors.Is(sendErr, io.EOF) {
		return nil, statusError(ctx, OpFsWrite, sendErr)
	}
	out, err := stream.CloseAndRecv()
	if err != nil {
		return nil, statusError(ctx, OpFsWrite, err)
	}
	return fsWriteResponseFromProto(out), nil
}

// ChunkReader is an fs::write content source that hands its bytes over
// without a copy (the plugin host's channel reader is one): FsWrite sends
// each chunk as it comes instead of copying the stream into fresh buffers.
type ChunkReader interface {
	io.Reader
	// ReadChunk returns the stream's next bytes, at least one and at
	// most max, as a slice the caller keeps (gRPC may hold it after Send);
	// at the end of the stream, or when it fails, no bytes and io.EOF or
	// the failure.
	ReadChunk(max int) ([]byte, error)
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// FsRead opens the file's stream and waits for its metadata. The returned
// reader yields the file's bytes; closing it ends the stream.
func (c *GRPCClient) FsRead(ctx context.Context, req *FsReadRequest) (*FsReadMeta, io.ReadCloser, error) {
	sctx, cancel := context.WithCancel(ctx)
	stream, err := c.client.FsRead(sctx, fsReadRequestToProto(req), callOpts()...)
	if err != nil {
		cancel()
		return nil, nil, statusError(ctx, OpFsRead, err)
	}
	first, err := stream.Recv()
	if err != nil {
		cancel()
		if errors.Is(err, io.EOF) {
			return nil, nil, fmt.Errorf("sandbox adapter %s: the stream ended before the file's metadata", OpFsRead)
		}
		return nil, nil, statusError(ctx, OpFsRead, err)
	}
	meta := first.GetMeta()
	if meta == nil {
		cancel()
		return nil, nil, fmt.Errorf("sandbox adapter %s: file data arrived before the file's metadata", OpFsRead)
	}
	return fsReadMetaFromProto(meta), &readBody{ctx: ctx, stream: stream, cancel: cancel}, nil
}

// readBody reads fs::read's data chunks; a failure after the metadata ends
// the reader with the adapter's error.
type readBody struct {
	ctx    context.Context
	stream grpc.ServerStreamingClient[pb.FsReadChunk]
	cancel context.CancelFunc
	buf    []byte
	err    error
}

func (r *readBody) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		msg, err := r.stream.Recv()
		switch {
		case errors.Is(err, io.EOF):
			r.err = io.EOF
		case err != nil:
			r.err = statusError(r.ctx, OpFsRead, err)
		case msg.GetMeta() != nil:
			r.err = fmt.Errorf("sandbox adapter %s: a second metadata message arrived mid-file", OpFsRead)
		default:
			r.buf = msg.GetData()
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// Close ends the stream; reading after Close fails.
func (r *readBody) Close() error {
	r.cancel()
	if r.err == nil {
		r.err = errors.New("fs::read stream closed")
	}
	return nil
}
