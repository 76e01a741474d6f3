package usernet

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestPolicy(t *testing.T) {
	allow, err := ParseAllowCIDRs([]string{"10.20.0.0/16", "fd12:3456::/32", "192.0.2.0/24"})
	assert.NilError(t, err)
	host := []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::2"), netip.MustParseAddr("10.20.0.1")}
	for _, tc := range []struct {
		addr  string
		allow bool // with the allow list
		deflt bool // without it
		why   string
	}{
		{"127.0.0.1", false, false, "loopback"},
		{"127.1.2.3", false, false, "loopback"},
		{"::1", false, false, "loopback"},
		{"::ffff:127.0.0.1", false, false, "loopback"},
		{"0.0.0.0", false, false, "unspecified"},
		{"0.1.2.3", false, false, "unspecified"},
		{"::", false, false, "unspecified"},
		{"169.254.169.254", false, false, "link-local"},
		{"169.254.0.1", false, false, "link-local"},
		{"fe80::1", false, false, "link-local"},
		{"fe80::1%eth0", false, false, "link-local"},
		{"224.0.0.251", false, false, "multicast"},
		{"239.255.255.250", false, false, "multicast"},
		{"ff02::1", false, false, "multicast"},
		{"255.255.255.255", false, false, "broadcast"},
		{"240.0.0.1", false, false, "reserved"},
		{"10.0.2.2", false, false, "virtual network"},
		{"10.0.2.3", false, false, "virtual network"},
		{"10.0.2.15", false, false, "virtual network"},
		{"192.0.2.2", false, false, "this host"},
		{"::ffff:192.0.2.2", false, false, "this host"},
		{"2001:db8::2", false, false, "this host"},
		{"10.20.0.1", false, false, "this host"},
		{"10.20.3.4", true, false, "private"},
		{"10.21.0.1", false, false, "private"},
		{"172.16.0.1", false, false, "private"},
		{"172.31.255.254", false, false, "private"},
		{"192.168.0.1", false, false, "private"},
		{"100.64.0.1", false, false, "private"},
		{"100.127.255.254", false, false, "private"},
		{"fd00::1", false, false, "private"},
		{"fd12:3456::9", true, false, "private"},
		{"192.0.2.9", true, true, ""},
		{"172.32.0.1", true, true, ""},
		{"100.128.0.1", true, true, ""},
		{"198.18.0.2", true, true, ""},
		{"203.0.113.5", true, true, ""},
		{"2001:db8::9", true, true, ""},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			a := netip.MustParseAddr(tc.addr)
			for _, c := range []struct {
				p    *Policy
				want bool
			}{{NewPolicy(allow), tc.allow}, {NewPolicy(nil), tc.deflt}} {
				c.p.hostAddrs = func() ([]netip.Addr, error) { return host, nil }
				err := c.p.Check(a)
				if c.want {
					assert.NilError(t, err)
					continue
				}
				assert.Assert(t, errors.Is(err, ErrRefused), "%v", err)
				assert.Check(t, is.ErrorContains(err, tc.why))
			}
		})
	}
	assert.Assert(t, errors.Is(NewPolicy(nil).Check(netip.Addr{}), ErrRefused))
}

func TestPolicyFailsClosedWithoutHostAddresses(t *testing.T) {
	p := NewPolicy(nil)
	p.hostAddrs = func() ([]netip.Addr, error) { return nil, errors.New("netlink is down") }
	err := p.Check(netip.MustParseAddr("203.0.113.5"))
	assert.Assert(t, errors.Is(err, ErrRefused))
	assert.Check(t, is.ErrorContains(err, "netlink is down"))
}

func TestPolicyRefreshesHostAddresses(t *testing.T) {
	now := time.Unix(1000, 0)
	calls := 0
	owned := []netip.Addr{}
	p := NewPolicy(nil)
	p.now = func() time.Time { return now }
	p.hostAddrs = func() ([]netip.Addr, error) { calls++; return owned, nil }
	a := netip.MustParseAddr("203.0.113.5")
	assert.NilError(t, p.Check(a))
	assert.NilError(t, p.Check(a))
	assert.Equal(t, calls, 1, "cached")
	owned = []netip.Addr{a} // the host gained the address
	now = now.Add(hostAddrRefresh)
	assert.Assert(t, errors.Is(p.Check(a), ErrRefused))
	assert.Equal(t, calls, 2)
}

// The real host: every address it has is refused.
func TestPolicyRefusesEveryRealHostAddress(t *testing.T) {
	addrs, err := interfaceAddrs()
	assert.NilError(t, err)
	assert.Assert(t, len(addrs) > 0)
	p := NewPolicy(nil)
	for _, a := range addrs {
		assert.Check(t, errors.Is(p.Check(a), ErrRefused), "%s", a)
	}
}

func TestParseAllowCIDRs(t *testing.T) {
	got, err := ParseAllowCIDRs([]string{"10.0.0.0/8", " 192.168.1.7/24 ", "fd00::/8"})
	assert.NilError(t, err)
	assert.Equal(t, fmt.Sprint(got), "[10.0.0.0/8 192.168.1.0/24 fd00::/8]")
	for _, tc := range []struct{ in, want string }{
		{"0.0.0.0/0", "unspecified"},
		{"::/0", "never reaches"},
		{"127.0.0.0/8", "loopback"},
		{"127.0.0.1/32", "loopback"},
		{"169.254.169.254/32", "link-local"},
		{"fe80::/64", "link-local"},
		{"0.0.0.0/32", "unspecified"},
		{"224.0.0.0/24", "multicast"},
		{"::ffff:10.0.0.0/104", "IPv4 form"},
		{"10.0.0.0", "not a CIDR"},
		{"example.com/24", "not a CIDR"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			_, err := ParseAllowCIDRs([]string{tc.in})
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
