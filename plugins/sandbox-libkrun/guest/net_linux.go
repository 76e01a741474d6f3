package guest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// Network configures interfaces with rtnetlink.
type Network struct {
	// Root is where /etc/resolv.conf is written ("/" in the VM).
	Root string
	// LinkWait bounds how long Configure waits for the interface to
	// appear (virtio_net probes asynchronously).
	LinkWait time.Duration
}

var _ NetConfigurer = (*Network)(nil)

// Configure brings lo and the interface up, adds the address and the
// default route, and writes resolv.conf. It is idempotent: an address or
// route that already exists is not an error.
func (n *Network) Configure(ctx context.Context, req *agentproto.NetRequest) (*agentproto.NetResult, error) {
	ifname := or(req.Interface, DefaultInterface)
	prefix, err := netip.ParsePrefix(or(req.Address, DefaultAddress))
	if err != nil || !prefix.Addr().Is4() {
		return nil, agentproto.Errorf(agentproto.CodeInvalidRequest, "address %q is not an IPv4 CIDR such as 10.0.2.15/24", req.Address)
	}
	gw, err := netip.ParseAddr(or(req.Gateway, DefaultGateway))
	if err != nil || !gw.Is4() {
		return nil, agentproto.Errorf(agentproto.CodeInvalidRequest, "gateway %q is not an IPv4 address", req.Gateway)
	}
	dns := req.DNS
	if len(dns) == 0 {
		dns = []string{DefaultDNS}
	}
	for _, d := range dns {
		if _, err := netip.ParseAddr(d); err != nil {
			return nil, agentproto.Errorf(agentproto.CodeInvalidRequest, "dns server %q is not an IP address", d)
		}
	}

	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return nil, fmt.Errorf("find lo: %w", err)
	}
	ifc, err := waitInterface(ctx, ifname, or(n.LinkWait, 5*time.Second))
	if err != nil {
		return nil, err
	}
	nl, err := openNetlink()
	if err != nil {
		return nil, err
	}
	defer unix.Close(nl)
	steps := []struct {
		what string
		msg  func(seq uint32) []byte
	}{
		{"bring lo up", func(s uint32) []byte { return linkUpMessage(s, int32(lo.Index)) }},
		{"bring " + ifname + " up", func(s uint32) []byte { return linkUpMessage(s, int32(ifc.Index)) }},
		{"add " + prefix.String() + " to " + ifname, func(s uint32) []byte { return addrMessage(s, int32(ifc.Index), prefix) }},
		{"add default route via " + gw.String(), func(s uint32) []byte { return routeMessage(s, int32(ifc.Index), gw) }},
	}
	for i, st := range steps {
		if err := netlinkDo(nl, uint32(i+1), st.msg(uint32(i+1))); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("%s: %w", st.what, err)
		}
	}
	if err := n.writeResolvConf(dns); err != nil {
		return nil, err
	}
	if req.Hostname != "" {
		if err := unix.Sethostname([]byte(req.Hostname)); err != nil {
			return nil, fmt.Errorf("set hostname: %w", err)
		}
	}
	return &agentproto.NetResult{Interface: ifname, Address: prefix.String()}, nil
}

func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func waitInterface(ctx context.Context, name string, wait time.Duration) (*net.Interface, error) {
	deadline := time.Now().Add(wait)
	for {
		ifc, err := net.InterfaceByName(name)
		if err == nil {
			return ifc, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("interface %s not found (is virtio_net loaded and a network device attached?): %w", name, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func openNetlink() (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return -1, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		_ = unix.Close(fd)
		return -1, fmt.Errorf("netlink bind: %w", err)
	}
	tv := unix.Timeval{Sec: 5}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	return fd, nil
}

func netlinkDo(fd int, seq uint32, msg []byte) error {
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if err := parseAck(buf[:n], seq); !errors.Is(err, errNoAck) {
			return err
		}
	}
}

// writeResolvConf replaces /etc/resolv.conf, which in many images is a
// symlink into a resolver daemon's runtime directory that does not exist
// here.
func (n *Network) writeResolvConf(servers []string) error {
	etc := filepath.Join(or(n.Root, "/"), "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	var b strings.Builder
	for _, s := range servers {
		b.WriteString("nameserver " + s + "\n")
	}
	p := filepath.Join(etc, "resolv.conf")
	tmp := p + ".iii-tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("resolv.conf: %w", err)
	}
	return nil
}
