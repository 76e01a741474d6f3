package adapterrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterjson"
	pb "github.com/iii-sandbox/iii/contract/proto"
	"github.com/iii-sandbox/iii/protocol"
)

// server is the adapter side of Invoke: adapterjson's mapping against the
// adapter, with the host's channels reached through the broker. Requests
// are decoded and validated here, once, by the contract's decoders.
type server struct {
	pb.UnimplementedSandboxAdapterServer
	impl   contract.Adapter
	name   string
	log    hclog.Logger
	broker *plugin.GRPCBroker
	ops    map[string]adapterjson.OpFunc

	mu      sync.Mutex
	targets map[uint32]*adapterjson.Target
	conns   []*grpc.ClientConn
	closed  bool
}

var _ pb.SandboxAdapterServer = (*server)(nil)

func newServer(impl contract.Adapter, name string, log hclog.Logger, broker *plugin.GRPCBroker) *server {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &server{impl: impl, name: name, log: log, broker: broker, ops: adapterjson.Ops(), targets: map[uint32]*adapterjson.Target{}}
}

// target is the adapter as adapterjson serves it with the channels of the
// host's broker service id. The connection is dialled at the first call
// that names id, and kept: a host serves one channel service per client.
func (s *server) target(id uint32) *adapterjson.Target {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.targets[id]; t != nil {
		return t
	}
	lc := &lazyChannels{s: s, id: id}
	t := &adapterjson.Target{Adapter: s.impl, Name: s.name, Channels: lc, Log: s.log}
	s.targets[id] = t
	if s.broker != nil && id != 0 {
		// go-plugin's broker keeps the service's address for five
		// seconds after the host started it, right before this call:
		// dial now, not when an operation first opens a channel. A
		// failure is reported then.
		go func() { _, _ = lc.get() }()
	}
	return t
}

// dial connects to the host's channel service id.
func (s *server) dial(id uint32) (pb.ChannelsClient, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, errors.New("the adapter's plugin server is closing")
	case s.broker == nil || id == 0:
		return nil, errors.New("the host serves no channels on this connection")
	}
	conn, err := s.broker.DialWithOptions(id, contract.GRPCDialOptions()...)
	if err != nil {
		return nil, fmt.Errorf("dial the host's channels (broker id %d): %w", id, err)
	}
	s.conns = append(s.conns, conn)
	return pb.NewChannelsClient(conn), nil
}

// lazyChannels dials the host's channel service at first use.
type lazyChannels struct {
	s  *server
	id uint32

	mu sync.Mutex
	ch *brokerChannels
}

func (l *lazyChannels) get() (*brokerChannels, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ch != nil {
		return l.ch, nil
	}
	cl, err := l.s.dial(l.id)
	if err != nil {
		return nil, err
	}
	l.ch = &brokerChannels{cl: cl}
	return l.ch, nil
}

func (l *lazyChannels) OpenReader(ctx context.Context, ref protocol.StreamChannelRef) (io.ReadCloser, error) {
	ch, err := l.get()
	if err != nil {
		return nil, err
	}
	return ch.OpenReader(ctx, ref)
}

func (l *lazyChannels) OpenWriter(ctx context.Context, ref protocol.StreamChannelRef) (adapterjson.ChannelWriter, error) {
	ch, err := l.get()
	if err != nil {
		return nil, err
	}
	return ch.OpenWriter(ctx, ref)
}

func (l *lazyChannels) Create(ctx context.Context) (writer, reader protocol.StreamChannelRef, err error) {
	ch, err := l.get()
	if err != nil {
		return writer, reader, err
	}
	return ch.Create(ctx)
}

func (*lazyChannels) Gone(err error) bool { return errors.Is(err, errGone) }

