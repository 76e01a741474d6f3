package usernet

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/iii-sandbox/iii/internal/taskgroup"
)

// stackMAC is the gateway's (and the DNS address's) hardware address:
// locally administered, unicast.
var stackMAC = tcpip.LinkAddress([]byte{0x5a, 0x94, 0xef, 0xe4, 0x0c, 0xdd})

const nicID tcpip.NICID = 1

// Stats counts what one network did.
type Stats struct {
	FramesIn, FramesOut, FramesDropped uint64
	TCPFlows, TCPRefused               uint64
	UDPFlows, UDPRefused               uint64
	DNSQueries                         uint64
}

type counters struct {
	framesIn, framesOut, framesDropped atomic.Uint64
	tcpFlows, tcpRefused               atomic.Uint64
	udpFlows, udpRefused               atomic.Uint64
	dnsQueries                         atomic.Uint64
}

// Network is one VM's user-mode network: a gVisor netstack on the host end
// of the VM's NIC stream that answers ARP for the gateway and DNS
// addresses, serves DNS, and relays the guest's TCP and UDP flows through
// sockets of this process, each checked against the Policy before it is
// dialled.
type Network struct {
	cfg      Config
	log      hclog.Logger
	policy   *Policy
	dns      *dnsService
	forwards map[uint16]Forward
	tcpSlots chan struct{}
	udpSlots chan struct{}
	udpIdle  time.Duration

	// flows counts the goroutines of guest flows, so Serve returns only
	// once every one has ended.
	flows taskgroup.Group
	// ctx is Serve's: it ends every flow.
	ctx    context.Context
	served atomic.Bool
	st     counters
}

// New checks cfg and prepares a network; Serve runs it.
func New(cfg Config) (*Network, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := &Network{
		cfg:      cfg,
		log:      cfg.Log,
		policy:   NewPolicy(cfg.AllowCIDRs),
		forwards: map[uint16]Forward{},
		udpIdle:  udpIdle,
	}
	if n.log == nil {
		n.log = hclog.NewNullLogger()
	}
	if cfg.hostAddrs != nil {
		n.policy.hostAddrs = cfg.hostAddrs
	}
	if cfg.udpIdle > 0 {
		n.udpIdle = cfg.udpIdle
	}
	for _, f := range cfg.Forwards {
		n.forwards[f.GuestPort] = f
	}
	ups := cfg.DNSServers
	if len(ups) == 0 {
		var err error
		if ups, err = HostNameservers("/etc/resolv.conf"); err != nil {
			return nil, err
		}
	}
	var d net.Dialer
	n.dns = &dnsService{upstreams: ups, dial: d.DialContext, sem: make(chan struct{}, maxDNSQueries), timeout: dnsUpstreamTimeout}
	n.tcpSlots = make(chan struct{}, or(cfg.MaxTCPFlows, DefaultMaxTCPFlows))
	n.udpSlots = make(chan struct{}, or(cfg.MaxUDPFlows, DefaultMaxUDPFlows))
	return n, nil
}

func or(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// Stats returns the counters so far.
func (n *Network) Stats() Stats {
	return Stats{
		FramesIn: n.st.framesIn.Load(), FramesOut: n.st.framesOut.Load(), FramesDropped: n.st.framesDropped.Load(),
		TCPFlows: n.st.tcpFlows.Load(), TCPRefused: n.st.tcpRefused.Load(),
		UDPFlows: n.st.udpFlows.Load(), UDPRefused: n.st.udpRefused.Load(),
		DNSQueries: n.st.dnsQueries.Load(),
	}
}

// Serve runs the network over conn, the host end of the VM's NIC, until
// the VM closes its end, the stream breaks, or ctx ends; then it ends every
// flow, waits for all of its goroutines and closes conn. It returns nil
// when the VM closed its end (even inside a frame: a killed VMM does) or
// ctx ended. A Network serves once.
func (n *Network) Serve(ctx context.Context, conn io.ReadWriteCloser) error {
	if !n.served.CompareAndSwap(false, true) {
		_ = conn.Close()
		return errors.New("usernet: a Network serves once")
	}
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	n.ctx = ctx
	s, link, err := n.newStack()
	if err != nil {
		_ = conn.Close()
		return err
	}

	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := n.writeLoop(ctx, link, conn); err != nil {
			cancel(err)
		}
	}()
	go func() {
		defer wg.Done()
		<-ctx.Done()
		_ = conn.Close() // ends the read loop, and a blocked write
	}()
	rerr := n.readLoop(link, conn)
	cancel(rerr)
	wg.Wait()

	// No frame comes in any more, so no new flow: end the running ones
	// (their relays watch ctx) and wait for them, then the stack.
	n.flows.Close()
	n.endFlows(s)
	s.Close()
	link.Close()
	s.Wait()

	err = context.Cause(ctx)
	st := n.Stats()
	n.log.Debug("network ended", "cause", err, "frames_in", st.FramesIn, "frames_out", st.FramesOut,
		"tcp_flows", st.TCPFlows, "tcp_refused", st.TCPRefused, "udp_flows", st.UDPFlows, "udp_refused", st.UDPRefused)
	switch {
	// The VM closed its end, between frames or (killed) inside one; a
	// close with frames still in flight either way reaches us as a reset
	// (its end had unread frames) or a broken pipe (our write came after).
	case parent.Err() != nil, errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed), errors.Is(err, os.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return nil
	}
	return err
}

