package usernet

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/tcpserve"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// A destination the policy allows (TEST-NET-2); the test dialer maps it
// to a loopback server, so no packet ever leaves the host.
const allowedDst = "198.51.100.7"

func TestTCPRelayToAllowedDestination(t *testing.T) {
	echo, accepted := tcpEcho(t)
	g := startGuest(t, Config{}, map[string]string{"tcp " + allowedDst + ":80": echo})
	c, err := g.dialTCP(t, allowedDst+":80")
	assert.NilError(t, err)
	defer c.Close()
	msg := strings.Repeat("through the stack ", 20000) // several windows
	go func() {
		_, _ = io.WriteString(c, msg)
		_ = c.CloseWrite()
	}()
	got, err := io.ReadAll(c)
	assert.NilError(t, err)
	assert.Equal(t, len(got), len(msg))
	assert.Equal(t, string(got), msg)
	assert.Equal(t, accepted(), 1)
	assert.DeepEqual(t, g.dials.list(), []string{"tcp " + allowedDst + ":80"})
}

// Every refused destination: the guest's connect fails at once with a
// reset, and nothing is dialled.
func TestTCPRefusedGetsResetAndNoDial(t *testing.T) {
	_, accepted := tcpEcho(t)
	g := startGuest(t, Config{Forwards: []Forward{{GuestPort: 8080, HostAddr: netip.MustParseAddrPort("127.0.0.1:1")}}}, nil)
	for _, to := range []string{
		"10.0.2.2:49134",     // the gateway: QEMU's slirp maps it to the host's loopback
		"10.0.2.2:53",        // no DNS on the gateway
		"10.0.2.3:80",        // the DNS address serves 53 only
		"169.254.169.254:80", // cloud metadata
		"192.0.2.2:22",       // an address of the host
		"10.1.2.3:80",        // private
		"172.16.5.5:80",      // private
		"192.168.1.1:80",     // private
		"100.64.0.1:80",      // carrier-grade NAT
		allowedDst + ":0",    // port 0
	} {
		t.Run(to, func(t *testing.T) {
			start := time.Now()
			c, err := g.dialTCP(t, to)
			if err == nil {
				_ = c.Close()
			}
			assert.Assert(t, err != nil, "the guest connected to %s", to)
			assert.Check(t, is.ErrorContains(err, "refused"), "a reset, not a timeout")
			assert.Check(t, time.Since(start) < 15*time.Second)
		})
	}
	assert.DeepEqual(t, g.dials.list(), []string(nil))
	assert.Equal(t, accepted(), 0)
	assert.Check(t, g.net.Stats().TCPRefused >= 10)

	// The rest of the virtual network is on the guest's link: nobody
	// answers its ARP.
	_, err := g.dialTCP(t, "10.0.2.4:80")
	assert.Check(t, err != nil)
	assert.DeepEqual(t, g.dials.list(), []string(nil))
}

func TestTCPAllowCIDRs(t *testing.T) {
	echo, _ := tcpEcho(t)
	allow, err := ParseAllowCIDRs([]string{"10.1.0.0/16", "192.0.2.0/24"})
	assert.NilError(t, err)
	g := startGuest(t, Config{AllowCIDRs: allow}, map[string]string{"tcp 10.1.2.3:80": echo})
	c, err := g.dialTCP(t, "10.1.2.3:80")
	assert.NilError(t, err)
	_ = c.Close()
	for _, to := range []string{"10.2.0.1:80", "192.0.2.2:80", "10.0.2.2:80"} {
		_, err := g.dialTCP(t, to)
		assert.Check(t, is.ErrorContains(err, "refused"), to)
	}
	assert.DeepEqual(t, g.dials.list(), []string{"tcp 10.1.2.3:80"})
}

func TestTCPFailedDialIsReset(t *testing.T) {
	g := startGuest(t, Config{}, nil) // the test dialer fails every non-loopback dial
	_, err := g.dialTCP(t, "203.0.113.9:443")
	assert.Check(t, is.ErrorContains(err, "refused"))
	assert.DeepEqual(t, g.dials.list(), []string{"tcp 203.0.113.9:443"})
}

