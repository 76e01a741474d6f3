package contract

import (
	"context"
	"errors"

	"github.com/hashicorp/go-plugin"
	pb "github.com/iii-sandbox/iii/contract/proto"
	"google.golang.org/grpc"
)

// go-plugin glue shared by the engine's plugin host and every adapter.

const (
	// PluginName is the one plugin an adapter binary serves.
	PluginName = "sandbox"

	// HandshakeProtocolVersion is go-plugin's application protocol
	// version; with VersionedPlugins the negotiated version is the
	// contract major instead.
	HandshakeProtocolVersion = Major

	// The magic cookie tells an adapter binary it was started by a host,
	// not by hand. It is a UX guard, not a secret: the fixed value is
	// the same in every build.
	HandshakeMagicCookieKey   = "III_SANDBOX_ADAPTER"
	HandshakeMagicCookieValue = "25d5253c6532227d796ea7264deac5faac2b030fbf2554f910671dd56724bec7"
)

// Handshake is the handshake hosts and adapters share.
func Handshake() plugin.HandshakeConfig {
	return plugin.HandshakeConfig{
		ProtocolVersion:  HandshakeProtocolVersion,
		MagicCookieKey:   HandshakeMagicCookieKey,
		MagicCookieValue: HandshakeMagicCookieValue,
	}
}

// GRPCPlugin is the go-plugin plugin of the sandbox contract. Impl is the
// adapter an adapter binary serves; hosts leave it nil and dispense a
// *GRPCClient.
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl Adapter
}

var _ plugin.GRPCPlugin = (*GRPCPlugin)(nil)

// GRPCServer registers the adapter's service.
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	if p.Impl == nil {
		return errors.New("sandbox plugin: no adapter to serve")
	}
	pb.RegisterSandboxAdapterServer(s, NewGRPCServer(p.Impl))
	return nil
}

// GRPCClient returns the Adapter that calls the plugin.
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return NewGRPCClient(conn), nil
}

// VersionedPlugins is the plugin set keyed by contract major, for both
// plugin.ServeConfig (impl set) and plugin.ClientConfig (impl nil). A host
// and an adapter with no major in common fail the go-plugin handshake.
func VersionedPlugins(impl Adapter) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		Major: {PluginName: &GRPCPlugin{Impl: impl}},
	}
}
