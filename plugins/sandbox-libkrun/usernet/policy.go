package usernet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Ranges a guest never reaches, whatever the configuration says.
var neverRanges = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved or broadcast"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// PrivateRanges are refused unless network_allow_cidrs names them: the
// host's LAN, a VPC, a container bridge, carrier-grade NAT.
var PrivateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("fc00::/7"),
}

// ErrRefused is what every policy refusal wraps.
var ErrRefused = errors.New("refused by the sandbox network policy")

func refused(a netip.Addr, why string) error {
	return fmt.Errorf("%s: %w (%s)", a, ErrRefused, why)
}

// ParseAllowCIDRs reads network_allow_cidrs: ranges a guest may reach
// beyond public addresses (private ranges are refused by default). A range
// that overlaps loopback, link-local, unspecified, multicast or reserved
// addresses is an error: those stay closed whatever is allowed, and a range
// such as 0.0.0.0/0 that would name them is a mistake. The host's own
// addresses and the guest's virtual network (10.0.2.0/24) are refused even
// inside an allowed range.
func ParseAllowCIDRs(items []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(items))
	for i, s := range items {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("item %d %q is not a CIDR such as 192.168.10.0/24: %v", i, truncate(s, 60), err)
		}
		p = p.Masked()
		if p.Addr().Is4In6() {
			return nil, fmt.Errorf("item %d %q: write IPv4 ranges in IPv4 form", i, s)
		}
		for _, n := range neverRanges {
			if p.Overlaps(n.prefix) {
				return nil, fmt.Errorf("item %d %q overlaps %s (%s), which a guest never reaches", i, s, n.prefix, n.why)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Policy decides which destinations a guest's flows may be dialled to.
// It is fail-closed: an address it cannot classify, or a host whose own
// addresses it cannot list, is refused.
type Policy struct {
	allow []netip.Prefix

	// hostAddrs lists the host's addresses (net.InterfaceAddrs).
	hostAddrs func() ([]netip.Addr, error)
	// refresh bounds how old the cached list may be.
	refresh time.Duration
	now     func() time.Time

	mu      sync.Mutex
	cached  map[netip.Addr]struct{}
	cachedT time.Time
}

// hostAddrRefresh bounds how stale the list of the host's own addresses
// may be: an address added to the host is refused at most this late.
const hostAddrRefresh = time.Second

// NewPolicy is the policy with allow as the extra ranges (already checked
// by ParseAllowCIDRs).
func NewPolicy(allow []netip.Prefix) *Policy {
	return &Policy{allow: allow, hostAddrs: interfaceAddrs, refresh: hostAddrRefresh, now: time.Now}
}

func interfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		var ip net.IP
		switch v := a.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		default:
			continue
		}
		if na, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, na.Unmap().WithZone(""))
		}
	}
	return out, nil
}

// Check returns nil when a guest may reach dst, else an error wrapping
// ErrRefused that says why.
func (p *Policy) Check(dst netip.Addr) error {
	if !dst.IsValid() {
		return fmt.Errorf("invalid address: %w", ErrRefused)
	}
	a := dst.Unmap().WithZone("")
	for _, n := range neverRanges {
		if n.prefix.Contains(a) {
			return refused(a, n.why)
		}
	}
	if GuestSubnet.Contains(a) {
		// Its gateway and DNS addresses are this stack's, and the rest
		// is on the guest's own link, never the host's.
		return refused(a, "the guest's virtual network")
	}
	if a.Is6() && (a.IsLinkLocalUnicast() || a.IsInterfaceLocalMulticast() || a.IsLinkLocalMulticast()) {
		return refused(a, "link-local")
	}
	own, err := p.owned(a)
	if err != nil {
		return refused(a, "the host's own addresses cannot be listed: "+err.Error())
	}
	if own {
		return refused(a, "an address of this host")
	}
	for _, r := range PrivateRanges {
		if r.Contains(a) && !p.allowed(a) {
			return refused(a, "a private range not in network_allow_cidrs")
		}
	}
	return nil
}

func (p *Policy) allowed(a netip.Addr) bool {
	for _, r := range p.allow {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

// owned reports whether a is one of the host's addresses, listing them
// again when the cached list is older than the refresh interval.
func (p *Policy) owned(a netip.Addr) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cached == nil || p.now().Sub(p.cachedT) >= p.refresh {
		addrs, err := p.hostAddrs()
		if err != nil {
			p.cached = nil
			return false, err
		}
		m := make(map[netip.Addr]struct{}, len(addrs))
		for _, h := range addrs {
			m[h.Unmap().WithZone("")] = struct{}{}
		}
		p.cached, p.cachedT = m, p.now()
	}
	_, ok := p.cached[a]
	return ok, nil
}

// dialControl re-checks the address the socket is about to connect to,
// so that no dial of a guest flow can bypass the policy, whatever path
// led to it.
func (p *Policy) dialControl(ctx context.Context, network, address string) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("dial %s %q: %w", network, address, ErrRefused)
	}
	return p.Check(ap.Addr())
}