func TestTCPFlowCap(t *testing.T) {
	echo, _ := tcpEcho(t)
	g := startGuest(t, Config{MaxTCPFlows: 2}, map[string]string{"tcp " + allowedDst + ":80": echo})
	var open []net.Conn
	for range 2 {
		c, err := g.dialTCP(t, allowedDst+":80")
		assert.NilError(t, err)
		open = append(open, c)
	}
	_, err := g.dialTCP(t, allowedDst+":80")
	assert.Check(t, is.ErrorContains(err, "refused"), "a third flow over the cap")
	for _, c := range open {
		_ = c.Close()
	}
	// The slots come back once the flows ended.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		c, err := g.dialTCP(t, allowedDst+":80")
		if err != nil {
			return poll.Continue("%v", err)
		}
		_ = c.Close()
		return poll.Success()
	}, poll.WithTimeout(20*time.Second))
}

func TestForward(t *testing.T) {
	echo, accepted := tcpEcho(t)
	g := startGuest(t, Config{Forwards: []Forward{{GuestPort: 49134, HostAddr: netip.MustParseAddrPort(echo)}}}, nil)
	c, err := g.dialTCP(t, "10.0.2.2:49134")
	assert.NilError(t, err)
	_, err = io.WriteString(c, "to the engine")
	assert.NilError(t, err)
	_ = c.CloseWrite()
	got, err := io.ReadAll(c)
	assert.NilError(t, err)
	assert.Equal(t, string(got), "to the engine")
	_ = c.Close()
	// The forward is the gateway's port and nothing else.
	_, err = g.dialTCP(t, "10.0.2.2:49135")
	assert.Check(t, is.ErrorContains(err, "refused"))
	_, err = g.dialTCP(t, "10.0.2.3:49134")
	assert.Check(t, is.ErrorContains(err, "refused"))
	assert.Equal(t, accepted(), 1)
	assert.DeepEqual(t, g.dials.list(), []string{"tcp " + echo})
}

// upstream is a loopback HTTP server that records the request heads it
// gets and answers with respond.
type upstream struct {
	addr  string
	mu    sync.Mutex
	heads []string
	after []string // what the client sent after the head
}

func startUpstream(t *testing.T, respond func(c net.Conn, r *bufio.Reader) string) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	u := &upstream{addr: ln.Addr().String()}
	tcpserve.Serve(t, ln, func(c net.Conn) {
		r := bufio.NewReader(c)
		head, err := readHead(r)
		if err != nil {
			return
		}
		u.mu.Lock()
		u.heads = append(u.heads, string(head))
		u.mu.Unlock()
		rest := respond(c, r)
		u.mu.Lock()
		u.after = append(u.after, rest)
		u.mu.Unlock()
	})
	return u
}

func TestBearerForwardUpgrade(t *testing.T) {
	up := startUpstream(t, func(c net.Conn, r *bufio.Reader) string {
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nhello from upstream")
		// Echo until the client half-closes.
		b, _ := io.ReadAll(r)
		_, _ = c.Write(b)
		return string(b)
	})
	g := startGuest(t, Config{Forwards: []Forward{{GuestPort: 49134, HostAddr: netip.MustParseAddrPort(up.addr), BearerToken: "s3cret-token"}}}, nil)
	c, err := g.dialTCP(t, "10.0.2.2:49134")
	assert.NilError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: 10.0.2.2:49134\r\nAuthorization: Basic Z3Vlc3Q=\r\nauthorization: Bearer forged\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	assert.NilError(t, err)
	r := bufio.NewReader(c)
	head, err := readHead(r)
	assert.NilError(t, err)
	assert.Check(t, strings.HasPrefix(string(head), "HTTP/1.1 101 "))
	greet := make([]byte, len("hello from upstream"))
	_, err = io.ReadFull(r, greet)
	assert.NilError(t, err)
	assert.Equal(t, string(greet), "hello from upstream")
	_, err = io.WriteString(c, "frames after the upgrade")
	assert.NilError(t, err)
	_ = c.CloseWrite()
	back, err := io.ReadAll(r)
	assert.NilError(t, err)
	assert.Equal(t, string(back), "frames after the upgrade")

	up.mu.Lock()
	defer up.mu.Unlock()
	assert.Assert(t, is.Len(up.heads, 1))
	assert.Equal(t, up.heads[0], "GET /ws HTTP/1.1\r\nHost: "+up.addr+"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nAuthorization: Bearer s3cret-token\r\n\r\n")
}

