// Package loopback tells loopback names and addresses apart from others,
// for the listeners that serve only this machine: a browser page can reach
// a loopback port by a DNS name that resolves to 127.0.0.1 (DNS
// rebinding), so such listeners check the Host a request names too.
package loopback

import (
	"net"
	"strings"
)

// Host reports whether a request's Host names the loopback interface:
// 127.0.0.1, localhost or [::1], with or without a port.
func Host(host string) bool {
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	} else if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	switch strings.ToLower(h) {
	case "127.0.0.1", "localhost", "::1":
		return true
	}
	return false
}

// Addr reports whether a host:port address is a loopback one.
func Addr(addr string) bool {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, for
// tests and benchmark harnesses that start a server on a port of their
// choosing (another process may still take it first).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