// endFlows waits for every flow's goroutine once ctx has ended. A relay
// ends with ctx, but a flow still in its handshake (CreateEndpoint) waits
// for the guest's final ACK, and no frame comes in any more: the stack
// would give up only after its SYN-ACK retries, a minute or more. So the
// handshakes are aborted; and since a handler may register its handshake
// just after a pass, again until no flow runs.
func (n *Network) endFlows(s *stack.Stack) {
	for {
		abortHandshakes(s)
		ctx, cancel := context.WithTimeout(context.Background(), handshakeRecheck)
		err := n.flows.Wait(ctx)
		cancel()
		if err == nil {
			return
		}
	}
}

// abortHandshakes aborts the stack's TCP endpoints still in a passive
// handshake, which wakes the handler waiting in CreateEndpoint with an
// error. Established endpoints are left to their relays.
func abortHandshakes(s *stack.Stack) {
	for _, e := range s.RegisteredEndpoints() {
		ep, ok := e.(*tcp.Endpoint)
		if !ok {
			continue
		}
		switch ep.EndpointState() {
		case tcp.StateConnecting, tcp.StateSynRecv:
			ep.Abort()
		}
	}
}

func (n *Network) newStack() (*stack.Stack, *channel.Endpoint, error) {
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	fail := func(what string, err tcpip.Error) (*stack.Stack, *channel.Endpoint, error) {
		s.Destroy()
		return nil, nil, fmt.Errorf("usernet: %s: %s", what, err)
	}
	link := channel.New(outQueue, mtu+ethHeaderLen, stackMAC)
	// Frames come over a local stream, not a wire, and a guest with
	// checksum offload leaves partial checksums: like passt, trust them.
	link.LinkEPCapabilities = stack.CapabilityRXChecksumOffload
	if err := s.CreateNIC(nicID, ethernet.New(link)); err != nil {
		return fail("create the NIC", err)
	}
	for _, a := range []netip.Addr{GatewayAddr, DNSAddr} {
		pa := tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: tcpip.AddressWithPrefix{
			Address: tcpip.AddrFrom4(a.As4()), PrefixLen: GuestSubnet.Bits()}}
		if err := s.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); err != nil {
			return fail("add "+a.String(), err)
		}
	}
	subnet, _ := tcpip.NewSubnet(tcpip.AddrFrom4(GuestSubnet.Addr().As4()), tcpip.MaskFromBytes(net.CIDRMask(GuestSubnet.Bits(), 32)))
	// Replies go to the guest's subnet and nowhere else.
	s.SetRouteTable([]tcpip.Route{{Destination: subnet, NIC: nicID}})
	// Accept packets for any destination and answer from it: that is
	// what relaying the guest's flows means. The link filter (admit)
	// keeps ARP and ICMP to the stack's own addresses.
	if err := s.SetPromiscuousMode(nicID, true); err != nil {
		return fail("promiscuous mode", err)
	}
	if err := s.SetSpoofing(nicID, true); err != nil {
		return fail("spoofing", err)
	}
	for _, opt := range []tcpip.SettableTransportProtocolOption{
		func() *tcpip.TCPSACKEnabled { v := tcpip.TCPSACKEnabled(true); return &v }(),
		// Bounded buffers: a flow holds at most this much in the stack.
		&tcpip.TCPReceiveBufferSizeRangeOption{Min: 4 << 10, Default: 128 << 10, Max: 256 << 10},
		&tcpip.TCPSendBufferSizeRangeOption{Min: 4 << 10, Default: 128 << 10, Max: 256 << 10},
		func() *tcpip.TCPModerateReceiveBufferOption {
			v := tcpip.TCPModerateReceiveBufferOption(false)
			return &v
		}(),
	} {
		if err := s.SetTransportProtocolOption(tcp.ProtocolNumber, opt); err != nil {
			return fail("TCP option", err)
		}
	}
	tf := tcp.NewForwarder(s, 128<<10, maxPendingDials, n.handleTCP)
	s.SetTransportProtocolHandler(tcp.ProtocolNumber, tf.HandlePacket)
	uf := udp.NewForwarder(s, n.handleUDP)
	s.SetTransportProtocolHandler(udp.ProtocolNumber, uf.HandlePacket)
	return s, link, nil
}

