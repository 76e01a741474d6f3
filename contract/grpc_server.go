package contract

import (
	"context"
	"errors"
	"io"

	pb "github.com/iii-sandbox/iii/contract/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ChunkSize is the size of the data chunks fs::read and fs::write stream,
// far below gRPC's message limit so a file of any size streams through.
const ChunkSize = 64 << 10

// MaxMessageBytes bounds one gRPC message of the contract. Unary replies can
// be large (10 000 grep matches of 4 KiB lines, a big directory listing), so
// both ends raise gRPC's 4 MiB default to this.
const MaxMessageBytes = 64 << 20

// GRPCServerOptions are the options an adapter's gRPC server needs (pass them
// to go-plugin's ServeConfig.GRPCServer): a receive limit that fits the
// largest request, e.g. an exec with a big stdin, and fixed flow-control
// windows of StreamWindow.
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes),
		grpc.InitialWindowSize(StreamWindow), grpc.InitialConnWindowSize(StreamWindow)}
}

// StreamWindow is the gRPC flow-control window an adapter's server grants
// per stream and per connection, the same as the plugin host grants its
// way. gRPC's default (64 KiB, grown by bandwidth-delay probing) holds one
// fs::write chunk: on a busy machine every chunk then waits for the
// adapter to be scheduled and acknowledge it before the next one leaves
// the engine. A fixed window also turns the probing, and its pings, off.
const StreamWindow = 4 << 20

// GRPCServer serves an Adapter over gRPC: it converts proto requests to the
// contract types, calls the adapter, and converts replies and errors back.
type GRPCServer struct {
	pb.UnimplementedSandboxAdapterServer
	impl Adapter
}

var _ pb.SandboxAdapterServer = (*GRPCServer)(nil)

// NewGRPCServer wraps impl.
func NewGRPCServer(impl Adapter) *GRPCServer { return &GRPCServer{impl: impl} }

// errorStatus turns an adapter failure into a gRPC status. A sandbox error
// travels in the status details with every wire field; the status code is
// not part of the contract. A cancelled or expired call stays a context
// status, so the client reports the caller's own context error.
func errorStatus(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return status.FromContextError(ctx.Err()).Err()
	}
	e := AsError(err, fallbackCode(op))
	st := status.New(codes.FailedPrecondition, e.Message)
	if withDetails, derr := st.WithDetails(errorToProto(e)); derr == nil {
		st = withDetails
	}
	return st.Err()
}

// serve runs one unary operation. A nil reply without an error is an adapter
// bug; it becomes an S-code error instead of a nil dereference.
func serve[Req, Resp, PbResp any](ctx context.Context, op string, req *Req,
	call func(context.Context, *Req) (*Resp, error), to func(*Resp) PbResp,
) (PbResp, error) {
	var zero PbResp
	out, err := call(ctx, req)
	if err != nil {
		return zero, errorStatus(ctx, op, err)
	}
	if out == nil {
		return zero, errorStatus(ctx, op, NewError(fallbackCode(op), "the sandbox adapter returned no %s reply", op))
	}
	return to(out), nil
}

// Info serves adapter::info.
func (s *GRPCServer) Info(ctx context.Context, _ *pb.InfoRequest) (*pb.InfoResponse, error) {
	return serve(ctx, OpAdapterInfo, &struct{}{},
		func(ctx context.Context, _ *struct{}) (*AdapterInfo, error) { return s.impl.Info(ctx) }, infoToProto)
}

