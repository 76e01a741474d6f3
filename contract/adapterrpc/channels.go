package adapterrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterjson"
	pb "github.com/iii-sandbox/iii/contract/proto"
	"github.com/iii-sandbox/iii/protocol"
)

// The host serves its channels (the engine's, or MemChannels) to the
// adapter process through go-plugin's broker; inside the adapter,
// brokerChannels is the adapterjson.Channels that reaches them. Bytes
// travel as gRPC stream messages of at most contract.ChunkSize, text
// messages (progress events) as their own messages.

// goneCode is the status of a write whose reader has gone: the adapter's
// side turns it back into errGone, which adapterjson does not log.
const goneCode = codes.Aborted

// errGone is a write that failed because the channel's reader has gone.
var errGone = errors.New("the channel's reader has gone")

// channelServer serves host channels to an adapter.
type channelServer struct {
	pb.UnimplementedChannelsServer
	ch adapterjson.Channels
}

func decodeRef(b []byte) (protocol.StreamChannelRef, error) {
	var ref protocol.StreamChannelRef
	if err := json.Unmarshal(b, &ref); err != nil {
		return ref, status.Errorf(codes.InvalidArgument, "bad channel ref: %v", err)
	}
	return ref, nil
}

func (s *channelServer) Create(ctx context.Context, _ *pb.CreateChannelRequest) (*pb.CreateChannelReply, error) {
	w, r, err := s.ch.Create(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "create a channel: %v", err)
	}
	wb, err := json.Marshal(w)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode a channel ref: %v", err)
	}
	rb, err := json.Marshal(r)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode a channel ref: %v", err)
	}
	return &pb.CreateChannelReply{Writer: wb, Reader: rb}, nil
}

func (s *channelServer) Read(in *pb.ReadChannelRequest, stream grpc.ServerStreamingServer[pb.ChannelData]) error {
	ctx := stream.Context()
	ref, err := decodeRef(in.GetRef())
	if err != nil {
		return err
	}
	r, err := s.ch.OpenReader(ctx, ref)
	if err != nil {
		return status.Error(codes.NotFound, err.Error())
	}
	defer r.Close()
	// The headers tell the opener the read end is open.
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	for {
		// A fresh buffer each time: gRPC may hold a message after Send.
		buf, rerr := nextChunk(r, nil)
		if len(buf) > 0 {
			if err := stream.Send(&pb.ChannelData{Data: buf}); err != nil {
				return err
			}
		}
		switch {
		case rerr == nil:
		case errors.Is(rerr, io.EOF):
			return nil
		case ctx.Err() != nil:
			return status.FromContextError(ctx.Err()).Err()
		default:
			return status.Errorf(codes.DataLoss, "the channel broke off: %v", rerr)
		}
	}
}

// writeStatus is the status of a failed write or close.
func (s *channelServer) writeStatus(err error) error {
	if s.ch.Gone(err) {
		return status.Error(goneCode, err.Error())
	}
	return status.Errorf(codes.Unavailable, "write the channel: %v", err)
}

func (s *channelServer) Write(stream grpc.ClientStreamingServer[pb.ChannelWrite, pb.ChannelWriteReply]) error {
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if first.GetOpen() == nil {
		return status.Error(codes.InvalidArgument, "a channel write must start with the ref to open")
	}
	ref, err := decodeRef(first.GetOpen())
	if err != nil {
		return err
	}
	w, err := s.ch.OpenWriter(ctx, ref)
	if err != nil {
		return status.Error(codes.NotFound, err.Error())
	}
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		w.Abort()
		return err
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if err := w.Close(); err != nil {
				return s.writeStatus(err)
			}
			return stream.SendAndClose(&pb.ChannelWriteReply{})
		}
		if err != nil {
			// The adapter went away mid-stream: the reader must see a
			// broken stream, not a short one.
			w.Abort()
			return err
		}
		switch p := msg.GetPayload().(type) {
		case *pb.ChannelWrite_Data:
			if _, err := w.WriteContext(ctx, p.Data); err != nil {
				w.Abort()
				return s.writeStatus(err)
			}
		case *pb.ChannelWrite_Text:
			if err := w.WriteText(ctx, p.Text); err != nil {
				w.Abort()
				return s.writeStatus(err)
			}
		case *pb.ChannelWrite_Abort:
			w.Abort()
			return stream.SendAndClose(&pb.ChannelWriteReply{})
		default:
			w.Abort()
			return status.Error(codes.InvalidArgument, "a channel write sent a second open")
		}
	}
}

// brokerChannels is adapterjson.Channels inside the adapter: the host's
// channels over the broker connection.
type brokerChannels struct {
	cl pb.ChannelsClient
}

var _ adapterjson.Channels = brokerChannels{}

// channelError turns a failed channel call back into an error adapterjson
// understands.
func channelError(err error) error {
	if status.Code(err) == goneCode {
		return fmt.Errorf("%w: %s", errGone, status.Convert(err).Message())
	}
	if st, ok := status.FromError(err); ok {
		return errors.New(st.Message())
	}
	return err
}

func (c brokerChannels) Create(ctx context.Context) (writer, reader protocol.StreamChannelRef, err error) {
	out, err := c.cl.Create(ctx, &pb.CreateChannelRequest{})
	if err != nil {
		return writer, reader, channelError(err)
	}
	if err := json.Unmarshal(out.GetWriter(), &writer); err != nil {
		return writer, reader, fmt.Errorf("the host sent a bad channel ref: %w", err)
	}
	if err := json.Unmarshal(out.GetReader(), &reader); err != nil {
		return writer, reader, fmt.Errorf("the host sent a bad channel ref: %w", err)
	}
	return writer, reader, nil
}