// readLoop feeds the guest's frames to the stack until the stream ends.
func (n *Network) readLoop(link *channel.Endpoint, conn io.Reader) error {
	fr := NewFrameReader(conn)
	for {
		f, err := fr.Next()
		if err != nil {
			return err
		}
		n.st.framesIn.Add(1)
		if !admit(f) {
			n.st.framesDropped.Add(1)
			continue
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(f)})
		link.InjectInbound(0, pkt)
		pkt.DecRef()
	}
}

// writeLoop writes the stack's frames to the VM until ctx ends.
func (n *Network) writeLoop(ctx context.Context, link *channel.Endpoint, conn io.Writer) error {
	bw := bufio.NewWriterSize(conn, 64<<10)
	for {
		pkt := link.ReadContext(ctx)
		if pkt == nil {
			return nil
		}
		err := WriteFrame(bw, pkt.AsSlices()...)
		pkt.DecRef()
		n.st.framesOut.Add(1)
		if err == nil && link.NumQueued() == 0 {
			err = bw.Flush()
		}
		if err != nil {
			return fmt.Errorf("write to the VM: %w", err)
		}
	}
}

// Ethernet types and IP protocols admit looks at.
const (
	etherIPv4 = 0x0800
	etherARP  = 0x0806
	protoICMP = 1
	protoTCP  = 6
	protoUDP  = 17
)

// admit is the link filter in front of the stack: it keeps IPv4 from a
// guest address (TCP, UDP, and ICMP to the stack's own addresses) and ARP
// about the stack's own addresses. With spoofing on, the stack would
// otherwise claim every address in ARP and answer pings for any host.
func admit(f []byte) bool {
	if len(f) < ethHeaderLen {
		return false
	}
	p := f[ethHeaderLen:]
	switch binary.BigEndian.Uint16(f[12:14]) {
	case etherARP:
		// Ethernet/IPv4 ARP only.
		if len(p) < 28 || binary.BigEndian.Uint16(p[0:2]) != 1 || binary.BigEndian.Uint16(p[2:4]) != etherIPv4 || p[4] != 6 || p[5] != 4 {
			return false
		}
		sender := netip.AddrFrom4([4]byte(p[14:18]))
		target := netip.AddrFrom4([4]byte(p[24:28]))
		switch binary.BigEndian.Uint16(p[6:8]) {
		case 1: // request: only about the stack's addresses
			return guestSource(sender) && (target == GatewayAddr || target == DNSAddr)
		case 2: // reply: the guest answering the stack
			return guestSource(sender)
		}
		return false
	case etherIPv4:
		if len(p) < 20 || p[0]>>4 != 4 {
			return false
		}
		if !guestSource(netip.AddrFrom4([4]byte(p[12:16]))) {
			return false
		}
		dst := netip.AddrFrom4([4]byte(p[16:20]))
		switch p[9] {
		case protoTCP, protoUDP:
			return true
		case protoICMP:
			return dst == GatewayAddr || dst == DNSAddr
		}
		return false
	}
	return false
}

// guestSource reports whether a can be the guest's address: in its subnet,
// and neither the stack's, the network's nor the broadcast address.
func guestSource(a netip.Addr) bool {
	if !GuestSubnet.Contains(a) || a == GatewayAddr || a == DNSAddr {
		return false
	}
	last := a.As4()[3]
	return last != 0 && last != 255
}

// dialFlow dials a guest flow's host side. A direct flow's address is
// checked by the policy again as the socket connects; a forward's must be
// its configured loopback address.
func (n *Network) dialFlow(ctx context.Context, network string, target netip.AddrPort, forward bool) (net.Conn, error) {
	if n.cfg.dial != nil {
		return n.cfg.dial(ctx, network, target.String())
	}
	d := net.Dialer{KeepAlive: 30 * time.Second}
	d.ControlContext = func(ctx context.Context, network, address string, _ syscall.RawConn) error {
		if forward {
			if ap, err := netip.ParseAddrPort(address); err != nil || ap != target {
				return fmt.Errorf("forward to %s dialled %s: %w", target, address, ErrRefused)
			}
			return nil
		}
		return n.policy.dialControl(ctx, network, address)
	}
	return d.DialContext(ctx, network, target.String())
}

func addrOf(a tcpip.Address) (netip.Addr, bool) {
	if a.Len() != 4 {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4(a.As4()), true
}
