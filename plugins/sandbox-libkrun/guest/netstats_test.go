package guest

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// Shaped like a 6.1 kernel's files, trimmed.
const (
	snmpSample = `Ip: Forwarding DefaultTTL InReceives InHdrErrors
Ip: 1 64 3502 0
Icmp: InMsgs InErrors
Icmp: 4 0
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 12 0 0 1 0 340 322 0 0 3 0
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 8 0 0 9 0 0 0 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 0 0 0 0 0 0 0 0 0
`
	netstatSample = `TcpExt: SyncookiesSent SyncookiesRecv TCPPureAcks TCPHPAcks TCPHPHits TCPOrigDataSent TCPKeepAlive
TcpExt: 0 0 101 57 44 120 2
IpExt: InNoRoutes InTruncatedPkts InOctets OutOctets
IpExt: 0 0 98765 43210
`
)

func TestParseNetCounters(t *testing.T) {
	got, err := ParseNetCounters([]byte(snmpSample), []byte(netstatSample))
	assert.NilError(t, err)
	assert.DeepEqual(t, got, &agentproto.NetStats{
		TCPInSegs: 340, TCPPureAcks: 101, TCPHPAcks: 57, TCPOrigDataSent: 120,
		UDPInDatagrams: 8, UDPOutDatagrams: 9,
	})

	// A kernel whose netstat lacks TcpExt still reads: the TCP data
	// counters are zero.
	got, err = ParseNetCounters([]byte(snmpSample), []byte("IpExt: InNoRoutes\nIpExt: 0\n"))
	assert.NilError(t, err)
	assert.Equal(t, got.TCPOrigDataSent, uint64(0))
	assert.Equal(t, got.TCPInSegs, uint64(340))

	for _, tc := range []struct {
		name, snmp, netstat, err string
	}{
		{"no Udp", "Tcp: InSegs\nTcp: 1\n", "", "no Udp section"},
		{"no Tcp", "Udp: InDatagrams\nUdp: 1\n", "", "no Tcp section"},
		{"names without values", snmpSample + "Extra: A B\n", "", "has names but no values"},
		{"values of another section", "Tcp: InSegs\nUdp: 1\n", "", `values of "Udp" follow the names of "Tcp"`},
		{"too few values", "Tcp: InSegs OutSegs\nTcp: 1\n", "", "1 values for 2 names"},
		{"not a number", "Tcp: InSegs\nTcp: lots\n", "", `"lots" is not a number`},
		{"no prefix", "Tcp InSegs\n", "", `no "Prefix:"`},
		{"a section twice", "Tcp: A\nTcp: 1\nTcp: A\nTcp: 2\n", "", "section Tcp twice"},
		{"broken netstat", snmpSample, "TcpExt: TCPPureAcks\n", "/proc/net/netstat"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseNetCounters([]byte(tc.snmp), []byte(tc.netstat))
			assert.ErrorContains(t, err, tc.err)
		})
	}
}

func TestParseSNMP6(t *testing.T) {
	got, err := ParseSNMP6([]byte("Ip6InReceives                   \t14\nUdp6InDatagrams                 \t3\nUdp6OutDatagrams                \t4\n\n"))
	assert.NilError(t, err)
	assert.DeepEqual(t, got, map[string]uint64{"Ip6InReceives": 14, "Udp6InDatagrams": 3, "Udp6OutDatagrams": 4})
	for _, tc := range []struct{ in, err string }{
		{"Udp6InDatagrams\n", "want a name and a value"},
		{"Udp6InDatagrams 1 2\n", "want a name and a value"},
		{"Udp6InDatagrams -1\n", "is not a count"},
		{"A 1\nA 2\n", "A twice"},
	} {
		_, err := ParseSNMP6([]byte(tc.in))
		assert.ErrorContains(t, err, tc.err, tc.in)
	}
}

// FuzzParseSNMP6: no input panics; what parses has no empty name.
func FuzzParseSNMP6(f *testing.F) {
	f.Add([]byte("Udp6InDatagrams 3\nUdp6OutDatagrams\t4\n"))
	f.Add([]byte("x 18446744073709551616"))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := ParseSNMP6(data)
		if err != nil {
			if got != nil {
				t.Fatal("counters came back with an error")
			}
			return
		}
		if _, ok := got[""]; ok {
			t.Fatal("an empty name")
		}
	})
}

