package httpfn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"path"
	"strings"
)

// CodeURLValidationFailed is the error code of a URL the security rules
// refuse: at registration, before each call, and at connect time.
const CodeURLValidationFailed = "url_validation_failed"

// Security is the security: block of the iii-http-functions worker
// (upstream's SecurityConfig).
type Security struct {
	// URLAllowlist holds glob patterns (`*`, `?`, `[...]`) matched against
	// the URL's lower-case host name (an IPv6 literal bare, "::1", or in
	// brackets); empty means ["*"].
	URLAllowlist []string
	// BlockPrivateIPs refuses hosts that are, or resolve to, a loopback,
	// private, link-local or otherwise non-public address (PrivateReason).
	BlockPrivateIPs bool
	// RequireHTTPS refuses every scheme but https.
	RequireHTTPS bool
}

// DefaultSecurity is the block's default: any host, public addresses
// only, https only.
func DefaultSecurity() Security {
	return Security{URLAllowlist: []string{"*"}, BlockPrivateIPs: true, RequireHTTPS: true}
}

// CheckPattern reports whether p is a valid allowlist pattern.
func CheckPattern(p string) error {
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Errorf("pattern %q: %w", p, err)
	}
	return nil
}

// ValidationError is a URL the rules refuse; Reason is upstream's short
// text ("Invalid URL", "HTTPS is required", "URL not in allowlist",
// "Private IP blocked", "DNS lookup failed") and Detail says what and why.
type ValidationError struct {
	Reason string
	Detail string
}

func (e *ValidationError) Error() string {
	if e.Detail == "" {
		return e.Reason
	}
	return e.Reason + ": " + e.Detail
}

// Upstream's reasons.
const (
	ReasonInvalidURL       = "Invalid URL"
	ReasonHTTPSRequired    = "HTTPS is required"
	ReasonNotAllowed       = "URL not in allowlist"
	ReasonPrivateIPBlocked = "Private IP blocked"
	ReasonDNSLookupFailed  = "DNS lookup failed"
)

// Resolver looks a host name up; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Validator applies a Security block to URLs.
type Validator struct {
	sec      Security
	resolver Resolver
}

// NewValidator checks sec's patterns and returns its validator; resolver
// nil is net.DefaultResolver.
func NewValidator(sec Security, resolver Resolver) (*Validator, error) {
	if len(sec.URLAllowlist) == 0 {
		sec.URLAllowlist = []string{"*"}
	}
	for _, p := range sec.URLAllowlist {
		if err := CheckPattern(p); err != nil {
			return nil, fmt.Errorf("url_allowlist: %w", err)
		}
	}
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	return &Validator{sec: sec, resolver: resolver}, nil
}

// Security is the block the validator applies.
func (v *Validator) Security() Security { return v.sec }

// Static checks what needs no DNS: the URL's shape, its scheme, the
// allowlist, and a literal IP address against BlockPrivateIPs. It returns
// the parsed URL.
func (v *Validator) Static(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, &ValidationError{Reason: ReasonInvalidURL, Detail: "cannot parse the URL"}
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" {
		return nil, &ValidationError{Reason: ReasonInvalidURL, Detail: "the scheme must be http or https"}
	}
	if v.sec.RequireHTTPS && scheme != "https" {
		return nil, &ValidationError{Reason: ReasonHTTPSRequired,
			Detail: "security.require_https is on; use an https:// URL or set require_https: false for a trusted endpoint"}
	}
	host := strings.ToLower(u.Hostname())
	if host == "" {
		return nil, &ValidationError{Reason: ReasonInvalidURL, Detail: "the URL has no host"}
	}
	if port := u.Port(); port != "" {
		if _, err := net.LookupPort("tcp", port); err != nil {
			return nil, &ValidationError{Reason: ReasonInvalidURL, Detail: "bad port " + port}
		}
	}
	// An IPv6 literal matches as written in the URL ("[::1]") or bare
	// ("::1"): a glob reads "[" as the start of a class.
	if !v.allowed(host) && (!strings.Contains(host, ":") || !v.allowed("["+host+"]")) {
		return nil, &ValidationError{Reason: ReasonNotAllowed, Detail: "host " + host + " matches no pattern of security.url_allowlist"}
	}
	if v.sec.BlockPrivateIPs {
		if a, err := netip.ParseAddr(host); err == nil {
			if why := PrivateReason(a); why != "" {
				return nil, blocked(a, why)
			}
		}
	}
	return u, nil
}

