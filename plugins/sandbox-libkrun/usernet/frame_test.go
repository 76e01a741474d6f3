package usernet

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"gotest.tools/v3/assert"
)

func TestFrameRoundTrip(t *testing.T) {
	var b bytes.Buffer
	frames := [][]byte{bytes.Repeat([]byte{1}, 60), {}, bytes.Repeat([]byte{2}, MaxFrame), []byte("short")}
	for _, f := range frames {
		assert.NilError(t, WriteFrame(&b, f[:len(f)/2], f[len(f)/2:]))
	}
	fr := NewFrameReader(&b)
	for i, want := range frames {
		got, err := fr.Next()
		assert.NilError(t, err, "frame %d", i)
		assert.Assert(t, bytes.Equal(got, want), "frame %d", i)
	}
	_, err := fr.Next()
	assert.Equal(t, err, io.EOF)
}

func TestFrameErrors(t *testing.T) {
	hdr := func(n uint32) []byte { b := make([]byte, 4); binary.BigEndian.PutUint32(b, n); return b }
	_, err := NewFrameReader(bytes.NewReader(hdr(MaxFrame + 1))).Next()
	assert.Assert(t, errors.Is(err, ErrFrameTooLarge))
	_, err = NewFrameReader(bytes.NewReader(append(hdr(10), 1, 2, 3))).Next()
	assert.Equal(t, err, io.ErrUnexpectedEOF)
	_, err = NewFrameReader(bytes.NewReader([]byte{0, 0})).Next()
	assert.Equal(t, err, io.ErrUnexpectedEOF)
	assert.Assert(t, errors.Is(WriteFrame(io.Discard, make([]byte, MaxFrame+1)), ErrFrameTooLarge))
}

func TestAdmit(t *testing.T) {
	eth := func(typ uint16, payload []byte) []byte {
		f := make([]byte, 14, 14+len(payload))
		binary.BigEndian.PutUint16(f[12:], typ)
		return append(f, payload...)
	}
	arp := func(op uint16, sender, target [4]byte) []byte {
		p := make([]byte, 28)
		binary.BigEndian.PutUint16(p[0:], 1)
		binary.BigEndian.PutUint16(p[2:], etherIPv4)
		p[4], p[5] = 6, 4
		binary.BigEndian.PutUint16(p[6:], op)
		copy(p[14:18], sender[:])
		copy(p[24:28], target[:])
		return eth(etherARP, p)
	}
	ip := func(proto byte, src, dst [4]byte) []byte {
		p := make([]byte, 20)
		p[0] = 0x45
		p[9] = proto
		copy(p[12:16], src[:])
		copy(p[16:20], dst[:])
		return eth(etherIPv4, p)
	}
	guest, gw, dns := [4]byte{10, 0, 2, 15}, [4]byte{10, 0, 2, 2}, [4]byte{10, 0, 2, 3}
	for _, tc := range []struct {
		name string
		f    []byte
		want bool
	}{
		{"short", make([]byte, 13), false},
		{"arp who-has gateway", arp(1, guest, gw), true},
		{"arp who-has dns", arp(1, guest, dns), true},
		{"arp who-has another", arp(1, guest, [4]byte{10, 0, 2, 9}), false},
		{"arp who-has itself", arp(1, guest, guest), false},
		{"arp reply from the guest", arp(2, guest, gw), true},
		{"arp reply claiming the gateway", arp(2, gw, guest), false},
		{"arp probe from 0.0.0.0", arp(1, [4]byte{}, gw), false},
		{"arp truncated", arp(1, guest, gw)[:30], false},
		{"tcp out", ip(protoTCP, guest, [4]byte{198, 51, 100, 7}), true},
		{"udp out", ip(protoUDP, guest, [4]byte{198, 51, 100, 7}), true},
		{"ping gateway", ip(protoICMP, guest, gw), true},
		{"ping the world", ip(protoICMP, guest, [4]byte{198, 51, 100, 7}), false},
		{"spoofed source", ip(protoTCP, [4]byte{127, 0, 0, 1}, [4]byte{198, 51, 100, 7}), false},
		{"source the gateway", ip(protoTCP, gw, dns), false},
		{"dhcp from 0.0.0.0", ip(protoUDP, [4]byte{}, [4]byte{255, 255, 255, 255}), false},
		{"igmp", ip(2, guest, [4]byte{224, 0, 0, 22}), false},
		{"ipv6", eth(0x86dd, make([]byte, 40)), false},
		{"vlan", eth(0x8100, make([]byte, 40)), false},
		{"ipv4 truncated", ip(protoTCP, guest, gw)[:30], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, admit(tc.f), tc.want)
		})
	}
}
