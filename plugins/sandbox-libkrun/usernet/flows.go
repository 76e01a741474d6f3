package usernet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// flowKind is where a guest flow goes.
type flowKind int

const (
	flowDirect  flowKind = iota // a host socket to the destination the guest named
	flowForward                 // a Forward's loopback address
	flowDNS                     // the stack's DNS service
)

// route decides a flow's fate before anything is dialled: the gateway's
// forwarded ports, the DNS service, or a destination the policy allows.
func (n *Network) route(network string, dst netip.Addr, port uint16) (flowKind, netip.AddrPort, *Forward, error) {
	switch dst {
	case GatewayAddr:
		if f, ok := n.forwards[port]; ok && network == "tcp" {
			return flowForward, f.HostAddr, &f, nil
		}
		return 0, netip.AddrPort{}, nil, fmt.Errorf("%s %s:%d: %w (no forward on the gateway's port)", network, dst, port, ErrRefused)
	case DNSAddr:
		if port == 53 {
			return flowDNS, netip.AddrPort{}, nil, nil
		}
		return 0, netip.AddrPort{}, nil, fmt.Errorf("%s %s:%d: %w (the DNS address serves port 53 only)", network, dst, port, ErrRefused)
	}
	if port == 0 {
		return 0, netip.AddrPort{}, nil, fmt.Errorf("%s %s:0: %w (port 0)", network, dst, ErrRefused)
	}
	if err := n.policy.Check(dst); err != nil {
		return 0, netip.AddrPort{}, nil, fmt.Errorf("%s port %d: %w", network, port, err)
	}
	return flowDirect, netip.AddrPortFrom(dst, port), nil, nil
}