// opened waits for the server's headers, which it sends once the end is
// open; a stream that ended without them failed to open, and says why in
// its status.
func opened(s grpc.ClientStream, recv func() error) error {
	md, err := s.Header()
	if err != nil {
		return channelError(err)
	}
	if md == nil {
		if err := recv(); err != nil && !errors.Is(err, io.EOF) {
			return channelError(err)
		}
		return errors.New("the host ended the channel stream before opening it")
	}
	return nil
}

func (c brokerChannels) OpenReader(ctx context.Context, ref protocol.StreamChannelRef) (io.ReadCloser, error) {
	b, err := json.Marshal(ref)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	stream, err := c.cl.Read(sctx, &pb.ReadChannelRequest{Ref: b})
	if err != nil {
		cancel()
		return nil, channelError(err)
	}
	if err := opened(stream, func() error { _, err := stream.Recv(); return err }); err != nil {
		cancel()
		return nil, err
	}
	return &brokerReader{stream: stream, cancel: cancel}, nil
}

// brokerReader reads a channel's bytes; a broken stream fails with S218,
// the error of a content stream that broke off.
type brokerReader struct {
	stream grpc.ServerStreamingClient[pb.ChannelData]
	cancel context.CancelFunc
	buf    []byte
	err    error
}

var _ contract.ChunkReader = (*brokerReader)(nil)

func (r *brokerReader) ReadChunk(max int) ([]byte, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return nil, r.err
		}
		msg, err := r.stream.Recv()
		switch {
		case errors.Is(err, io.EOF):
			r.err = io.EOF
		case err != nil:
			r.err = contract.NewError(contract.S218, "the content stream broke off: %s", status.Convert(err).Message())
		default:
			r.buf = msg.GetData()
		}
	}
	n := min(max, len(r.buf))
	out := r.buf[:n:n]
	r.buf = r.buf[n:]
	return out, nil
}

func (r *brokerReader) Read(p []byte) (int, error) {
	b, err := r.ReadChunk(len(p))
	return copy(p, b), err
}

func (r *brokerReader) Close() error {
	r.cancel()
	if r.err == nil {
		r.err = errors.New("channel reader closed")
	}
	return nil
}

// OpenWriter opens the write end. The stream outlives ctx (fs::read
// writes its file after the reply); it ends with Close or Abort, and each
// write is bounded by its own context.
func (c brokerChannels) OpenWriter(ctx context.Context, ref protocol.StreamChannelRef) (adapterjson.ChannelWriter, error) {
	b, err := json.Marshal(ref)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := c.cl.Write(sctx)
	if err != nil {
		cancel()
		return nil, channelError(err)
	}
	w := &brokerWriter{stream: stream, cancel: cancel}
	if err := stream.Send(&pb.ChannelWrite{Payload: &pb.ChannelWrite_Open{Open: b}}); err != nil && !errors.Is(err, io.EOF) {
		cancel()
		return nil, channelError(err)
	}
	stop := context.AfterFunc(ctx, cancel)
	err = opened(stream, func() error { _, err := stream.CloseAndRecv(); return err })
	stop()
	if err != nil {
		cancel()
		return nil, err
	}
	return w, nil
}

// brokerWriter writes one channel. adapterjson uses a writer from one
// goroutine at a time.
type brokerWriter struct {
	stream grpc.ClientStreamingClient[pb.ChannelWrite, pb.ChannelWriteReply]
	cancel context.CancelFunc
	once   sync.Once
	err    error
}

// send sends one message, giving up when ctx ends. gRPC has marshalled
// the message when Send returns, so the caller may reuse its bytes.
func (w *brokerWriter) send(ctx context.Context, m *pb.ChannelWrite) error {
	if w.err != nil {
		return w.err
	}
	stop := context.AfterFunc(ctx, w.cancel)
	err := w.stream.Send(m)
	stop()
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		w.err = ctx.Err()
		return w.err
	}
	if errors.Is(err, io.EOF) {
		// The host ended the stream; its reason comes with the status.
		_, err = w.stream.CloseAndRecv()
	}
	w.err = channelError(err)
	return w.err
}

func (w *brokerWriter) WriteContext(ctx context.Context, p []byte) (int, error) {
	if err := w.send(ctx, &pb.ChannelWrite{Payload: &pb.ChannelWrite_Data{Data: p}}); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *brokerWriter) WriteText(ctx context.Context, s string) error {
	return w.send(ctx, &pb.ChannelWrite{Payload: &pb.ChannelWrite_Text{Text: s}})
}

func (w *brokerWriter) Close() error {
	err := w.err
	w.once.Do(func() {
		defer w.cancel()
		if err != nil {
			return
		}
		if _, cerr := w.stream.CloseAndRecv(); cerr != nil {
			err = channelError(cerr)
		}
	})
	return err
}

func (w *brokerWriter) Abort() {
	w.once.Do(func() {
		defer w.cancel()
		if w.err == nil && w.stream.Send(&pb.ChannelWrite{Payload: &pb.ChannelWrite_Abort{Abort: true}}) == nil {
			_, _ = w.stream.CloseAndRecv()
		}
	})
}

func (brokerChannels) Gone(err error) bool { return errors.Is(err, errGone) }

// nextChunk returns r's next bytes: as they come, without a copy, when r
// is a contract.ChunkReader; else read into buf (a new buffer when buf is
// nil).
func nextChunk(r io.Reader, buf []byte) ([]byte, error) {
	if c, ok := r.(contract.ChunkReader); ok {
		return c.ReadChunk(contract.ChunkSize)
	}
	if buf == nil {
		buf = make([]byte, contract.ChunkSize)
	}
	n, err := r.Read(buf)
	return buf[:n], err
}
