package httpfn

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// fakeResolver answers from a table; a name it does not hold fails.
type fakeResolver map[string][]string

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	addrs, ok := f[host]
	if !ok {
		return nil, errors.New("no such host " + host)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

var testDNS = fakeResolver{
	"api.example.com":      {"93.184.216.34"},
	"rebind.example.com":   {"93.184.216.34", "127.0.0.1"},
	"metadata.example.com": {"169.254.169.254"},
	"v6local.example.com":  {"fd00::1"},
	"mapped.example.com":   {"::ffff:10.0.0.1"},
	"localhost":            {"127.0.0.1", "::1"},
}

func TestValidate(t *testing.T) {
	permissive := Security{BlockPrivateIPs: false, RequireHTTPS: false}
	allowlisted := Security{URLAllowlist: []string{"*.example.com", "::1"}, BlockPrivateIPs: true, RequireHTTPS: true}
	for _, tc := range []struct {
		name   string
		sec    Security
		url    string
		reason string // "" = allowed
		detail string // a substring of the detail
	}{
		// The defaults: https, public addresses, any host.
		{"public https", DefaultSecurity(), "https://api.example.com/fn", "", ""},
		{"public IP", DefaultSecurity(), "https://93.184.216.34/fn", "", ""},
		{"http refused", DefaultSecurity(), "http://api.example.com/fn", ReasonHTTPSRequired, "require_https"},
		{"loopback v4", DefaultSecurity(), "https://127.0.0.1:8443/", ReasonPrivateIPBlocked, "loopback"},
		{"loopback v4 other", DefaultSecurity(), "https://127.1.2.3/", ReasonPrivateIPBlocked, "loopback"},
		{"loopback name", DefaultSecurity(), "https://localhost:8443/", ReasonPrivateIPBlocked, "localhost resolves to 127.0.0.1"},
		{"loopback v6", DefaultSecurity(), "https://[::1]:8443/", ReasonPrivateIPBlocked, "loopback"},
		{"unspecified v4", DefaultSecurity(), "https://0.0.0.0/", ReasonPrivateIPBlocked, "unspecified"},
		{"this network", DefaultSecurity(), "https://0.1.2.3/", ReasonPrivateIPBlocked, "0.0.0.0/8"},
		{"unspecified v6", DefaultSecurity(), "https://[::]/", ReasonPrivateIPBlocked, "unspecified"},
		{"rfc1918 10", DefaultSecurity(), "https://10.1.2.3/", ReasonPrivateIPBlocked, "private"},
		{"rfc1918 172", DefaultSecurity(), "https://172.16.0.1/", ReasonPrivateIPBlocked, "private"},
		{"rfc1918 172 top", DefaultSecurity(), "https://172.31.255.255/", ReasonPrivateIPBlocked, "private"},
		{"172.32 is public", DefaultSecurity(), "https://172.32.0.1/", "", ""},
		{"rfc1918 192", DefaultSecurity(), "https://192.168.1.1/", ReasonPrivateIPBlocked, "private"},
		{"metadata", DefaultSecurity(), "https://169.254.169.254/latest/meta-data/", ReasonPrivateIPBlocked, "link-local"},
		{"metadata by name", DefaultSecurity(), "https://metadata.example.com/", ReasonPrivateIPBlocked, "169.254.169.254"},
		{"cgnat", DefaultSecurity(), "https://100.64.0.1/", ReasonPrivateIPBlocked, "shared"},
		{"broadcast", DefaultSecurity(), "https://255.255.255.255/", ReasonPrivateIPBlocked, "broadcast"},
		{"multicast v4", DefaultSecurity(), "https://224.0.0.1/", ReasonPrivateIPBlocked, "multicast"},
		{"documentation", DefaultSecurity(), "https://192.0.2.1/", ReasonPrivateIPBlocked, "documentation"},
		{"ula", DefaultSecurity(), "https://[fd12:3456::1]/", ReasonPrivateIPBlocked, "private"},
		{"ula fc", DefaultSecurity(), "https://[fc00::1]/", ReasonPrivateIPBlocked, "private"},
		{"link-local v6", DefaultSecurity(), "https://[fe80::1]/", ReasonPrivateIPBlocked, "link-local"},
		{"link-local v6 zone", DefaultSecurity(), "https://[fe80::1%25eth0]/", ReasonPrivateIPBlocked, "link-local"},
		{"multicast v6", DefaultSecurity(), "https://[ff02::1]/", ReasonPrivateIPBlocked, "multicast"},
		{"mapped loopback", DefaultSecurity(), "https://[::ffff:127.0.0.1]/", ReasonPrivateIPBlocked, "loopback"},
		{"mapped metadata", DefaultSecurity(), "https://[::ffff:169.254.169.254]/", ReasonPrivateIPBlocked, "link-local"},
		{"mapped hex", DefaultSecurity(), "https://[::ffff:7f00:1]/", ReasonPrivateIPBlocked, "loopback"},
		{"v4-compatible", DefaultSecurity(), "https://[::127.0.0.1]/", ReasonPrivateIPBlocked, "IPv4-compatible"},
		{"nat64 of private", DefaultSecurity(), "https://[64:ff9b::a00:1]/", ReasonPrivateIPBlocked, "NAT64"},
		{"nat64 of public", DefaultSecurity(), "https://[64:ff9b::5db8:d822]/", "", ""},
		{"6to4 of loopback", DefaultSecurity(), "https://[2002:7f00:1::1]/", ReasonPrivateIPBlocked, "6to4"},
		{"public v6", DefaultSecurity(), "https://[2606:4700::1111]/", "", ""},
		{"name to ula", DefaultSecurity(), "https://v6local.example.com/", ReasonPrivateIPBlocked, "fd00::1"},
		{"name to mapped", DefaultSecurity(), "https://mapped.example.com/", ReasonPrivateIPBlocked, "10.0.0.1"},
		{"one private answer is enough", DefaultSecurity(), "https://rebind.example.com/", ReasonPrivateIPBlocked, "127.0.0.1"},
		{"unknown name", DefaultSecurity(), "https://nowhere.example.com/", ReasonDNSLookupFailed, "no such host"},
		{"decimal IPv4 is a name", DefaultSecurity(), "https://2130706433/", ReasonDNSLookupFailed, ""},
		{"upper-case scheme", DefaultSecurity(), "HTTPS://api.example.com/", "", ""},

		// Shapes.
		{"garbage", DefaultSecurity(), "://bad-url", ReasonInvalidURL, ""},
		{"no scheme", DefaultSecurity(), "api.example.com/fn", ReasonInvalidURL, "scheme"},
		{"ftp", permissive, "ftp://api.example.com/", ReasonInvalidURL, "scheme"},
		{"file", permissive, "file:///etc/passwd", ReasonInvalidURL, "scheme"},
		{"no host", permissive, "http:///path", ReasonInvalidURL, "no host"},
		{"bad port", permissive, "http://api.example.com:99999/", ReasonInvalidURL, "port"},
		{"empty", DefaultSecurity(), "", ReasonInvalidURL, ""},

		// block_private_ips and require_https off: loopback allowed.
		{"permissive loopback", permissive, "http://127.0.0.1:8080/fn", "", ""},
		{"permissive name", permissive, "http://localhost:8080/fn", "", ""},

		// The allowlist matches the lower-case host, v6 in brackets.
		{"allowlisted", allowlisted, "https://API.example.com/", "", ""},
		{"not allowlisted", allowlisted, "https://example.org/", ReasonNotAllowed, "example.org"},
		{"suffix trick", allowlisted, "https://example.com.evil.org/", ReasonNotAllowed, ""},
		{"allowlisted v6 still private", allowlisted, "https://[::1]/", ReasonPrivateIPBlocked, "loopback"},
		{"allowlisted name still private", allowlisted, "https://metadata.example.com/", ReasonPrivateIPBlocked, "169.254.169.254"},
		{"exact allowlist", Security{URLAllowlist: []string{"127.0.0.1"}, RequireHTTPS: false}, "http://127.0.0.1:1234/", "", ""},
		{"exact allowlist other", Security{URLAllowlist: []string{"127.0.0.1"}, RequireHTTPS: false}, "http://127.0.0.2:1234/", ReasonNotAllowed, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := NewValidator(tc.sec, testDNS)
			assert.NilError(t, err)
			_, err = v.Validate(context.Background(), tc.url)
			if tc.reason == "" {
				assert.NilError(t, err)
				return
			}
			var ve *ValidationError
			assert.Assert(t, errors.As(err, &ve), "want %s, got %v", tc.reason, err)
			assert.Equal(t, ve.Reason, tc.reason, "%v", err)
			assert.Check(t, is.Contains(ve.Detail, tc.detail))
		})
	}
}

