package usernet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The guest's network: the layout of QEMU's user network, which the guest
// agent configures (guest.DefaultAddress, DefaultGateway, DefaultDNS), so
// the guest needs to know nothing about what serves it.
var (
	GuestSubnet = netip.MustParsePrefix("10.0.2.0/24")
	GuestAddr   = netip.MustParseAddr("10.0.2.15")
	GatewayAddr = netip.MustParseAddr("10.0.2.2")
	DNSAddr     = netip.MustParseAddr("10.0.2.3")
)

// Defaults and bounds.
const (
	// DefaultMaxTCPFlows and DefaultMaxUDPFlows bound the flows of one VM
	// that hold a host socket, so a guest cannot exhaust the runner's file
	// descriptors.
	DefaultMaxTCPFlows = 256
	DefaultMaxUDPFlows = 128
	maxFlows           = 4096
	// maxPendingDials bounds TCP handshakes waiting for their host dial.
	maxPendingDials = 64
	// dialTimeout bounds one host dial.
	dialTimeout = 30 * time.Second
	// handshakeRecheck is how often a closing network looks again for a
	// handshake registered after it aborted the others.
	handshakeRecheck = 20 * time.Millisecond
	// udpIdle ends a UDP flow with no datagram either way for this long.
	udpIdle = 60 * time.Second
	// dnsIdle ends a DNS flow (UDP or TCP) idle for this long.
	dnsIdle = 10 * time.Second
	// maxDNSQueries bounds the queries under way to the host's nameservers.
	maxDNSQueries = 32
	// outQueue bounds the frames waiting to be written to the VM; more
	// are dropped (TCP sends them again).
	outQueue = 512
	// mtu is the guest link's IP MTU (virtio-net's default).
	mtu = 1500
)

// Forward connects a guest's TCP connections to the gateway's GuestPort to
// HostAddr, a loopback address of the host, and to nothing else: a VM
// worker reaches the engine this way. A plain forward relays bytes. An
// HTTP forward (HTTP, or a BearerToken) relays exactly one HTTP/1.1
// request head, with its Host set to HostAddr (a loopback listener
// answers only loopback Host names) and, with a BearerToken, the guest's
// Authorization replaced by "Bearer <token>"; then nothing more from the
// guest until the host's status line: 101 turns the connection into a
// byte relay both ways, any other status is relayed with its response and
// the connection closed. The token never enters the guest.
type Forward struct {
	GuestPort   uint16
	HostAddr    netip.AddrPort
	HTTP        bool
	BearerToken string
}

func (f *Forward) httpMode() bool { return f.HTTP || f.BearerToken != "" }

// Config is one VM's network.
type Config struct {
	// AllowCIDRs are ranges the guest may reach beyond public addresses
	// (ParseAllowCIDRs reads them): private ranges are refused otherwise.
	AllowCIDRs []netip.Prefix
	// Forwards are the gateway's ports that lead to the host (VM
	// workers); sandboxes have none.
	Forwards []Forward
	// DNSServers are the host nameservers the DNS service asks; empty
	// means /etc/resolv.conf's.
	DNSServers []netip.AddrPort
	// MaxTCPFlows and MaxUDPFlows bound the concurrent flows; 0 means
	// the defaults.
	MaxTCPFlows int
	MaxUDPFlows int
	// Log receives refusals and failures (debug) and the end of the
	// network; nil discards them.
	Log hclog.Logger

	// dial replaces the host dialer of guest flows and forwards (tests):
	// the policy is checked before it is called.
	dial func(ctx context.Context, network, address string) (net.Conn, error)
	// hostAddrs replaces net.InterfaceAddrs (tests).
	hostAddrs func() ([]netip.Addr, error)
	// udpIdle replaces udpIdle (tests).
	udpIdle time.Duration
}

// Validate checks a configuration.
func (c *Config) Validate() error {
	for _, p := range c.AllowCIDRs {
		for _, n := range neverRanges {
			if p.Overlaps(n.prefix) {
				return fmt.Errorf("allowed range %s overlaps %s (%s), which a guest never reaches", p, n.prefix, n.why)
			}
		}
	}
	seen := map[uint16]bool{}
	for _, f := range c.Forwards {
		switch {
		case f.GuestPort == 0:
			return errors.New("a forward needs a guest port")
		case seen[f.GuestPort]:
			return fmt.Errorf("guest port %d is forwarded twice", f.GuestPort)
		case !f.HostAddr.IsValid() || f.HostAddr.Port() == 0:
			return fmt.Errorf("forward of guest port %d: host address %s needs an address and a port", f.GuestPort, f.HostAddr)
		case !f.HostAddr.Addr().Unmap().IsLoopback():
			return fmt.Errorf("forward of guest port %d: host address %s is not a loopback address", f.GuestPort, f.HostAddr)
		case f.BearerToken != "" && !ValidBearerToken(f.BearerToken):
			return fmt.Errorf("forward of guest port %d: the bearer token is too long or not visible ASCII", f.GuestPort)
		}
		seen[f.GuestPort] = true
	}
	for _, d := range c.DNSServers {
		if !d.IsValid() || d.Port() == 0 {
			return fmt.Errorf("DNS server %s needs an address and a port", d)
		}
	}
	if c.MaxTCPFlows < 0 || c.MaxTCPFlows > maxFlows || c.MaxUDPFlows < 0 || c.MaxUDPFlows > maxFlows {
		return fmt.Errorf("flow limits must be between 0 (the default) and %d", maxFlows)
	}
	return nil
}