// close closes the connections to the host's channels.
func (s *server) close() {
	s.mu.Lock()
	conns := s.conns
	s.conns, s.closed = nil, true
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// Invoke runs one operation and answers its JSON reply or its error wire
// object. A call the caller gave up on ends as a context status, so the
// host reports the caller's own context error.
func (s *server) Invoke(ctx context.Context, in *pb.InvokeRequest) (*pb.InvokeReply, error) {
	op := in.GetOp()
	if op == contract.OpConfigure {
		return s.configure(ctx, in.GetPayload())
	}
	fn, ok := s.ops[op]
	if !ok {
		return errorReply(contract.NewError(contract.S300, "the sandbox adapter does not serve %q", op)), nil
	}
	out, err := fn(ctx, s.target(in.GetChannels()), in.GetPayload())
	if err == nil && isNil(out) {
		err = contract.NewError(contract.FallbackCode(op), "the sandbox adapter returned no %s reply", op)
	}
	if err != nil {
		if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return errorReply(contract.AsError(err, contract.FallbackCode(op))), nil
	}
	b, err := contract.EncodeJSON(out)
	if err != nil {
		return errorReply(contract.NewError(contract.S300, "encode the adapter's %s reply: %v", op, err)), nil
	}
	return &pb.InvokeReply{Result: b}, nil
}

func errorReply(e *contract.Error) *pb.InvokeReply {
	return &pb.InvokeReply{Error: e.ToWire(), Code: string(e.Code)}
}

// isNil reports a nil reply inside a non-nil interface (a typed nil
// pointer an adapter returned without an error).
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// configure hands the adapter its configuration. A refusal is marked
// rejected, keeping the adapter's reason and its sandbox error if it sent
// one.
func (s *server) configure(ctx context.Context, config []byte) (*pb.InvokeReply, error) {
	err := s.impl.Configure(ctx, config)
	if err == nil {
		return &pb.InvokeReply{Result: []byte("{}")}, nil
	}
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	out := &pb.InvokeReply{Rejected: true, Reason: err.Error()}
	var e *contract.Error
	if errors.As(err, &e) {
		out.Error, out.Code, out.Reason = e.ToWire(), string(e.Code), e.Message
	}
	return out, nil
}

// Plugin is the go-plugin plugin of the sandbox contract. Impl is the
// adapter an adapter binary serves (Name and Log go with it); a host
// leaves Impl nil, sets Channels to the channels its adapter may reach
// (nil: a MemChannels of the Client's own), and dispenses a *Client.
type Plugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl     contract.Adapter
	Name     string
	Log      hclog.Logger
	Channels adapterjson.Channels

	mu      sync.Mutex
	servers []*server
}

var _ plugin.GRPCPlugin = (*Plugin)(nil)

// GRPCServer registers the adapter's service.
func (p *Plugin) GRPCServer(broker *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("sandbox plugin: no adapter to serve")
	}
	srv := newServer(p.Impl, p.Name, p.Log, broker)
	p.mu.Lock()
	p.servers = append(p.servers, srv)
	p.mu.Unlock()
	pb.RegisterSandboxAdapterServer(s, srv)
	return nil
}

// RegisterServer serves impl on s without go-plugin: no channels, so only
// the operations that name none work (a benchmark's floor).
func RegisterServer(s *grpc.Server, impl contract.Adapter) {
	pb.RegisterSandboxAdapterServer(s, newServer(impl, "", nil, nil))
}

// Close closes what the adapter side holds after go-plugin stopped serving
// (its connections to the host's channels). An adapter process calls it
// when plugin.Serve returns.
func (p *Plugin) Close() {
	p.mu.Lock()
	servers := p.servers
	p.servers = nil
	p.mu.Unlock()
	for _, s := range servers {
		s.close()
	}
}

// GRPCClient returns the *Client of the adapter; the client starts the
// host's channel service on the broker at its first call.
func (p *Plugin) GRPCClient(_ context.Context, broker *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	ch := p.Channels
	if ch == nil {
		ch = NewMemChannels()
	}
	serve := func() uint32 {
		id := broker.NextId()
		// It serves until the broker closes, with the plugin client.
		go broker.AcceptAndServe(id, func(opts []grpc.ServerOption) *grpc.Server {
			opts = append(opts, contract.GRPCServerOptions()...)
			opts = append(opts, contract.ChunkBufferPoolOption())
			s := grpc.NewServer(opts...)
			pb.RegisterChannelsServer(s, &channelServer{ch: ch})
			return s
		})
		return id
	}
	return newClient(conn, ch, serve), nil
}

// VersionedPlugins is the plugin set keyed by contract major, for both
// plugin.ServeConfig (impl set) and plugin.ClientConfig (impl nil). A host
// and an adapter with no major in common fail the go-plugin handshake.
func VersionedPlugins(p *Plugin) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		contract.Major: {contract.PluginName: p},
	}
}