// Static needs no DNS: a host name passes it, and the call-time check
// (Validate) and the dialer judge its addresses.
func TestStaticLeavesNamesToCallTime(t *testing.T) {
	v, err := NewValidator(DefaultSecurity(), fakeResolver{})
	assert.NilError(t, err)
	_, err = v.Static("https://localhost:8443/")
	assert.NilError(t, err)
	_, err = v.Static("https://127.0.0.1:8443/")
	assert.ErrorContains(t, err, ReasonPrivateIPBlocked)
}

func TestNewValidatorRefusesBadPatterns(t *testing.T) {
	_, err := NewValidator(Security{URLAllowlist: []string{"[a-"}}, nil)
	assert.ErrorContains(t, err, "url_allowlist")
	v, err := NewValidator(Security{}, nil)
	assert.NilError(t, err)
	assert.DeepEqual(t, v.Security().URLAllowlist, []string{"*"})
}

func TestPrivateReasonPublic(t *testing.T) {
	for _, a := range []string{"1.1.1.1", "8.8.8.8", "93.184.216.34", "2606:4700::1111", "2001:4860:4860::8888", "::ffff:8.8.8.8"} {
		assert.Equal(t, PrivateReason(netip.MustParseAddr(a)), "", a)
	}
	assert.Equal(t, PrivateReason(netip.Addr{}), "not an IP address")
}

// FuzzValidateURL: no input panics, and whatever the validator admits
// under the defaults is https with a host that is not a private literal.
func FuzzValidateURL(f *testing.F) {
	for _, s := range []string{
		"https://api.example.com/fn", "http://127.0.0.1:80/", "https://[::ffff:127.0.0.1]/", "https://[fe80::1%25eth0]/",
		"://bad", "", "https://user:pw@api.example.com:443/p?q=1#f", "https://2130706433/", "HTTPS://[::]/", "https://0x7f.1/",
	} {
		f.Add(s)
	}
	v, err := NewValidator(DefaultSecurity(), fakeResolver{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := v.Static(raw)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("%q: error %v is not a ValidationError", raw, err)
			}
			return
		}
		if !strings.EqualFold(u.Scheme, "https") {
			t.Fatalf("%q admitted with scheme %q", raw, u.Scheme)
		}
		if a, err := netip.ParseAddr(u.Hostname()); err == nil && PrivateReason(a) != "" {
			t.Fatalf("%q admitted with the private address %s", raw, a)
		}
	})
}
