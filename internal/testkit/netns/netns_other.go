//go:build !linux

package netns

import (
	"net"
	"net/netip"
	"testing"
)

// Host is a test host in a network namespace; there are none here.
type Host struct {
	Name          string
	Addr, Gateway netip.Addr
}

// Start skips the test: network namespaces are Linux's.
func Start(t testing.TB) *Host {
	t.Helper()
	t.Skip("a test host needs a Linux network namespace")
	return nil
}

// Listen is never reached (Start skipped).
func (h *Host) Listen(t testing.TB, network string, port int) (net.Listener, net.PacketConn) {
	t.Helper()
	t.Skip("a test host needs a Linux network namespace")
	return nil, nil
}

// Echo is never reached (Start skipped).
func (h *Host) Echo(t testing.TB) (netip.AddrPort, func() int) {
	t.Helper()
	t.Skip("a test host needs a Linux network namespace")
	return netip.AddrPort{}, nil
}