func TestBearerForwardNon101RelaysResponseAndCloses(t *testing.T) {
	up := startUpstream(t, func(c net.Conn, r *bufio.Reader) string {
		_, _ = io.WriteString(c, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 5\r\n\r\nnope\n")
		// Whatever the guest sends afterwards must not arrive.
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		b, _ := io.ReadAll(r)
		return string(b)
	})
	g := startGuest(t, Config{Forwards: []Forward{{GuestPort: 49134, HostAddr: netip.MustParseAddrPort(up.addr), BearerToken: "tok"}}}, nil)
	c, err := g.dialTCP(t, "10.0.2.2:49134")
	assert.NilError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /second HTTP/1.1\r\nHost: x\r\n\r\n")
	assert.NilError(t, err)
	all, err := io.ReadAll(c)
	assert.NilError(t, err)
	assert.Check(t, strings.HasPrefix(string(all), "HTTP/1.1 401 Unauthorized\r\n"), string(all))
	assert.Check(t, strings.HasSuffix(string(all), "\r\n\r\nnope\n"), string(all))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		up.mu.Lock()
		defer up.mu.Unlock()
		if len(up.after) == 0 {
			return poll.Continue("upstream still reading")
		}
		return poll.Success()
	}, poll.WithTimeout(20*time.Second))
	up.mu.Lock()
	defer up.mu.Unlock()
	assert.Equal(t, len(up.heads), 1)
	assert.Equal(t, up.after[0], "", "a second request went through")
}

// An HTTP forward without a token: the upstream's Host, the guest's own
// headers, one request.
func TestHTTPForwardWithoutToken(t *testing.T) {
	up := startUpstream(t, func(c net.Conn, r *bufio.Reader) string {
		_, _ = io.WriteString(c, "HTTP/1.1 403 Forbidden\r\nContent-Length: 3\r\n\r\nno\n")
		return ""
	})
	g := startGuest(t, Config{Forwards: []Forward{{GuestPort: 49134, HostAddr: netip.MustParseAddrPort(up.addr), HTTP: true}}}, nil)
	c, err := g.dialTCP(t, "10.0.2.2:49134")
	assert.NilError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: 10.0.2.2:49134\r\nAuthorization: Bearer mine\r\n\r\n")
	assert.NilError(t, err)
	all, err := io.ReadAll(c)
	assert.NilError(t, err)
	assert.Check(t, strings.HasPrefix(string(all), "HTTP/1.1 403 Forbidden\r\n"), string(all))
	up.mu.Lock()
	defer up.mu.Unlock()
	assert.Equal(t, up.heads[0], "GET / HTTP/1.1\r\nHost: "+up.addr+"\r\nAuthorization: Bearer mine\r\n\r\n")
}

func TestBearerForwardRefusesBody(t *testing.T) {
	up := startUpstream(t, func(net.Conn, *bufio.Reader) string { return "" })
	g := startGuest(t, Config{Forwards: []Forward{{GuestPort: 49134, HostAddr: netip.MustParseAddrPort(up.addr), BearerToken: "tok"}}}, nil)
	c, err := g.dialTCP(t, "10.0.2.2:49134")
	assert.NilError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
	assert.NilError(t, err)
	all, err := io.ReadAll(c)
	assert.NilError(t, err)
	assert.Check(t, strings.HasPrefix(string(all), "HTTP/1.1 400 "), string(all))
	up.mu.Lock()
	defer up.mu.Unlock()
	assert.Equal(t, len(up.heads), 0, "a refused request reached the host")
}

func TestUDPRelayAndRefusal(t *testing.T) {
	echo, got := udpEcho(t)
	g := startGuest(t, Config{}, map[string]string{"udp " + allowedDst + ":5353": echo})

	c := g.dialUDP(t, allowedDst+":5353")
	for i := range 3 {
		_, err := c.Write([]byte("ping"))
		assert.NilError(t, err)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 64)
		n, err := c.Read(buf)
		assert.NilError(t, err, "datagram %d", i)
		assert.Equal(t, string(buf[:n]), "ping")
	}
	assert.Equal(t, got(), 3)
	for _, to := range []string{"10.0.2.2:53", "10.0.2.2:9", "169.254.169.254:80", "192.0.2.2:53", "10.9.9.9:53"} {
		_, err := g.dialUDP(t, to).Write([]byte("x"))
		assert.NilError(t, err)
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if r := g.net.Stats().UDPRefused; r < 5 {
			return poll.Continue("%d refused", r)
		}
		return poll.Success()
	}, poll.WithTimeout(10*time.Second))
	assert.DeepEqual(t, g.dials.list(), []string{"udp " + allowedDst + ":5353"})
}

