// Package peeruid finds which local user owns the other end of a loopback
// TCP connection, from the kernel's socket tables (Linux: /proc/net/tcp
// and tcp6). The stream socket uses it to let in only the engine user's
// own processes when it has no auth function (docs/security.md).
package peeruid

import (
	"bufio"
	"encoding/hex"
	"errors"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// tables are the kernel's TCP socket tables.
var tables = [...]string{"/proc/net/tcp", "/proc/net/tcp6"}

// Of returns the uid that owns the socket whose local address is peer and
// whose remote address is server: the client's end of a connection the
// server accepted. ok is false where the tables cannot be read (not
// Linux) or hold no such socket.
func Of(server, peer netip.AddrPort) (uid int, ok bool) {
	for _, path := range tables {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		uid, ok = Scan(f, server, peer)
		f.Close()
		if ok {
			return uid, true
		}
	}
	return 0, false
}

// Scan reads one table ("sl local_address rem_address st tx:rx tr:when
// retrnsmt uid ...", a header line first) for the socket local=peer,
// remote=server.
func Scan(r io.Reader, server, peer netip.AddrPort) (int, bool) {
	sc := bufio.NewScanner(r)
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 {
			continue
		}
		local, err1 := ParseAddr(fields[1])
		remote, err2 := ParseAddr(fields[2])
		if err1 != nil || err2 != nil || !same(local, peer) || !same(remote, server) {
			continue
		}
		uid, err := strconv.Atoi(fields[7])
		if err != nil || uid < 0 {
			continue
		}
		return uid, true
	}
	return 0, false
}

func same(a, b netip.AddrPort) bool {
	return a.Port() == b.Port() && a.Addr().Unmap() == b.Addr().Unmap()
}

// ParseAddr reads the kernel's HEXIP:HEXPORT: an IPv4 address as one
// 32-bit word, an IPv6 one as four, each in the host's byte order (little
// endian on every platform with these tables that iii runs on).
func ParseAddr(s string) (netip.AddrPort, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return netip.AddrPort{}, errors.New("no port")
	}
	port, err := strconv.ParseUint(s[i+1:], 16, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	raw, err := hex.DecodeString(s[:i])
	if err != nil {
		return netip.AddrPort{}, err
	}
	if len(raw) != 4 && len(raw) != 16 {
		return netip.AddrPort{}, errors.New("bad address length")
	}
	for w := 0; w < len(raw); w += 4 {
		raw[w], raw[w+1], raw[w+2], raw[w+3] = raw[w+3], raw[w+2], raw[w+1], raw[w]
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr, uint16(port)), nil
}