func (v *Validator) allowed(host string) bool {
	for _, p := range v.sec.URLAllowlist {
		if ok, _ := path.Match(p, host); ok {
			return true
		}
	}
	return false
}

// Validate is Static plus, under BlockPrivateIPs, a DNS lookup of a host
// name: any address it resolves to that PrivateReason names refuses the
// URL. The dialer checks the address it connects to again (Control), so a
// name that resolves differently a moment later gains nothing.
func (v *Validator) Validate(ctx context.Context, raw string) (*url.URL, error) {
	u, err := v.Static(raw)
	if err != nil || !v.sec.BlockPrivateIPs {
		return u, err
	}
	host := strings.ToLower(u.Hostname())
	if _, err := netip.ParseAddr(host); err == nil {
		return u, nil // checked by Static
	}
	addrs, err := v.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &ValidationError{Reason: ReasonDNSLookupFailed, Detail: err.Error()}
	}
	if len(addrs) == 0 {
		return nil, &ValidationError{Reason: ReasonDNSLookupFailed, Detail: "no address for " + host}
	}
	for _, a := range addrs {
		if why := PrivateReason(a); why != "" {
			return nil, &ValidationError{Reason: ReasonPrivateIPBlocked,
				Detail: fmt.Sprintf("%s resolves to %s, %s; security.block_private_ips is on", host, a.Unmap(), why)}
		}
	}
	return u, nil
}

func blocked(a netip.Addr, why string) *ValidationError {
	return &ValidationError{Reason: ReasonPrivateIPBlocked,
		Detail: fmt.Sprintf("%s is %s; security.block_private_ips is on (turn it off, with a url_allowlist, only for endpoints you trust)", a, why)}
}

// nonPublic are the ranges refused beyond what netip classifies itself:
// special-purpose IPv4 blocks that reach this host, its network or
// nothing public.
var nonPublic = []struct {
	p   netip.Prefix
	why string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "in 0.0.0.0/8 (this host)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a shared (carrier-grade NAT) address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol assignment"},
	{netip.MustParsePrefix("192.0.2.0/24"), "a documentation address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address"},
	{netip.MustParsePrefix("198.51.100.0/24"), "a documentation address"},
	{netip.MustParsePrefix("203.0.113.0/24"), "a documentation address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved address"},
	{netip.MustParsePrefix("2001:db8::/32"), "a documentation address"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local address"},
	{netip.MustParsePrefix("::/96"), "an IPv4-compatible address"},
	{netip.MustParsePrefix("100::/64"), "a discard-only address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a local-use NAT64 address"},
}

// IPv6 prefixes whose addresses carry an IPv4 address, in their last 32
// bits (NAT64) or in bits 16-48 (6to4): they are judged by that address
// too.
var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// PrivateReason says why a is not a public address the engine may call
// under block_private_ips ("" when it is public): loopback, unspecified,
// private (RFC 1918, fc00::/7), link-local (169.254.0.0/16 including the
// cloud metadata address, fe80::/10), multicast, broadcast, and the other
// special-purpose ranges above. An IPv4-mapped IPv6 address is judged as
// its IPv4 address, and so is the IPv4 address inside NAT64 and 6to4
// addresses.
func PrivateReason(a netip.Addr) string {
	if !a.IsValid() {
		return "not an IP address"
	}
	a = a.WithZone("")
	if a.Is4In6() {
		return PrivateReason(a.Unmap())
	}
	switch {
	case a.IsLoopback():
		return "a loopback address"
	case a.IsUnspecified():
		return "the unspecified address"
	case a.IsPrivate():
		return "a private address"
	case a.IsLinkLocalUnicast():
		return "a link-local address (this includes the cloud metadata service)"
	case a.IsMulticast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast():
		return "a multicast address"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address"
	}
	for _, r := range nonPublic {
		if r.p.Contains(a) {
			return r.why
		}
	}
	if a.Is6() {
		b := a.As16()
		if nat64.Contains(a) {
			if why := PrivateReason(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})); why != "" {
				return "a NAT64 address of " + why
			}
		}
		if sixToFour.Contains(a) {
			if why := PrivateReason(netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})); why != "" {
				return "a 6to4 address of " + why
			}
		}
	}
	return ""
}

// errBlockedDial marks a connection the dialer refused.
var errBlockedDial = errors.New("connection refused by block_private_ips")