// Configure hands the adapter its configuration. A rejection keeps the
// adapter's reason as the status message; a sandbox error also rides along.
func (s *GRPCServer) Configure(ctx context.Context, in *pb.ConfigureRequest) (*pb.ConfigureResponse, error) {
	err := s.impl.Configure(ctx, in.GetConfigJson())
	if err == nil {
		return &pb.ConfigureResponse{}, nil
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	var e *Error
	if errors.As(err, &e) {
		st := status.New(codes.InvalidArgument, e.Message)
		if withDetails, derr := st.WithDetails(errorToProto(e)); derr == nil {
			st = withDetails
		}
		return nil, st.Err()
	}
	return nil, status.Error(codes.InvalidArgument, err.Error())
}

// Create serves create.
func (s *GRPCServer) Create(ctx context.Context, in *pb.CreateRequest) (*pb.CreateResponse, error) {
	return serve(ctx, OpCreate, createRequestFromProto(in), s.impl.Create, createResponseToProto)
}

// Exec serves exec.
func (s *GRPCServer) Exec(ctx context.Context, in *pb.ExecRequest) (*pb.ExecResponse, error) {
	return serve(ctx, OpExec, execRequestFromProto(in), s.impl.Exec, execResponseToProto)
}

// Run serves run.
func (s *GRPCServer) Run(ctx context.Context, in *pb.RunRequest) (*pb.RunResponse, error) {
	return serve(ctx, OpRun, runRequestFromProto(in), s.impl.Run, runResponseToProto)
}

// CreateStream serves create with progress: the adapter's progress
// reports stream out as they happen, then the reply.
func (s *GRPCServer) CreateStream(in *pb.CreateRequest, stream grpc.ServerStreamingServer[pb.CreateStreamMessage]) error {
	return serveWithProgress(stream.Context(), OpCreate, createRequestFromProto(in), s.impl.Create,
		func(ev *pb.ProgressEvent) error {
			return stream.Send(&pb.CreateStreamMessage{Payload: &pb.CreateStreamMessage_Progress{Progress: ev}})
		},
		func(out *CreateResponse) error {
			return stream.Send(&pb.CreateStreamMessage{Payload: &pb.CreateStreamMessage_Response{Response: createResponseToProto(out)}})
		})
}

// RunStream serves run with progress (see CreateStream).
func (s *GRPCServer) RunStream(in *pb.RunRequest, stream grpc.ServerStreamingServer[pb.RunStreamMessage]) error {
	return serveWithProgress(stream.Context(), OpRun, runRequestFromProto(in), s.impl.Run,
		func(ev *pb.ProgressEvent) error {
			return stream.Send(&pb.RunStreamMessage{Payload: &pb.RunStreamMessage_Progress{Progress: ev}})
		},
		func(out *RunResponse) error {
			return stream.Send(&pb.RunStreamMessage{Payload: &pb.RunStreamMessage_Response{Response: runResponseToProto(out)}})
		})
}

// serveWithProgress runs an operation with a progress sink in its context.
// Reports go out through a relay, so a slow stream never holds the
// adapter up; every report is sent before the reply, which the relay's
// Close guarantees by ending its goroutine before the reply is sent (a
// stream allows one sender at a time).
func serveWithProgress[Req, Resp any](ctx context.Context, op string, req *Req,
	call func(context.Context, *Req) (*Resp, error), sendProgress func(*pb.ProgressEvent) error, sendReply func(*Resp) error,
) error {
	relay := NewProgressRelay(func(_ context.Context, ev ProgressEvent) error {
		// Send gives up when the stream ends, which is what bounds it.
		return sendProgress(progressEventToProto(ev))
	})
	out, err := call(WithProgress(ctx, relay.Report), req)
	relay.Close(ctx)
	if err != nil {
		return errorStatus(ctx, op, err)
	}
	if out == nil {
		return errorStatus(ctx, op, NewError(fallbackCode(op), "the sandbox adapter returned no %s reply", op))
	}
	return sendReply(out)
}

// List serves list.
func (s *GRPCServer) List(ctx context.Context, _ *pb.ListRequest) (*pb.ListResponse, error) {
	return serve(ctx, OpList, &ListRequest{}, s.impl.List, listResponseToProto)
}

// Stop serves stop.
func (s *GRPCServer) Stop(ctx context.Context, in *pb.StopRequest) (*pb.StopResponse, error) {
	return serve(ctx, OpStop, stopRequestFromProto(in), s.impl.Stop, stopResponseToProto)
}

// CatalogList serves catalog::list.
func (s *GRPCServer) CatalogList(ctx context.Context, _ *pb.CatalogListRequest) (*pb.CatalogListResponse, error) {
	return serve(ctx, OpCatalogList, &CatalogListRequest{}, s.impl.CatalogList, catalogListResponseToProto)
}

// FsLs serves fs::ls.
func (s *GRPCServer) FsLs(ctx context.Context, in *pb.FsLsRequest) (*pb.FsLsResponse, error) {
	return serve(ctx, OpFsLs, fsLsRequestFromProto(in), s.impl.FsLs, fsLsResponseToProto)
}

// FsStat serves fs::stat.
func (s *GRPCServer) FsStat(ctx context.Context, in *pb.FsStatRequest) (*pb.FsStatResponse, error) {
	return serve(ctx, OpFsStat, fsStatRequestFromProto(in), s.impl.FsStat, fsStatResponseToProto)
}

// FsMkdir serves fs::mkdir.
func (s *GRPCServer) FsMkdir(ctx context.Context, in *pb.FsMkdirRequest) (*pb.FsMkdirResponse, error) {
	return serve(ctx, OpFsMkdir, fsMkdirRequestFromProto(in), s.impl.FsMkdir, fsMkdirResponseToProto)
}

// FsRm serves fs::rm.
func (s *GRPCServer) FsRm(ctx context.Context, in *pb.FsRmRequest) (*pb.FsRmResponse, error) {
	return serve(ctx, OpFsRm, fsRmRequestFromProto(in), s.impl.FsRm, fsRmResponseToProto)
}

// FsChmod serves fs::chmod.
func (s *GRPCServer) FsChmod(ctx context.Context, in *pb.FsChmodRequest) (*pb.FsChmodResponse, error) {
	return serve(ctx, OpFsChmod, fsChmodRequestFromProto(in), s.impl.FsChmod, fsChmodResponseToProto)
}

// FsMv serves fs::mv.
func (s *GRPCServer) FsMv(ctx context.Context, in *pb.FsMvRequest) (*pb.FsMvResponse, error) {
	return serve(ctx, OpFsMv, fsMvRequestFromProto(in), s.impl.FsMv, fsMvResponseToProto)
}

// FsGrep serves fs::grep.
func (s *GRPCServer) FsGrep(ctx context.Context, in *pb.FsGrepRequest) (*pb.FsGrepResponse, error) {
	return serve(ctx, OpFsGrep, fsGrepRequestFromProto(in), s.impl.FsGrep, fsGrepResponseToProto)
}

// FsSed serves fs::sed.
func (s *GRPCServer) FsSed(ctx context.Context, in *pb.FsSedRequest) (*pb.FsSedResponse, error) {
	return serve(ctx, OpFsSed, fsSedRequestFromProto(in), s.impl.FsSed, fsSedResponseToProto)
}

// FsWrite serves fs::write: the header first, then the adapter reads the
// file's bytes straight off the stream as they arrive.
func (s *GRPCServer) FsWrite(stream grpc.ClientStreamingServer[pb.FsWriteChunk, pb.FsWriteResponse]) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return errorStatus(ctx, OpFsWrite, NewError(S210, "the fs::write stream ended before its header"))
		}
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return errorStatus(ctx, OpFsWrite, NewError(S210, "the fs::write stream must start with its header"))
	}
	out, err := s.impl.FsWrite(ctx, fsWriteHeaderFromProto(h), &writeBody{stream: stream})
	if err != nil {
		return errorStatus(ctx, OpFsWrite, err)
	}
	if out == nil {
		return errorStatus(ctx, OpFsWrite, NewError(S216, "the sandbox adapter returned no fs::write reply"))
	}
	return stream.SendAndClose(fsWriteResponseToProto(out))
}

