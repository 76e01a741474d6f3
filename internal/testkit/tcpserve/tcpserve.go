// Package tcpserve runs the small TCP servers tests stand up (echo servers,
// scripted upstreams): the accept loop, a goroutine per connection, and a
// clean-up that closes everything and waits for the handlers.
package tcpserve

import (
	"net"
	"sync"
	"testing"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// Serve accepts on ln until the test ends, running handle for each
// connection on its own goroutine, and returns a count of the connections
// accepted so far. At clean-up it closes ln and every connection still
// open, and waits for the handlers to return.
func Serve(t testing.TB, ln net.Listener, handle func(net.Conn)) (accepted func() int) {
	t.Helper()
	var mu sync.Mutex
	n := 0
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			n++
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		waitfor.Group(t, &wg, waitfor.Default, "the accept loop and the connection handlers to return")
	})
	return func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// Echo writes back what it reads until the peer closes, then half-closes
// its side (TCP), so the peer sees every byte and then the end.
func Echo(c net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		m, err := c.Read(buf)
		if err != nil {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
		if _, err := c.Write(buf[:m]); err != nil {
			return
		}
	}
}
