package e2e

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/netns"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// dnsAttackScript runs in a network: true sandbox as a hostile guest
// would: it sends its DNS address messages that are not plain queries
// (an UPDATE with trailing bytes, garbage, two questions, a query with
// trailing bytes, 60 KB messages over TCP), each hiding the marker
// argv[1], then a well-formed query and a lookup through the C library.
// One "key<TAB>value" line per result.
const dnsAttackScript = `import socket, struct, sys
marker = sys.argv[1].encode()
def name(n):
    return b"".join(bytes([len(p)]) + p.encode() for p in n.split(".")) + b"\0"
def hdr(i, flags, qd, an, ns, ar):
    return struct.pack(">HHHHHH", i, flags, qd, an, ns, ar)
def udp(msg):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(20)
    u.sendto(msg, ("10.0.2.3", 53))
    r = u.recv(4096)
    u.close()
    return r
def tcp(msg):
    s = socket.create_connection(("10.0.2.3", 53), timeout=30)
    s.sendall(struct.pack(">H", len(msg)) + msg)
    data = b""
    while len(data) < 2 or len(data) < 2 + struct.unpack(">H", data[:2])[0]:
        c = s.recv(65536)
        if not c:
            break
        data += c
    s.close()
    return data[2:]
def rcode(r):
    return "id=%d rcode=%d" % (struct.unpack(">H", r[:2])[0], r[3] & 15)
A = struct.pack(">HH", 1, 1)
print("update\t" + rcode(udp(hdr(1, 5 << 11, 1, 0, 1, 0) + name("evil-update.example.test") + struct.pack(">HH", 6, 1) + marker * 4)))
print("garbage\t" + rcode(udp(hdr(2, 0x0100, 1, 0, 0, 0) + marker * 3)))
print("two questions\t" + rcode(udp(hdr(3, 0x0100, 2, 0, 0, 0) + name("evil-one.example.test") + A + name("evil-two.example.test") + A)))
print("trailing\t" + rcode(udp(hdr(4, 0x0100, 1, 0, 0, 0) + name("evil-trailing.example.test") + A + marker)))
big = marker * (60000 // len(marker))
print("tcp big query\t" + rcode(tcp(hdr(5, 0x0100, 1, 0, 0, 0) + name("evil-big.example.test") + A + big)))
print("tcp big update\t" + rcode(tcp(hdr(6, 5 << 11, 1, 0, 1, 0) + name("evil-bigupdate.example.test") + struct.pack(">HH", 6, 1) + big)))
r = udp(hdr(7, 0x0100, 1, 0, 0, 0) + name("good.example.test") + A)
print("good\t" + rcode(r) + " answers=%d last=%s" % (struct.unpack(">H", r[6:8])[0], socket.inet_ntoa(r[-4:])))
print("lookup\t" + socket.gethostbyname("lookup.example.test"))
`

// testResolver is a nameserver on the test host (UDP and TCP on port 53)
// that records every byte it receives, parsed or not, and answers A
// queries with 198.51.100.77, anything else with an empty NOERROR.
type testResolver struct {
	mu  sync.Mutex
	got [][]byte
}

func startTestResolver(t *testing.T, host *netns.Host) *testResolver {
	t.Helper()
	r := &testResolver{}
	ln, _ := host.Listen(t, "tcp", 53)
	_, pc := host.Listen(t, "udp", 53)
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			r.record(buf[:n])
			if a := r.answer(buf[:n]); a != nil {
				_, _ = pc.WriteTo(a, from)
			}
		}
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			var b bytes.Buffer
			tee := io.TeeReader(c, &b)
			var l [2]byte
			_, err = io.ReadFull(tee, l[:])
			if err == nil {
				_, err = io.ReadFull(tee, make([]byte, binary.BigEndian.Uint16(l[:])))
			}
			r.record(b.Bytes())
			if err == nil {
				if a := r.answer(b.Bytes()[2:]); a != nil {
					_, _ = c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(a))), a...))
				}
			}
			_ = c.Close()
		}
	})
	// Listen's clean-up would close them only after this one waits.
	t.Cleanup(func() {
		_ = ln.Close()
		_ = pc.Close()
		waitfor.Group(t, &wg, waitfor.Default, "the test resolver's servers to end")
	})
	return r
}

func (r *testResolver) record(b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, bytes.Clone(b))
}

func (r *testResolver) received() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.got...)
}

func (r *testResolver) answer(q []byte) []byte {
	var m dnsmessage.Message
	if m.Unpack(q) != nil || len(m.Questions) != 1 {
		return nil
	}
	m.Response, m.RecursionAvailable = true, true
	m.Additionals = nil
	if m.Questions[0].Type == dnsmessage.TypeA {
		m.Answers = []dnsmessage.Resource{{Header: dnsmessage.ResourceHeader{Name: m.Questions[0].Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 5},
			Body: &dnsmessage.AResource{A: [4]byte{198, 51, 100, 77}}}}
	}
	b, _ := m.Pack()
	return b
}

