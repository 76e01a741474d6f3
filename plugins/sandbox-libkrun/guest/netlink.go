package guest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
)

// Netlink messages for the three changes the agent makes: bring a link up,
// add an IPv4 address, add a default route. They are built by hand (a few
// dozen bytes each) so the agent needs no netlink library and no `ip`
// binary in the image. Netlink uses the host's byte order.

// Netlink and rtnetlink constants (linux/netlink.h, linux/rtnetlink.h,
// linux/if_addr.h); spelled out so this file builds on every OS and can be
// unit-tested anywhere.
const (
	nlmsgHdrLen   = 16
	nlmsgError    = 2
	nlmF_REQUEST  = 0x1
	nlmF_ACK      = 0x4
	nlmF_EXCL     = 0x200
	nlmF_CREATE   = 0x400
	rtmNewLink    = 16
	rtmNewAddr    = 20
	rtmNewRoute   = 24
	afUnspec      = 0
	afInet        = 2
	iffUp         = 0x1
	ifaAddress    = 1
	ifaLocal      = 2
	rtaGateway    = 5
	rtaOIF        = 4
	rtTableMain   = 254
	rtprotBoot    = 3
	rtScopeUniv   = 0
	rtnUnicast    = 1
	ifinfomsgLen  = 16
	ifaddrmsgLen  = 8
	rtmsgLen      = 12
	rtattrHdrLen  = 4
	nlmsgerrorLen = 4 + nlmsgHdrLen
)

func nlAlign(n int) int { return (n + 3) &^ 3 }

func appendAttr(b []byte, typ uint16, data []byte) []byte {
	l := rtattrHdrLen + len(data)
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func nlMessage(typ, flags uint16, seq uint32, body []byte) []byte {
	b := make([]byte, 0, nlmsgHdrLen+len(body))
	b = binary.NativeEndian.AppendUint32(b, uint32(nlmsgHdrLen+len(body)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags|nlmF_REQUEST|nlmF_ACK)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0) // pid: the kernel fills it
	return append(b, body...)
}

// linkUpMessage sets IFF_UP on interface index.
func linkUpMessage(seq uint32, index int32) []byte {
	body := make([]byte, 0, ifinfomsgLen)
	body = append(body, afUnspec, 0)
	body = binary.NativeEndian.AppendUint16(body, 0) // type
	body = binary.NativeEndian.AppendUint32(body, uint32(index))
	body = binary.NativeEndian.AppendUint32(body, iffUp) // flags
	body = binary.NativeEndian.AppendUint32(body, iffUp) // change mask
	return nlMessage(rtmNewLink, 0, seq, body)
}

// addrMessage adds an IPv4 address with its prefix to interface index.
func addrMessage(seq uint32, index int32, prefix netip.Prefix) []byte {
	addr := prefix.Addr().As4()
	body := make([]byte, 0, ifaddrmsgLen+16)
	body = append(body, afInet, byte(prefix.Bits()), 0, rtScopeUniv)
	body = binary.NativeEndian.AppendUint32(body, uint32(index))
	body = appendAttr(body, ifaLocal, addr[:])
	body = appendAttr(body, ifaAddress, addr[:])
	return nlMessage(rtmNewAddr, nlmF_CREATE|nlmF_EXCL, seq, body)
}

// routeMessage adds a default route through gw on interface index.
func routeMessage(seq uint32, index int32, gw netip.Addr) []byte {
	g := gw.As4()
	body := make([]byte, 0, rtmsgLen+16)
	body = append(body, afInet, 0, 0, 0, rtTableMain, rtprotBoot, rtScopeUniv, rtnUnicast)
	body = binary.NativeEndian.AppendUint32(body, 0) // flags
	body = appendAttr(body, rtaGateway, g[:])
	idx := binary.NativeEndian.AppendUint32(nil, uint32(index))
	body = appendAttr(body, rtaOIF, idx)
	return nlMessage(rtmNewRoute, nlmF_CREATE|nlmF_EXCL, seq, body)
}

// errNoAck means the reply holds no acknowledgement for the request.
var errNoAck = errors.New("netlink: no acknowledgement in the reply")

// parseAck finds the acknowledgement of request seq in a netlink reply and
// returns the kernel's error for it (nil for success).
func parseAck(b []byte, seq uint32) error {
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		typ := binary.NativeEndian.Uint16(b[4:6])
		mseq := binary.NativeEndian.Uint32(b[8:12])
		if l < nlmsgHdrLen || l > len(b) {
			return fmt.Errorf("netlink: message length %d out of range", l)
		}
		if typ == nlmsgError && mseq == seq {
			if l < nlmsgerrorLen {
				return errors.New("netlink: short error message")
			}
			code := int32(binary.NativeEndian.Uint32(b[nlmsgHdrLen : nlmsgHdrLen+4]))
			if code == 0 {
				return nil
			}
			return syscall.Errno(-code)
		}
		b = b[min(nlAlign(l), len(b)):]
	}
	return errNoAck
}