// writeBody is the io.Reader an adapter's FsWrite reads: the data chunks
// after the header, until the client closes its side.
type writeBody struct {
	stream grpc.ClientStreamingServer[pb.FsWriteChunk, pb.FsWriteResponse]
	buf    []byte
	err    error
}

func (w *writeBody) Read(p []byte) (int, error) {
	for len(w.buf) == 0 {
		if w.err != nil {
			return 0, w.err
		}
		msg, err := w.stream.Recv()
		switch {
		case errors.Is(err, io.EOF):
			w.err = io.EOF
		case err != nil:
			// The sender went away mid-file: a transient failure the
			// caller may retry.
			w.err = NewError(S218, "the fs::write content stream broke off: %v", status.Convert(err).Message())
		case msg.GetHeader() != nil:
			w.err = NewError(S210, "the fs::write stream sent a second header")
		default:
			w.buf = msg.GetData()
		}
	}
	n := copy(p, w.buf)
	w.buf = w.buf[n:]
	return n, nil
}

// FsRead serves fs::read: the metadata first, then the file in chunks. A
// read error after some data has gone out still reaches the client, as the
// stream's final status.
func (s *GRPCServer) FsRead(in *pb.FsReadRequest, stream grpc.ServerStreamingServer[pb.FsReadChunk]) error {
	ctx := stream.Context()
	meta, body, err := s.impl.FsRead(ctx, fsReadRequestFromProto(in))
	if err != nil {
		if body != nil {
			_ = body.Close()
		}
		return errorStatus(ctx, OpFsRead, err)
	}
	if body == nil || meta == nil {
		if body != nil {
			_ = body.Close()
		}
		return errorStatus(ctx, OpFsRead, NewError(S216, "the sandbox adapter returned no fs::read reply"))
	}
	defer body.Close()
	if err := stream.Send(&pb.FsReadChunk{Payload: &pb.FsReadChunk_Meta{Meta: fsReadMetaToProto(meta)}}); err != nil {
		return err
	}
	for {
		// A fresh buffer per chunk: gRPC may still hold the previous
		// message after Send returns.
		buf := make([]byte, ChunkSize)
		n, rerr := io.ReadFull(body, buf)
		if n > 0 {
			if err := stream.Send(&pb.FsReadChunk{Payload: &pb.FsReadChunk_Data{Data: buf[:n]}}); err != nil {
				return err
			}
		}
		switch {
		case rerr == nil:
		case errors.Is(rerr, io.EOF), errors.Is(rerr, io.ErrUnexpectedEOF):
			return nil
		default:
			return errorStatus(ctx, OpFsRead, rerr)
		}
	}
}