// FuzzParseNetCounters: no input panics, and what parses has the sections
// it needs.
func FuzzParseNetCounters(f *testing.F) {
	f.Add([]byte(snmpSample), []byte(netstatSample))
	f.Add([]byte("Tcp: InSegs\nTcp: -1\nUdp: InDatagrams\nUdp: 18446744073709551615\n"), []byte(""))
	f.Add([]byte("Tcp: InSegs\nTcp: 18446744073709551616\n"), []byte("TcpExt:\nTcpExt:\n"))
	f.Fuzz(func(t *testing.T, snmp, netstat []byte) {
		got, err := ParseNetCounters(snmp, netstat)
		if err != nil {
			if got != nil {
				t.Fatal("counters came back with an error")
			}
			return
		}
		_ = got.Payload()
	})
}

// Read assembles the files of a procfs and a sysfs: the protocol counters
// and the interface's packets; a VM without the interface reads zero
// packets.
func TestNetCountersRead(t *testing.T) {
	root := t.TempDir()
	proc, sys := filepath.Join(root, "proc"), filepath.Join(root, "sys")
	assert.NilError(t, os.MkdirAll(filepath.Join(proc, "net"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(proc, "net", "snmp"), []byte(snmpSample), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(proc, "net", "netstat"), []byte(netstatSample), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(proc, "net", "snmp6"), []byte("Udp6InDatagrams 5\nUdp6OutDatagrams 6\n"), 0o644))
	stats := filepath.Join(sys, "class", "net", "eth0", "statistics")
	assert.NilError(t, os.MkdirAll(stats, 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(stats, "rx_packets"), []byte("77\n"), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(stats, "tx_packets"), []byte("66\n"), 0o644))

	n := &NetCounters{Proc: proc, Sys: sys}
	got, err := n.Read(context.Background(), &agentproto.NetStatsRequest{})
	assert.NilError(t, err)
	assert.Equal(t, got.Interface, "eth0")
	assert.Equal(t, got.IfRxPackets, uint64(77))
	assert.Equal(t, got.IfTxPackets, uint64(66))
	assert.Equal(t, got.TCPOrigDataSent, uint64(120))
	assert.Equal(t, got.UDP6InDatagrams, uint64(5))
	assert.Equal(t, got.UDP6OutDatagrams, uint64(6))

	got, err = n.Read(context.Background(), &agentproto.NetStatsRequest{Interface: "eth1"})
	assert.NilError(t, err)
	assert.Equal(t, got.IfRxPackets, uint64(0))

	assert.NilError(t, os.WriteFile(filepath.Join(stats, "rx_packets"), []byte("many\n"), 0o644))
	_, err = n.Read(context.Background(), &agentproto.NetStatsRequest{})
	assert.ErrorContains(t, err, "is not a count")

	assert.NilError(t, os.WriteFile(filepath.Join(stats, "rx_packets"), []byte("77\n"), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(proc, "net", "snmp6"), []byte("Udp6InDatagrams\n"), 0o644))
	_, err = n.Read(context.Background(), &agentproto.NetStatsRequest{})
	assert.ErrorContains(t, err, "/proc/net/snmp6")
	assert.NilError(t, os.Remove(filepath.Join(proc, "net", "snmp6")))
	got, err = n.Read(context.Background(), &agentproto.NetStatsRequest{})
	assert.NilError(t, err, "a kernel without IPv6")
	assert.Equal(t, got.UDP6InDatagrams, uint64(0))

	_, err = (&NetCounters{Proc: t.TempDir(), Sys: sys}).Read(context.Background(), &agentproto.NetStatsRequest{})
	assert.ErrorContains(t, err, "read the network counters")
}

// The running kernel's own files parse: the parser follows the real
// format, not only the samples above.
func TestNetCountersReadThisKernel(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("procfs is Linux's")
	}
	got, err := (&NetCounters{Proc: "/proc", Sys: "/sys"}).Read(context.Background(), &agentproto.NetStatsRequest{Interface: "lo"})
	assert.NilError(t, err)
	assert.Check(t, got.TCPInSegs > 0 || got.UDPInDatagrams > 0 || got.IfRxPackets > 0, "%+v", got)
}
