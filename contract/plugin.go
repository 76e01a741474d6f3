package contract

import (
	"github.com/hashicorp/go-plugin"
)

// go-plugin handshake shared by the engine's plugin host and every adapter;
// the plugin itself (one generic JSON invoke and the engine's channels) is
// package adapterrpc.

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

// OpConfigure is the transport's name of Adapter.Configure: not a function
// callers can reach, only the host's call right after start (and on a
// reload).
const OpConfigure = "configure"

// FallbackCode is the code a plain (non-*Error) failure of op gets.
func FallbackCode(op string) Code { return fallbackCode(op) }