// handleTCP takes a guest's SYN (in a goroutine of the stack's). The host
// side is dialled before the guest's handshake completes, so a refusal or
// a failed dial reaches the guest as a RST at once.
func (n *Network) handleTCP(r *tcp.ForwarderRequest) {
	if !n.flows.Add() {
		r.Complete(true)
		return
	}
	defer n.flows.Done()
	id := r.ID()
	dst, ok := addrOf(id.LocalAddress)
	if !ok {
		r.Complete(true)
		return
	}
	kind, target, fwd, err := n.route("tcp", dst, id.LocalPort)
	if err != nil {
		n.st.tcpRefused.Add(1)
		n.log.Debug("guest TCP refused", "reason", err)
		r.Complete(true)
		return
	}
	select {
	case n.tcpSlots <- struct{}{}:
		defer func() { <-n.tcpSlots }()
	default:
		n.st.tcpRefused.Add(1)
		n.log.Debug("guest TCP refused: too many flows", "dst", target, "max", cap(n.tcpSlots))
		r.Complete(true)
		return
	}
	var host net.Conn
	if kind != flowDNS {
		dctx, cancel := context.WithTimeout(n.ctx, dialTimeout)
		host, err = n.dialFlow(dctx, "tcp", target, kind == flowForward)
		cancel()
		if err != nil {
			n.log.Debug("guest TCP: host dial failed", "dst", target, "error", err)
			r.Complete(true)
			return
		}
	}
	// CreateEndpoint waits for the guest's final ACK, which never comes
	// once the network has ended: Serve aborts the handshakes it finds,
	// and this check keeps most from starting after that.
	if n.ctx.Err() != nil {
		if host != nil {
			_ = host.Close()
		}
		r.Complete(true)
		return
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	r.Complete(false)
	if terr != nil {
		if host != nil {
			_ = host.Close()
		}
		return
	}
	guest := gonet.NewTCPConn(&wq, ep)
	n.st.tcpFlows.Add(1)
	switch {
	case kind == flowDNS:
		n.serveDNSTCP(n.ctx, guest)
	case fwd != nil && fwd.httpMode():
		if err := relayHTTP(n.ctx, guest, host, fwd.HostAddr.String(), fwd.BearerToken); err != nil {
			n.log.Debug("HTTP forward ended", "guest_port", fwd.GuestPort, "error", err)
		}
	default:
		relay(n.ctx, guest, host)
	}
}

// handleUDP takes the first datagram of a new guest UDP flow (in the
// stack's inbound path: it must not block). A refused one is dropped.
func (n *Network) handleUDP(r *udp.ForwarderRequest) {
	id := r.ID()
	dst, ok := addrOf(id.LocalAddress)
	if !ok {
		return
	}
	kind, target, _, err := n.route("udp", dst, id.LocalPort)
	if err != nil {
		n.st.udpRefused.Add(1)
		n.log.Debug("guest UDP refused", "reason", err)
		return
	}
	select {
	case n.udpSlots <- struct{}{}:
	default:
		n.st.udpRefused.Add(1)
		n.log.Debug("guest UDP refused: too many flows", "dst", dst, "max", cap(n.udpSlots))
		return
	}
	release := func() { <-n.udpSlots }
	if !n.flows.Add() {
		release()
		return
	}
	var host net.Conn
	if kind == flowDirect {
		// Connecting a UDP socket sends nothing and does not block.
		if host, err = n.dialFlow(n.ctx, "udp", target, false); err != nil {
			n.log.Debug("guest UDP: host socket failed", "dst", target, "error", err)
			release()
			n.flows.Done()
			return
		}
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		if host != nil {
			_ = host.Close()
		}
		release()
		n.flows.Done()
		return
	}
	guest := gonet.NewUDPConn(&wq, ep)
	n.st.udpFlows.Add(1)
	go func() {
		defer n.flows.Done()
		defer release()
		if kind == flowDNS {
			n.serveDNSUDP(n.ctx, guest)
			return
		}
		relayUDP(n.ctx, guest, host, n.udpIdle)
	}()
}

// serveDNSUDP answers the DNS queries of one guest UDP flow until it is
// idle for dnsIdle.
func (n *Network) serveDNSUDP(ctx context.Context, guest *gonet.UDPConn) {
	stop := context.AfterFunc(ctx, func() { _ = guest.Close() })
	defer stop()
	defer guest.Close()
	buf := make([]byte, maxDNSMessage)
	for {
		_ = guest.SetReadDeadline(time.Now().Add(dnsIdle))
		m, err := guest.Read(buf)
		if err != nil {
			return
		}
		n.st.dnsQueries.Add(1)
		if r := n.dns.answer(ctx, buf[:m], m, false); r != nil {
			_ = guest.SetWriteDeadline(time.Now().Add(dnsIdle))
			if _, err := guest.Write(r); err != nil {
				return
			}
		}
	}
}

// serveDNSTCP answers the length-prefixed DNS queries of one guest TCP
// connection until it is idle for dnsIdle.
func (n *Network) serveDNSTCP(ctx context.Context, guest *gonet.TCPConn) {
	stop := context.AfterFunc(ctx, func() { _ = guest.Close() })
	defer stop()
	defer guest.Close()
	for {
		_ = guest.SetDeadline(time.Now().Add(dnsIdle))
		q, size, err := readDNSQueryTCP(guest)
		if err != nil {
			return
		}
		n.st.dnsQueries.Add(1)
		r := n.dns.answer(ctx, q, size, true)
		if r == nil {
			return
		}
		if err := writeDNSTCP(guest, r); err != nil {
			return
		}
	}
}

// relayUDP relays datagrams between the guest's flow and its host socket
// until neither side sent one for idle, or ctx ends.
func relayUDP(ctx context.Context, guest *gonet.UDPConn, host net.Conn, idle time.Duration) {
	closeBoth := func() { _ = guest.Close(); _ = host.Close() }
	stop := context.AfterFunc(ctx, closeBoth)
	defer stop()
	var last lastSeen
	last.touch()
	done := make(chan struct{})
	copyDatagrams := func(dst, src net.Conn) {
		buf := make([]byte, 65535)
		for {
			_ = src.SetReadDeadline(time.Now().Add(idle))
			m, err := src.Read(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() && !last.olderThan(idle) {
					continue // the other direction is busy
				}
				return
			}
			last.touch()
			_ = dst.SetWriteDeadline(time.Now().Add(idle))
			if _, err := dst.Write(buf[:m]); err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue // dropped, as a full queue would
				}
				return
			}
		}
	}
	go func() {
		defer close(done)
		copyDatagrams(guest, host)
	}()
	copyDatagrams(host, guest)
	closeBoth()
	<-done
}
