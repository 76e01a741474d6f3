package guest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// NetStatsReader serves net_stats (NetCounters in the guest).
type NetStatsReader interface {
	Read(ctx context.Context, req *agentproto.NetStatsRequest) (*agentproto.NetStats, error)
}

// NetCounters reads the kernel's traffic counters: /proc/net/snmp and
// /proc/net/netstat for the protocol counters, sysfs for the interface's
// packets. They are cheap to read (a few KiB of text) and need no state in
// the agent: the host keeps the previous sample and compares.
type NetCounters struct {
	// Proc and Sys are where procfs and sysfs are mounted ("/proc" and
	// "/sys" in the VM).
	Proc, Sys string
}

var _ NetStatsReader = (*NetCounters)(nil)

// maxCountersFile bounds what is read of one counters file: the real ones
// are a few KiB.
const maxCountersFile = 1 << 20

// Read implements NetStatsReader. A missing interface reads as zero
// packets (the VM has no network device), not as an error.
func (n *NetCounters) Read(_ context.Context, req *agentproto.NetStatsRequest) (*agentproto.NetStats, error) {
	ifname := req.Interface
	if ifname == "" {
		ifname = DefaultInterface
	}
	snmp, err := readSmall(filepath.Join(n.Proc, "net", "snmp"))
	if err != nil {
		return nil, agentproto.Errorf(agentproto.CodeInternal, "read the network counters: %v", err)
	}
	netstat, err := readSmall(filepath.Join(n.Proc, "net", "netstat"))
	if err != nil {
		return nil, agentproto.Errorf(agentproto.CodeInternal, "read the network counters: %v", err)
	}
	out, err := ParseNetCounters(snmp, netstat)
	if err != nil {
		return nil, agentproto.Errorf(agentproto.CodeInternal, "%v", err)
	}
	// A kernel without IPv6 has no snmp6: its counters stay zero.
	snmp6, err := readSmall(filepath.Join(n.Proc, "net", "snmp6"))
	switch {
	case os.IsNotExist(err):
	case err != nil:
		return nil, agentproto.Errorf(agentproto.CodeInternal, "read the network counters: %v", err)
	default:
		v6, err := ParseSNMP6(snmp6)
		if err != nil {
			return nil, agentproto.Errorf(agentproto.CodeInternal, "/proc/net/snmp6: %v", err)
		}
		out.UDP6InDatagrams, out.UDP6OutDatagrams = v6["Udp6InDatagrams"], v6["Udp6OutDatagrams"]
	}
	out.Interface = ifname
	stats := filepath.Join(n.Sys, "class", "net", ifname, "statistics")
	for _, c := range []struct {
		file string
		dst  *uint64
	}{{"rx_packets", &out.IfRxPackets}, {"tx_packets", &out.IfTxPackets}} {
		b, err := readSmall(filepath.Join(stats, c.file))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, agentproto.Errorf(agentproto.CodeInternal, "read %s of %s: %v", c.file, ifname, err)
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return nil, agentproto.Errorf(agentproto.CodeInternal, "%s of %s: %q is not a count", c.file, ifname, truncateStr(string(b), 40))
		}
		*c.dst = v
	}
	return out, nil
}

func readSmall(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCountersFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxCountersFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", p, maxCountersFile)
	}
	return b, nil
}

// ParseNetCounters reads the counters the reaper needs from the text of
// /proc/net/snmp and /proc/net/netstat. Both files are pairs of lines, a
// header of names and a line of values under the same "Prefix:". The
// Tcp and Udp sections of snmp are required; TcpExt of netstat is read
// when present (an old kernel without TCPOrigDataSent reads as zero).
func ParseNetCounters(snmp, netstat []byte) (*agentproto.NetStats, error) {
	s, err := parseCounterTable(snmp)
	if err != nil {
		return nil, fmt.Errorf("/proc/net/snmp: %w", err)
	}
	x, err := parseCounterTable(netstat)
	if err != nil {
		return nil, fmt.Errorf("/proc/net/netstat: %w", err)
	}
	for _, sec := range []string{"Tcp", "Udp"} {
		if s[sec] == nil {
			return nil, fmt.Errorf("/proc/net/snmp has no %s section", sec)
		}
	}
	return &agentproto.NetStats{
		TCPInSegs:       s["Tcp"]["InSegs"],
		UDPInDatagrams:  s["Udp"]["InDatagrams"],
		UDPOutDatagrams: s["Udp"]["OutDatagrams"],
		TCPPureAcks:     x["TcpExt"]["TCPPureAcks"],
		TCPHPAcks:       x["TcpExt"]["TCPHPAcks"],
		TCPOrigDataSent: x["TcpExt"]["TCPOrigDataSent"],
	}, nil
}

// maxCounterSections bounds the sections a table may have (the kernel
// writes fewer than ten).
const maxCounterSections = 64

// parseCounterTable parses "Prefix: name name ...\nPrefix: v v ...\n"
// pairs. Values are unsigned, except that Linux prints a few fields
// (Tcp MaxConn) as -1: negative values are read as zero, since none of
// them is a counter.
func parseCounterTable(data []byte) (map[string]map[string]uint64, error) {
	out := map[string]map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), maxCountersFile)
	var header []string
	var prefix string
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		p, rest, ok := strings.Cut(text, ":")
		if !ok || p == "" || strings.ContainsAny(p, " \t") {
			return nil, fmt.Errorf("line %d: no \"Prefix:\"", line)
		}
		fields := strings.Fields(rest)
		if header == nil {
			header, prefix = fields, p
			continue
		}
		if p != prefix {
			return nil, fmt.Errorf("line %d: values of %q follow the names of %q", line, p, prefix)
		}
		if len(fields) != len(header) {
			return nil, fmt.Errorf("line %d: %d values for %d names in %s", line, len(fields), len(header), p)
		}
		if _, dup := out[p]; dup {
			return nil, fmt.Errorf("line %d: section %s twice", line, p)
		}
		if len(out) >= maxCounterSections {
			return nil, fmt.Errorf("more than %d sections", maxCounterSections)
		}
		sec := make(map[string]uint64, len(header))
		for i, name := range header {
			v, err := strconv.ParseUint(fields[i], 10, 64)
			if err != nil {
				if _, nerr := strconv.ParseInt(fields[i], 10, 64); nerr != nil {
					return nil, fmt.Errorf("line %d: %s %s: %q is not a number", line, p, truncateStr(name, 40), truncateStr(fields[i], 40))
				}
				v = 0
			}
			sec[name] = v
		}
		out[p] = sec
		header, prefix = nil, ""
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if header != nil {
		return nil, fmt.Errorf("section %s has names but no values", prefix)
	}
	return out, nil
}

// maxSNMP6Names bounds the counters of /proc/net/snmp6 (a 6.1 kernel has
// about a hundred).
const maxSNMP6Names = 4096

// ParseSNMP6 reads /proc/net/snmp6: one "Name value" pair per line.
func ParseSNMP6(data []byte) (map[string]uint64, error) {
	out := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), maxCountersFile)
	line := 0
	for sc.Scan() {
		line++
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: want a name and a value, got %d fields", line, len(f))
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: %s: %q is not a count", line, truncateStr(f[0], 40), truncateStr(f[1], 40))
		}
		if _, dup := out[f[0]]; dup {
			return nil, fmt.Errorf("line %d: %s twice", line, truncateStr(f[0], 40))
		}
		if len(out) >= maxSNMP6Names {
			return nil, fmt.Errorf("more than %d counters", maxSNMP6Names)
		}
		out[f[0]] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

func truncateStr(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