func TestUDPFlowEndsWhenIdle(t *testing.T) {
	echo, _ := udpEcho(t)
	g := startGuest(t, Config{udpIdle: 200 * time.Millisecond, MaxUDPFlows: 1}, map[string]string{"udp " + allowedDst + ":7": echo})
	c := g.dialUDP(t, allowedDst+":7")
	_, err := c.Write([]byte("a"))
	assert.NilError(t, err)
	buf := make([]byte, 8)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(buf)
	assert.NilError(t, err)
	// With the only slot free again, a second flow can start.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		c2 := g.dialUDP(t, allowedDst+":7")
		_, _ = c2.Write([]byte("b"))
		_ = c2.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := c2.Read(buf); err != nil {
			return poll.Continue("second flow: %v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(20*time.Second))
}

func dnsQuery(t *testing.T, name string, typ dnsmessage.Type) []byte {
	t.Helper()
	q := dnsmessage.Message{Header: dnsmessage.Header{ID: 0x1234, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}}}
	b, err := q.Pack()
	assert.NilError(t, err)
	return b
}

func parseDNS(t *testing.T, b []byte) dnsmessage.Message {
	t.Helper()
	var m dnsmessage.Message
	assert.NilError(t, m.Unpack(b))
	return m
}

// fakeResolver is a loopback DNS server that answers every A query with
// 192.0.2.77, over UDP and TCP on the same port.
func fakeResolver(t *testing.T) (netip.AddrPort, func() int) {
	t.Helper()
	var (
		pc  net.PacketConn
		ln  net.Listener
		err error
	)
	// The kernel picks a free UDP port; the same TCP port may be taken
	// by another process's socket, so try a few.
	for range 20 {
		pc, err = net.ListenPacket("udp", "127.0.0.1:0")
		assert.NilError(t, err)
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		_ = pc.Close()
	}
	assert.NilError(t, err)
	port := pc.LocalAddr().(*net.UDPAddr).Port
	var mu sync.Mutex
	n := 0
	answer := func(q []byte) []byte {
		var m dnsmessage.Message
		if m.Unpack(q) != nil {
			return nil
		}
		mu.Lock()
		n++
		mu.Unlock()
		m.Header.Response = true
		m.Answers = []dnsmessage.Resource{{Header: dnsmessage.ResourceHeader{Name: m.Questions[0].Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 5},
			Body: &dnsmessage.AResource{A: [4]byte{192, 0, 2, 77}}}}
		b, _ := m.Pack()
		return b
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		buf := make([]byte, 65535)
		for {
			m, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if r := answer(buf[:m]); r != nil {
				_, _ = pc.WriteTo(r, from)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			q, err := readDNSTCP(c)
			if err == nil {
				_ = writeDNSTCP(c, answer(q))
			}
			_ = c.Close()
		}
	}()
	t.Cleanup(func() {
		_ = pc.Close()
		_ = ln.Close()
		waitfor.Group(t, &wg, waitfor.Default, "the fake resolver's servers to end")
	})
	return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)), func() int { mu.Lock(); defer mu.Unlock(); return n }
}

func TestDNS(t *testing.T) {
	up, asked := fakeResolver(t)
	g := startGuest(t, Config{DNSServers: []netip.AddrPort{up}}, nil)
	c := g.dialUDP(t, "10.0.2.3:53")
	exchange := func(q []byte) dnsmessage.Message {
		t.Helper()
		_, err := c.Write(q)
		assert.NilError(t, err)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 4096)
		n, err := c.Read(buf)
		assert.NilError(t, err)
		return parseDNS(t, buf[:n])
	}
	m := exchange(dnsQuery(t, "localhost.", dnsmessage.TypeA))
	assert.Equal(t, m.Header.RCode, dnsmessage.RCodeSuccess)
	assert.Equal(t, m.Header.ID, uint16(0x1234))
	assert.Assert(t, is.Len(m.Answers, 1))
	assert.Equal(t, m.Answers[0].Body.(*dnsmessage.AResource).A, [4]byte{127, 0, 0, 1})
	m = exchange(dnsQuery(t, "db.localhost.", dnsmessage.TypeAAAA))
	assert.Equal(t, m.Answers[0].Body.(*dnsmessage.AAAAResource).AAAA, netip.IPv6Loopback().As16())
	m = exchange(dnsQuery(t, "nothing.invalid.", dnsmessage.TypeA))
	assert.Equal(t, m.Header.RCode, dnsmessage.RCodeNameError)
	assert.Equal(t, asked(), 0, "special-use names never leave the stack")

	m = exchange(dnsQuery(t, "example.test.", dnsmessage.TypeA))
	assert.Equal(t, m.Header.RCode, dnsmessage.RCodeSuccess)
	assert.Equal(t, m.Answers[0].Body.(*dnsmessage.AResource).A, [4]byte{192, 0, 2, 77})
	assert.Equal(t, asked(), 1)

	// Over TCP too.
	tc, err := g.dialTCP(t, "10.0.2.3:53")
	assert.NilError(t, err)
	defer tc.Close()
	assert.NilError(t, writeDNSTCP(tc, dnsQuery(t, "example.test.", dnsmessage.TypeA)))
	r, err := readDNSTCP(tc)
	assert.NilError(t, err)
	assert.Equal(t, parseDNS(t, r).Answers[0].Body.(*dnsmessage.AResource).A, [4]byte{192, 0, 2, 77})
	assert.Equal(t, asked(), 2)
	assert.Check(t, is.Len(g.dials.list(), 0), "DNS goes to the host's nameservers, not through the flow dialer")
}

