package usernet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/iii-sandbox/iii/internal/testkit/tcpserve"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testGuest is a guest for unit tests: a second netstack configured as the
// guest agent configures a VM (10.0.2.15/24, default route via 10.0.2.2),
// on the other end of a socketpair from a Network. It stands for a root
// guest: it sends whatever packets it likes through its NIC.
type testGuest struct {
	s     *stack.Stack
	net   *Network
	dials *dialLog
	stop  func() error // closes the guest's end and waits for Serve
}

// dialLog records what the Network asked to dial, and stands in for the
// host's dialer: a mapped address leads to a loopback test server, a
// loopback address (forwards) is dialled for real, anything else fails
// without sending a packet.
type dialLog struct {
	mu   sync.Mutex
	got  []string
	maps map[string]string
}

func (d *dialLog) dial(ctx context.Context, network, address string) (net.Conn, error) {
	d.mu.Lock()
	d.got = append(d.got, network+" "+address)
	to, ok := d.maps[network+" "+address]
	d.mu.Unlock()
	if !ok {
		ap, err := netip.ParseAddrPort(address)
		if err != nil || !ap.Addr().IsLoopback() {
			return nil, fmt.Errorf("test dialer: %s %s is not a test server", network, address)
		}
		to = address
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, to)
}

func (d *dialLog) list() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.got...)
}

// testHostAddrs stands for the host's own addresses.
var testHostAddr = netip.MustParseAddr("192.0.2.2")

// testNet is a Network serving one end of a socketpair; guest is the
// other end, where a VM would be.
type testNet struct {
	net    *Network
	dials  *dialLog
	guest  net.Conn
	served chan error
}

func startNet(t *testing.T, cfg Config, maps map[string]string) *testNet {
	t.Helper()
	dl := &dialLog{maps: maps}
	cfg.dial = dl.dial
	if cfg.hostAddrs == nil {
		cfg.hostAddrs = func() ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1"), testHostAddr, netip.MustParseAddr("::1")}, nil
		}
	}
	if cfg.DNSServers == nil {
		// Nothing listens there: a test that forwards a query sets
		// its own upstream.
		cfg.DNSServers = []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}
	}
	n, err := New(cfg)
	assert.NilError(t, err)

	hostEnd, guestEnd, err := Pair()
	assert.NilError(t, err)
	hc, err := net.FileConn(hostEnd)
	assert.NilError(t, err)
	_ = hostEnd.Close()
	gc, err := net.FileConn(guestEnd)
	assert.NilError(t, err)
	_ = guestEnd.Close()

	served := make(chan error, 1)
	go func() { served <- n.Serve(context.Background(), hc) }()
	return &testNet{net: n, dials: dl, guest: gc, served: served}
}

// wait closes the guest's end and waits for Serve.
func (tn *testNet) wait() error {
	_ = tn.guest.Close()
	select {
	case err := <-tn.served:
		return err
	case <-time.After(30 * time.Second):
		return errors.New("Serve did not return within 30 s of the guest closing its end")
	}
}

func startGuest(t *testing.T, cfg Config, maps map[string]string) *testGuest {
	t.Helper()
	tn := startNet(t, cfg, maps)
	n, dl, gc := tn.net, tn.dials, tn.guest

	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	link := channel.New(256, mtu+ethHeaderLen, tcpip.LinkAddress([]byte{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}))
	assert.Assert(t, s.CreateNIC(1, ethernet.New(link)) == nil)
	assert.Assert(t, s.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(GuestAddr.As4()), PrefixLen: 24}}, stack.AddressProperties{}) == nil)
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, Gateway: tcpip.AddrFrom4(GatewayAddr.As4()), NIC: 1}})

	ctx, cancel := context.WithCancel(context.Background())
	var pumps sync.WaitGroup
	pumps.Add(2)
	go func() { // guest → network
		defer pumps.Done()
		for {
			pkt := link.ReadContext(ctx)
			if pkt == nil {
				return
			}
			err := WriteFrame(gc, pkt.AsSlices()...)
			pkt.DecRef()
			if err != nil {
				return
			}
		}
	}()
	go func() { // network → guest
		defer pumps.Done()
		fr := NewFrameReader(gc)
		for {
			f, err := fr.Next()
			if err != nil {
				return
			}
			pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(f)})
			link.InjectInbound(0, pkt)
			pkt.DecRef()
		}
	}()
	var once sync.Once
	var serr error
	g := &testGuest{s: s, net: n, dials: dl}
	g.stop = func() error {
		once.Do(func() {
			cancel()
			_ = gc.Close()
			waitfor.Func(t, waitfor.Default, "the guest's pumps, stack and network to stop", func() {
				pumps.Wait()
				s.Close()
				link.Close()
				s.Wait()
				serr = tn.wait()
			})
		})
		return serr
	}
	t.Cleanup(func() { assert.Check(t, g.stop()) })
	return g
}

func fullAddr(ap netip.AddrPort) tcpip.FullAddress {
	return tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(ap.Addr().As4()), Port: ap.Port()}
}

// dialTCP connects from the guest.
func (g *testGuest) dialTCP(t *testing.T, to string) (*gonet.TCPConn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return gonet.DialContextTCP(ctx, g.s, fullAddr(netip.MustParseAddrPort(to)), ipv4.ProtocolNumber)
}

// dialUDP opens a connected UDP socket in the guest.
func (g *testGuest) dialUDP(t *testing.T, to string) *gonet.UDPConn {
	t.Helper()
	ra := fullAddr(netip.MustParseAddrPort(to))
	c, err := gonet.DialUDP(g.s, nil, &ra, ipv4.ProtocolNumber)
	assert.NilError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// tcpEcho is a loopback TCP echo server.
func tcpEcho(t *testing.T) (addr string, accepted func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	return ln.Addr().String(), tcpserve.Serve(t, ln, tcpserve.Echo)
}

// udpEcho is a loopback UDP echo server.
func udpEcho(t *testing.T) (addr string, got func() int) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	assert.NilError(t, err)
	var mu sync.Mutex
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65535)
		for {
			m, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			mu.Lock()
			n++
			mu.Unlock()
			_, _ = pc.WriteTo(buf[:m], from)
		}
	}()
	t.Cleanup(func() { _ = pc.Close(); <-done })
	return pc.LocalAddr().String(), func() int { mu.Lock(); defer mu.Unlock(); return n }
}