// TestGuestDNSIsAnsweredNotRelayed is the acceptance test of the guest's
// DNS service: from a real network: true sandbox, messages that are not
// plain queries get FORMERR or REFUSED and never reach the nameserver (a
// test resolver in a network namespace of the test's own); well-formed
// lookups still resolve, through queries of the runner's own.
func TestGuestDNSIsAnsweredNotRelayed(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	host := netns.Start(t)
	res := startTestResolver(t, host)
	const marker = "GUESTBYTES-7f3a"

	p := start(t, e, dirs.Short(t, "sb"), map[string]any{"network_dns_servers": []any{host.Addr.String()}})
	id := p.create(t, map[string]any{"network": true})
	out := p.exec(t, id, "python3", "-c", dnsAttackScript, marker)
	assert.Assert(t, out.Success, "stdout:\n%s\nstderr:\n%s", out.Stdout, out.Stderr)
	t.Logf("from inside the sandbox:\n%s", out.Stdout)
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out.Stdout), "\n") {
		k, v, _ := strings.Cut(line, "\t")
		got[k] = v
	}
	assert.Check(t, is.Equal(got["update"], "id=1 rcode=5"), "REFUSED")
	assert.Check(t, is.Equal(got["garbage"], "id=2 rcode=1"), "FORMERR")
	assert.Check(t, is.Equal(got["two questions"], "id=3 rcode=1"))
	assert.Check(t, is.Equal(got["trailing"], "id=4 rcode=1"))
	assert.Check(t, is.Equal(got["tcp big query"], "id=5 rcode=1"))
	assert.Check(t, is.Equal(got["tcp big update"], "id=6 rcode=5"))
	assert.Check(t, is.Equal(got["good"], "id=7 rcode=0 answers=1 last=198.51.100.77"))
	assert.Check(t, is.Equal(got["lookup"], "198.51.100.77"))

	// What reached the nameserver: only plain queries of the runner's,
	// about the two good names, with none of the guest's bytes.
	names := map[string]bool{}
	for i, b := range res.received() {
		assert.Check(t, !bytes.Contains(b, []byte(marker)), "message %d carries the guest's bytes: %q", i, b)
		assert.Check(t, !bytes.Contains(b, []byte("evil")), "message %d is about a refused message's name: %q", i, b)
		if len(b) >= 2 && int(binary.BigEndian.Uint16(b)) == len(b)-2 {
			b = b[2:]
		}
		var m dnsmessage.Message
		if !assert.Check(t, m.Unpack(b), "message %d", i) {
			continue
		}
		assert.Check(t, !m.Response && m.OpCode == 0 && len(m.Questions) == 1 && len(m.Answers) == 0 && len(m.Authorities) == 0, "message %d: %+v", i, m)
		for _, q := range m.Questions {
			names[strings.ToLower(q.Name.String())] = true
		}
	}
	assert.Check(t, names["good.example.test."], "the well-formed query was asked: %v", names)
	assert.Check(t, names["lookup.example.test."], "the lookup was asked: %v", names)
}

// consoleFloodScript writes the guest's console (/dev/console, the
// kernel's ttyS0) flat out for argv[2] seconds, each line carrying the
// marker argv[1], then prints how many bytes it wrote.
const consoleFloodScript = `import os, sys, time
marker = sys.argv[1]; end = time.time() + float(sys.argv[2])
fd = os.open("/dev/console", os.O_WRONLY | os.O_NOCTTY)
n = 0; i = 0
while time.time() < end:
    line = ("%s %08d the guest floods its console to fill the host's disk\n" % (marker, i)).encode() * 16
    n += os.write(fd, line); i += 1
os.close(fd)
print(n)
`

// TestConsoleLogIsCapped is the acceptance test of the console cap: a
// guest writing its console for 30 s leaves a console log (console.log
// and its rotated console.log.1) no larger than console_log_max_kb; it
// did write beyond the cap (the rotated file is full of its lines), and
// the sandbox goes on working.
func TestConsoleLogIsCapped(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	const capKB = 64
	const marker = "CONSOLEFLOOD"
	stateDir := dirs.Short(t, "sb")
	p := start(t, e, stateDir, map[string]any{"console_log_max_kb": capKB})
	id := p.create(t, nil)
	dir := filepath.Join(stateDir, id)

	out := p.exec(t, id, "python3", "-c", consoleFloodScript, marker, "30")
	assert.Assert(t, out.Success, "stdout:\n%s\nstderr:\n%s", out.Stdout, out.Stderr)
	t.Logf("the guest wrote %s bytes to its console", strings.TrimSpace(out.Stdout))
	var wrote int
	_, err := fmt.Sscan(out.Stdout, &wrote)
	assert.NilError(t, err)
	assert.Assert(t, wrote > capKB<<10, "the guest wrote less than the cap: nothing to prove")

	newest, err := os.ReadFile(filepath.Join(dir, "console.log"))
	assert.NilError(t, err)
	rotated, err := os.ReadFile(filepath.Join(dir, "console.log.1"))
	assert.NilError(t, err, "the log rotated")
	t.Logf("console.log %d bytes, console.log.1 %d bytes", len(newest), len(rotated))
	assert.Check(t, len(newest)+len(rotated) <= capKB<<10, "the console log holds %d bytes, more than its cap of %d", len(newest)+len(rotated), capKB<<10)
	assert.Check(t, bytes.Contains(rotated, []byte(marker)), "the flood reached the log")

	assert.Check(t, is.Equal(p.sh(t, id, "echo still here"), "still here\n"))
	// Still bounded once the guest is done and the log quiet.
	fi, err := os.Stat(filepath.Join(dir, "console.log"))
	assert.NilError(t, err)
	assert.Check(t, fi.Size() <= capKB<<9)
}
