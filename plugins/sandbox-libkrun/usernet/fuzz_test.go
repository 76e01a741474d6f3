package usernet

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"
)

// FuzzFrameReader: any byte stream reads as frames of at most MaxFrame
// bytes, then an error; nothing panics, and what was read re-encodes to
// the same bytes.
func FuzzFrameReader(f *testing.F) {
	f.Add([]byte{0, 0, 0, 4, 1, 2, 3, 4, 0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 1})
	f.Fuzz(func(t *testing.T, stream []byte) {
		fr := NewFrameReader(bytes.NewReader(stream))
		var again bytes.Buffer
		for {
			fb, err := fr.Next()
			if err != nil {
				if errors.Is(err, io.EOF) && !bytes.Equal(again.Bytes(), stream) {
					t.Fatalf("frames do not re-encode to the stream")
				}
				return
			}
			if len(fb) > MaxFrame {
				t.Fatalf("frame of %d bytes", len(fb))
			}
			if err := WriteFrame(&again, fb); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// FuzzGuestFrames feeds arbitrary frames from a guest into a live
// network (admit filter, ARP, IPv4, TCP, UDP, the DNS service): nothing
// may panic, and the network must still end cleanly. Every dial fails
// without sending anything.
func FuzzGuestFrames(f *testing.F) {
	eth := func(typ uint16, p []byte) []byte {
		b := make([]byte, 14, 14+len(p))
		copy(b, stackMAC)
		binary.BigEndian.PutUint16(b[12:], typ)
		return append(b, p...)
	}
	ipv4 := func(proto byte, dst [4]byte, l4 []byte) []byte {
		p := make([]byte, 20, 20+len(l4))
		p[0], p[8], p[9] = 0x45, 64, proto
		binary.BigEndian.PutUint16(p[2:], uint16(20+len(l4)))
		copy(p[12:16], []byte{10, 0, 2, 15})
		copy(p[16:20], dst[:])
		return eth(etherIPv4, append(p, l4...))
	}
	syn := make([]byte, 20)
	binary.BigEndian.PutUint16(syn[0:], 40000)
	binary.BigEndian.PutUint16(syn[2:], 80)
	syn[12], syn[13] = 5<<4, 0x02
	udpDNS := make([]byte, 8, 8+12)
	binary.BigEndian.PutUint16(udpDNS[0:], 40001)
	binary.BigEndian.PutUint16(udpDNS[2:], 53)
	binary.BigEndian.PutUint16(udpDNS[4:], 20)
	udpDNS = append(udpDNS, 0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0)
	enc := func(frames ...[]byte) []byte {
		var b bytes.Buffer
		for _, fr := range frames {
			_ = WriteFrame(&b, fr)
		}
		return b.Bytes()
	}
	f.Add(enc(ipv4(protoTCP, [4]byte{198, 51, 100, 7}, syn)))
	f.Add(enc(ipv4(protoTCP, [4]byte{10, 0, 2, 2}, syn)))
	f.Add(enc(ipv4(protoUDP, [4]byte{10, 0, 2, 3}, udpDNS)))
	f.Add(enc(ipv4(protoICMP, [4]byte{10, 0, 2, 2}, []byte{8, 0, 0, 0, 0, 1, 0, 1})))
	f.Add(enc(eth(etherARP, []byte{0, 1, 8, 0, 6, 4, 0, 1, 1, 2, 3, 4, 5, 6, 10, 0, 2, 15, 0, 0, 0, 0, 0, 0, 10, 0, 2, 2})))
	f.Fuzz(func(t *testing.T, stream []byte) {
		n, err := New(Config{
			DNSServers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")},
			dial: func(context.Context, string, string) (net.Conn, error) {
				return nil, errors.New("fuzz: no dials")
			},
			hostAddrs: func() ([]netip.Addr, error) { return nil, nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		a, b := net.Pipe()
		done := make(chan error, 1)
		go func() { done <- n.Serve(context.Background(), a) }()
		go func() { _, _ = io.Copy(io.Discard, b) }()
		_ = b.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = b.Write(stream)
		_ = b.Close()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the network did not end")
		}
	})
}
