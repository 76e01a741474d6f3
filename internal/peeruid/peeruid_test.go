package peeruid

import (
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

const table = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:0C28 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0 100 0 0 10 0
   1: 0100007F:D431 0100007F:0C28 01 00000000:00000000 00:00000000 00000000  1001        0 2 1 0 20 4 30 10 -1
   2: 0100007F:0C28 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 3 1 0 20 4 30 10 -1
`

func TestScan(t *testing.T) {
	server := netip.MustParseAddrPort("127.0.0.1:3112")
	uid, ok := Scan(strings.NewReader(table), server, netip.MustParseAddrPort("127.0.0.1:54321"))
	assert.Assert(t, ok)
	assert.Equal(t, uid, 1001, "the client's end, not the server's")
	_, ok = Scan(strings.NewReader(table), server, netip.MustParseAddrPort("127.0.0.1:54322"))
	assert.Assert(t, !ok)
	a, err := ParseAddr("0000000000000000FFFF00000100007F:0C28")
	assert.NilError(t, err)
	assert.Equal(t, a.Addr().Unmap(), netip.MustParseAddr("127.0.0.1"))
}

// A real loopback connection's client end is this process's user's.
func TestOfRealConnection(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the socket tables are Linux's")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	assert.NilError(t, err)
	defer c.Close()
	var s net.Conn
	select {
	case s = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("no connection accepted")
	}
	defer s.Close()
	uid, ok := Of(netip.MustParseAddrPort(s.LocalAddr().String()), netip.MustParseAddrPort(s.RemoteAddr().String()))
	assert.Assert(t, ok)
	assert.Equal(t, uid, os.Getuid())
}

func FuzzParseAddr(f *testing.F) {
	f.Add("0100007F:0C28")
	f.Add("0000000000000000FFFF00000100007F:0C28")
	f.Add(":")
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = ParseAddr(s)
		_, _ = Scan(strings.NewReader("h\n0: "+s+" "+s+" 01 a b c 1000\n"), netip.AddrPort{}, netip.AddrPort{})
	})
}
