package usernet

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

var rawGuestMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}

// rawSegment is an Ethernet frame holding an IPv4 packet from src to dst
// with a TCP SYN or a UDP datagram, as a root guest can send any.
func rawSegment(proto byte, src, dst netip.AddrPort, payload []byte) []byte {
	var l4 []byte
	if proto == protoTCP {
		l4 = make([]byte, 20)
		binary.BigEndian.PutUint32(l4[4:], 1000) // seq
		l4[12], l4[13] = 5<<4, 0x02              // SYN
		binary.BigEndian.PutUint16(l4[14:], 65535)
	} else {
		l4 = make([]byte, 8, 8+len(payload))
		binary.BigEndian.PutUint16(l4[4:], uint16(8+len(payload)))
		l4 = append(l4, payload...)
	}
	binary.BigEndian.PutUint16(l4[0:], src.Port())
	binary.BigEndian.PutUint16(l4[2:], dst.Port())
	ip := make([]byte, 20, 20+len(l4))
	ip[0], ip[8], ip[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	f := make([]byte, 14, 14+len(ip)+len(l4))
	copy(f[0:6], stackMAC)
	copy(f[6:12], rawGuestMAC)
	binary.BigEndian.PutUint16(f[12:], etherIPv4)
	return append(append(f, ip...), l4...)
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// arpReplyTo answers the stack's "who has 10.0.2.15".
func arpReplyTo(req []byte) []byte {
	p := make([]byte, 28)
	binary.BigEndian.PutUint16(p[0:], 1)
	binary.BigEndian.PutUint16(p[2:], etherIPv4)
	p[4], p[5] = 6, 4
	binary.BigEndian.PutUint16(p[6:], 2)
	copy(p[8:14], rawGuestMAC)
	g4 := GuestAddr.As4()
	copy(p[14:18], g4[:])
	copy(p[18:24], req[6:12])
	copy(p[24:28], req[14+14:14+18])
	f := make([]byte, 14, 42)
	copy(f[0:6], req[6:12])
	copy(f[6:12], rawGuestMAC)
	binary.BigEndian.PutUint16(f[12:], etherARP)
	return append(f, p...)
}

// TestRawRefusals sends what only a root guest crafting packets can send:
// flows to loopback, unspecified, multicast and broadcast addresses, and
// from spoofed sources. None may be dialled; a TCP SYN to a unicast
// address gets a RST.
func TestRawRefusals(t *testing.T) {
	// Loopback listeners the probes aim at: they must get nothing.
	tcpLo, accepted := tcpEcho(t)
	udpLo, got := udpEcho(t)
	tn := startNet(t, Config{}, nil)
	defer func() { assert.Check(t, tn.wait()) }()
	guest := netip.AddrPortFrom(GuestAddr, 40000)
	loTCP, loUDP := netip.MustParseAddrPort(tcpLo), netip.MustParseAddrPort(udpLo)
	type probe struct {
		name    string
		frame   []byte
		wantRST bool
	}
	var probes []probe
	for i, dst := range []string{"10.0.2.2:22", "169.254.169.254:80", "192.0.2.2:80"} {
		src := netip.AddrPortFrom(GuestAddr, uint16(41000+i))
		probes = append(probes, probe{"tcp " + dst, rawSegment(protoTCP, src, netip.MustParseAddrPort(dst), nil), true})
	}
	// Martians: the stack drops them before TCP sees them.
	for _, dst := range []string{tcpLo, "127.0.0.53:53", "0.0.0.0:" + fmt.Sprint(loTCP.Port()), "224.0.0.1:80", "255.255.255.255:80", "10.0.2.255:80"} {
		probes = append(probes, probe{"tcp " + dst, rawSegment(protoTCP, guest, netip.MustParseAddrPort(dst), nil), false})
	}
	for _, dst := range []string{udpLo, "0.0.0.0:" + fmt.Sprint(loUDP.Port()), "224.0.0.251:5353", "255.255.255.255:67", "10.0.2.255:137", "169.254.169.254:53", "10.0.2.2:53"} {
		probes = append(probes, probe{"udp " + dst, rawSegment(protoUDP, guest, netip.MustParseAddrPort(dst), []byte("x")), false})
	}
	// Spoofed sources never reach the stack at all.
	for _, src := range []string{"127.0.0.1:40000", "10.0.2.2:40000", "0.0.0.0:68", "192.0.2.2:40000"} {
		probes = append(probes, probe{"spoofed " + src, rawSegment(protoTCP, netip.MustParseAddrPort(src), netip.MustParseAddrPort("198.51.100.7:80"), nil), false})
	}

	resets := map[uint16]bool{}
	frames := make(chan []byte, 64)
	go func() {
		defer close(frames)
		fr := NewFrameReader(tn.guest)
		for {
			f, err := fr.Next()
			if err != nil {
				return
			}
			frames <- append([]byte(nil), f...)
		}
	}()
	for _, p := range probes {
		assert.NilError(t, WriteFrame(tn.guest, p.frame), p.name)
	}
	want := 0
	for _, p := range probes {
		if p.wantRST {
			want++
		}
	}
	deadline := time.After(20 * time.Second)
	for len(resets) < want {
		select {
		case f, ok := <-frames:
			assert.Assert(t, ok, "the network closed the stream")
			switch binary.BigEndian.Uint16(f[12:14]) {
			case etherARP:
				if binary.BigEndian.Uint16(f[20:22]) == 1 {
					assert.NilError(t, WriteFrame(tn.guest, arpReplyTo(f)))
				}
			case etherIPv4:
				ip := f[14:]
				if ip[9] == protoTCP && ip[20+13]&0x04 != 0 {
					resets[binary.BigEndian.Uint16(ip[22:24])] = true
				}
			}
		case <-deadline:
			t.Fatalf("got %d of %d resets: %v", len(resets), want, resets)
		}
	}
	// Let the rest be processed, then nothing may have been dialled.
	time.Sleep(200 * time.Millisecond)
	assert.DeepEqual(t, tn.dials.list(), []string(nil))
	assert.Equal(t, accepted(), 0)
	assert.Equal(t, got(), 0)
	st := tn.net.Stats()
	assert.Check(t, st.FramesDropped >= 4, "spoofed sources: %+v", st)
}

// TestServeEndsMidHandshake: a guest that goes away between its SYN and
// its final ACK (a killed VM, or the ACK lost as it stops) must not hold
// Serve for the stack's SYN-ACK retries, a minute or more: the flow's
// handler, waiting in the handshake, ends with the network.
func TestServeEndsMidHandshake(t *testing.T) {
	echo, _ := tcpEcho(t)
	tn := startNet(t, Config{}, map[string]string{"tcp " + allowedDst + ":80": echo})
	frames := make(chan []byte, 64)
	go func() {
		defer close(frames)
		fr := NewFrameReader(tn.guest)
		for {
			f, err := fr.Next()
			if err != nil {
				return
			}
			frames <- append([]byte(nil), f...)
		}
	}()
	src := netip.AddrPortFrom(GuestAddr, 40000)
	assert.NilError(t, WriteFrame(tn.guest, rawSegment(protoTCP, src, netip.MustParseAddrPort(allowedDst+":80"), nil)))
	deadline := time.After(20 * time.Second)
	for synAck := false; !synAck; {
		select {
		case f, ok := <-frames:
			assert.Assert(t, ok, "the network closed the stream")
			switch binary.BigEndian.Uint16(f[12:14]) {
			case etherARP:
				if binary.BigEndian.Uint16(f[20:22]) == 1 {
					assert.NilError(t, WriteFrame(tn.guest, arpReplyTo(f)))
				}
			case etherIPv4:
				ip := f[14:]
				synAck = ip[9] == protoTCP && ip[20+13]&0x12 == 0x12
			}
		case <-deadline:
			t.Fatal("no SYN-ACK")
		}
	}
	// The handler now waits for an ACK that never comes.
	start := time.Now()
	assert.NilError(t, tn.wait())
	for range frames {
	}
	assert.Check(t, time.Since(start) < 10*time.Second, "Serve took %v", time.Since(start))
	assert.Equal(t, tn.net.Stats().TCPFlows, uint64(0))
	assert.DeepEqual(t, tn.dials.list(), []string{"tcp " + allowedDst + ":80"})
}