func TestDNSUpstreamDown(t *testing.T) {
	g := startGuest(t, Config{}, nil) // the upstream is 127.0.0.1:1: nothing there
	c := g.dialUDP(t, "10.0.2.3:53")
	_, err := c.Write(dnsQuery(t, "example.test.", dnsmessage.TypeA))
	assert.NilError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	assert.NilError(t, err)
	assert.Equal(t, parseDNS(t, buf[:n]).Header.RCode, dnsmessage.RCodeServerFailure)
}

func TestServeEndsWithContext(t *testing.T) {
	n, err := New(Config{DNSServers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}})
	assert.NilError(t, err)
	a, b := net.Pipe()
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx, a) }()
	cancel()
	select {
	case err := <-done:
		assert.NilError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	assert.ErrorContains(t, n.Serve(context.Background(), b), "serves once")
}

func TestServeEndsOnOversizedFrame(t *testing.T) {
	n, err := New(Config{DNSServers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}})
	assert.NilError(t, err)
	a, b := net.Pipe()
	defer b.Close()
	done := make(chan error, 1)
	go func() { done <- n.Serve(context.Background(), a) }()
	_, _ = b.Write([]byte{0xff, 0xff, 0xff, 0xff})
	select {
	case err := <-done:
		assert.Assert(t, errors.Is(err, ErrFrameTooLarge), "%v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not stop on a broken stream")
	}
}

// TestDialControlRefusesWithoutConnecting uses the real dialer: the
// socket's address is checked before connect(2), so a refused address
// never sees a SYN.
func TestDialControlRefusesWithoutConnecting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- struct{}{}
			_ = c.Close()
		}
	}()
	n, err := New(Config{DNSServers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}})
	assert.NilError(t, err)
	n.ctx = context.Background()
	target := netip.MustParseAddrPort(ln.Addr().String())
	_, err = n.dialFlow(context.Background(), "tcp", target, false)
	assert.Assert(t, errors.Is(err, ErrRefused), "%v", err)
	// A forward may dial exactly its loopback address.
	c, err := n.dialFlow(context.Background(), "tcp", target, true)
	assert.NilError(t, err)
	_ = c.Close()
	select {
	case <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("the forward's dial did not arrive")
	}
	_ = ln.Close()
	select {
	case <-accepted:
		t.Fatal("the refused dial reached the listener")
	default:
	}
	var ne *net.OpError
	_, err = n.dialFlow(context.Background(), "udp", netip.MustParseAddrPort("169.254.169.254:53"), false)
	assert.Assert(t, errors.As(err, &ne) && errors.Is(err, ErrRefused), "%v", err)
	assert.Assert(t, !errors.Is(err, syscall.ECONNREFUSED))
}

func TestConfigValidate(t *testing.T) {
	lo := netip.MustParseAddrPort("127.0.0.1:49134")
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no port", Config{Forwards: []Forward{{HostAddr: lo}}}, "needs a guest port"},
		{"twice", Config{Forwards: []Forward{{GuestPort: 1, HostAddr: lo}, {GuestPort: 1, HostAddr: lo}}}, "twice"},
		{"not loopback", Config{Forwards: []Forward{{GuestPort: 1, HostAddr: netip.MustParseAddrPort("192.0.2.2:80")}}}, "not a loopback"},
		{"no host port", Config{Forwards: []Forward{{GuestPort: 1, HostAddr: netip.MustParseAddrPort("127.0.0.1:0")}}}, "needs an address and a port"},
		{"bad token", Config{Forwards: []Forward{{GuestPort: 1, HostAddr: lo, BearerToken: "a b"}}}, "visible ASCII"},
		{"allow loopback", Config{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, "never reaches"},
		{"flows", Config{MaxTCPFlows: -1}, "flow limits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
