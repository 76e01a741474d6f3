package config

import (
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
)

// TestParseGuestGuardKeys: network_dns_servers and console_log_max_kb.
func TestParseGuestGuardKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		dns  []string
		cap  int64
		err  string
	}{
		{name: "defaults", in: `{}`},
		{name: "four nameservers", in: `{"network_dns_servers":["198.18.0.2"," 192.0.2.53:5353","2001:db8::53","[2001:db8::54]:53"]}`,
			err: "at most 3"},
		{name: "three nameservers", in: `{"network_dns_servers":["198.18.0.2"," 192.0.2.53:5353","[2001:db8::54]:53"]}`,
			dns: []string{"198.18.0.2:53", "192.0.2.53:5353", "[2001:db8::54]:53"}},
		{name: "loopback nameserver", in: `{"network_dns_servers":["127.0.0.53"]}`, dns: []string{"127.0.0.53:53"}},
		{name: "a name, not an address", in: `{"network_dns_servers":["dns.example"]}`, err: `key "network_dns_servers": item 0`},
		{name: "port zero", in: `{"network_dns_servers":["192.0.2.53:0"]}`, err: `item 0`},
		{name: "not a list", in: `{"network_dns_servers":"192.0.2.53"}`, err: `must be a list of nameservers`},
		{name: "console cap", in: `{"console_log_max_kb":64}`, cap: 64 << 10},
		{name: "console cap too small", in: `{"console_log_max_kb":8}`, err: `key "console_log_max_kb": must be a whole number from 16 to 1048576`},
		{name: "console cap too large", in: `{"console_log_max_kb":1048577}`, err: `key "console_log_max_kb"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig(keysOf(t, tc.in), "/home/u", "linux")
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.Check(t, is.DeepEqual(c.NetworkDNSServers, tc.dns))
			assert.Check(t, is.Equal(c.ConsoleLogMaxBytes, tc.cap))
		})
	}
	assert.Check(t, is.Contains(ConfigKeys(), KeyNetworkDNSServers))
	assert.Check(t, is.Contains(ConfigKeys(), KeyConsoleLogMaxKB))
}

// TestSpecCarriesGuestGuards: the runner's spec takes the cap to QEMU and
// the nameservers to the network; both are checked.
func TestSpecCarriesGuestGuards(t *testing.T) {
	spec := backend.Spec{ID: "x", CPUs: 1, MemoryMiB: 256, Kernel: "/k", Initrd: "/i", StateDir: "/s/x", Accel: backend.AccelTCG,
		Network: true, NetDNSServers: []string{"198.18.0.2:53"}, ConsoleLogMaxBytes: 64 << 10}
	assert.NilError(t, spec.Validate())
	net, err := spec.NetConfig()
	assert.NilError(t, err)
	assert.Check(t, is.Len(net.DNSServers, 1))
	assert.Check(t, is.Equal(net.DNSServers[0].String(), "198.18.0.2:53"))
	assert.Check(t, is.Equal(qemu.ConfigFor(spec).ConsoleMaxBytes, int64(64<<10)))

	bad := spec
	bad.ConsoleLogMaxBytes = 100
	assert.Check(t, is.ErrorContains(bad.Validate(), "console log cap"))
	bad = spec
	bad.Network = false
	assert.Check(t, is.ErrorContains(bad.Validate(), "need network"))
	bad = spec
	bad.NetDNSServers = []string{"dns.example"}
	assert.Check(t, is.ErrorContains(bad.Validate(), "nameserver"))
}
