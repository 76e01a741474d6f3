package contract

import (
	"io"

	"google.golang.org/grpc"
)

// Sizes the engine↔adapter transport (package adapterrpc) shares with the
// mapping that feeds it (package adapterjson).

// ChunkSize is the size of the data chunks fs::read and fs::write stream
// through a channel, far below gRPC's message limit so a file of any size
// streams through.
const ChunkSize = 64 << 10

// MaxMessageBytes bounds one gRPC message of the transport. Replies can be
// large (10 000 grep matches of 4 KiB lines, a big directory listing), so
// both ends raise gRPC's 4 MiB default to this.
const MaxMessageBytes = 64 << 20

// StreamWindow is the gRPC flow-control window both ends grant per stream
// and per connection. gRPC's default (64 KiB, grown by bandwidth-delay
// probing) holds one chunk: on a busy machine every chunk then waits for
// the other process to be scheduled and acknowledge it before the next one
// leaves. A fixed window also turns the probing, and its pings, off.
const StreamWindow = 4 << 20

// GRPCServerOptions are the options a gRPC server of the transport needs:
// a receive limit that fits the largest request (an exec with a big
// stdin), and fixed flow-control windows of StreamWindow.
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes),
		grpc.InitialWindowSize(StreamWindow), grpc.InitialConnWindowSize(StreamWindow)}
}

// GRPCDialOptions are the client side of GRPCServerOptions.
func GRPCDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithInitialWindowSize(StreamWindow), grpc.WithInitialConnWindowSize(StreamWindow),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes))}
}

// ChunkReader is a channel reader that hands its bytes over without a
// copy (the engine's channel reader is one): the transport sends each
// chunk as it comes instead of copying the stream into fresh buffers.
type ChunkReader interface {
	io.Reader
	// ReadChunk returns the stream's next bytes, at least one and at
	// most max, as a slice the caller keeps (gRPC may hold it after Send);
	// at the end of the stream, or when it fails, no bytes and io.EOF or
	// the failure.
	ReadChunk(max int) ([]byte, error)
}
