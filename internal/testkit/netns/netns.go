//go:build linux

// Package netns gives a test a host of its own: a network namespace joined
// to this one by a veth pair on a /30 of the benchmarking range
// 198.18.0.0/15 (RFC 2544: neither a private nor a public range), the first
// test on 198.18.0.1 (this side) and 198.18.0.2 (the namespace). It is the
// one place besides loopback that tests may send packets to: a VM whose
// network policy allows public addresses reaches it, and nothing else is
// needed to prove that networking works.
//
// It needs root and the ip command; Start skips the test without them.
package netns

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/iii-sandbox/iii/internal/testkit/tcpserve"
)

// Host is the namespace's end: its address, and listeners opened inside it.
type Host struct {
	// Name is the namespace's name (ip netns).
	Name string
	// Addr is the namespace's address; Gateway is this side's.
	Addr, Gateway netip.Addr
	// Link is this side's end of the veth pair.
	Link   string
	nsPath string
}

// SetLink sets this side's end of the link down or up: a partition
// (nothing passes either way and nobody is told) and its healing. The
// addresses and routes come back with the link.
func (h *Host) SetLink(t testing.TB, up bool) {
	t.Helper()
	state := "down"
	if up {
		state = "up"
	}
	if out, err := exec.Command("ip", "link", "set", h.Link, state).CombinedOutput(); err != nil {
		t.Fatalf("ip link set %s %s: %v: %s", h.Link, state, err, bytes.TrimSpace(out))
	}
}

// maxBlocks bounds the /30 blocks tried in 198.18.0.0/16; a block is taken
// by whichever test creates its namespace name first, so tests in
// parallel packages get different blocks.
const maxBlocks = 1024

// Start creates the namespace and its veth pair, and removes them in the
// test's clean-up.
func Start(t testing.TB) *Host {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace (the test host the VM reaches)")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("needs the ip command (iproute2) to create a network namespace")
	}
	run := func(args ...string) error {
		out, err := exec.Command(ip, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
		return nil
	}
	for k := 0; k < maxBlocks; k++ {
		name := fmt.Sprintf("iii-test-%d", k)
		if run("netns", "add", name) != nil {
			continue // taken (another test, or a leftover)
		}
		t.Cleanup(func() { _ = run("netns", "del", name) })
		base := netip.AddrFrom4([4]byte{198, 18, byte(k * 4 / 256), byte(k * 4 % 256)})
		gw, addr := base.Next(), base.Next().Next()
		hostIf, nsIf := fmt.Sprintf("iiit%dh", k), fmt.Sprintf("iiit%dn", k)
		for _, args := range [][]string{
			{"link", "add", hostIf, "type", "veth", "peer", "name", nsIf},
			// No IPv6 on the test link: no router solicitations or
			// address detection packets at all.
			{"link", "set", hostIf, "addrgenmode", "none"},
			{"link", "set", nsIf, "addrgenmode", "none"},
			{"link", "set", nsIf, "netns", name},
			{"addr", "add", gw.String() + "/30", "dev", hostIf},
			{"-n", name, "addr", "add", addr.String() + "/30", "dev", nsIf},
			{"link", "set", hostIf, "up"},
			{"-n", name, "link", "set", nsIf, "up"},
			{"-n", name, "link", "set", "lo", "up"},
		} {
			if err := run(args...); err != nil {
				_ = run("link", "del", hostIf)
				t.Fatalf("set up the test host: %v", err)
			}
		}
		t.Cleanup(func() { _ = run("link", "del", hostIf) })
		return &Host{Name: name, Addr: addr, Gateway: gw, Link: hostIf, nsPath: filepath.Join("/run/netns", name)}
	}
	t.Fatalf("no free test network namespace among iii-test-0 to iii-test-%d", maxBlocks-1)
	return nil
}

// inside runs fn on a thread that has joined the namespace: a socket made
// there stays in the namespace for its whole life, whichever thread uses
// it later.
func (h *Host) inside(fn func() error) error {
	ns, err := os.Open(h.nsPath)
	if err != nil {
		return err
	}
	defer ns.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer self.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			// The thread stays locked and dies with this goroutine
			// rather than run other goroutines in the namespace.
			errc <- fmt.Errorf("leave the namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Listen opens a listener inside the namespace, on its address ("tcp" or
// "udp"; port 0 picks one).
func (h *Host) Listen(t testing.TB, network string, port int) (tcp net.Listener, udp net.PacketConn) {
	t.Helper()
	addr := net.JoinHostPort(h.Addr.String(), fmt.Sprint(port))
	err := h.inside(func() error {
		var err error
		if network == "udp" {
			udp, err = net.ListenPacket("udp4", addr)
		} else {
			tcp, err = net.Listen("tcp4", addr)
		}
		return err
	})
	if err != nil {
		t.Fatalf("listen on the test host: %v", err)
	}
	t.Cleanup(func() {
		if tcp != nil {
			_ = tcp.Close()
		}
		if udp != nil {
			_ = udp.Close()
		}
	})
	return tcp, udp
}

// Echo serves a TCP echo on the test host and returns its address and a
// count of the connections it accepted.
func (h *Host) Echo(t testing.TB) (addr netip.AddrPort, accepted func() int) {
	t.Helper()
	ln, _ := h.Listen(t, "tcp", 0)
	return netip.MustParseAddrPort(ln.Addr().String()), tcpserve.Serve(t, ln, tcpserve.Echo)
}
