package e2e

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/netns"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// probeScript runs in a sandbox as an attacker would: it aims at every
// address through which the host might be reached (each gateway in
// /proc/net/route, 10.0.2.2, 10.0.2.3, the nameservers, its own loopback,
// and the host's addresses the test hands it, as if guessed) on the port
// the host listens on, over TCP and UDP; then it talks to the echo server
// on the test host and asks the DNS address about localhost and an
// .invalid name. One "key<TAB>value" line per result. The image's Python
// is minimal: no json, no http.
const probeScript = `import errno, socket, struct, sys
port = int(sys.argv[1]); echo_host = sys.argv[2]; echo_port = int(sys.argv[3])
targets = set(["10.0.2.2", "10.0.2.3", "127.0.0.1"] + sys.argv[4:])
for line in open("/proc/net/route").read().splitlines()[1:]:
    f = line.split()
    if int(f[2], 16):
        targets.add(socket.inet_ntoa(struct.pack("<I", int(f[2], 16))))
for line in open("/etc/resolv.conf"):
    p = line.split()
    if len(p) >= 2 and p[0] == "nameserver":
        targets.add(p[1])
def why(e):
    return type(e).__name__ + ":" + errno.errorcode.get(e.errno or 0, str(e))
for t in sorted(targets):
    fam = socket.AF_INET6 if ":" in t else socket.AF_INET
    try:
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect((t, port))
        print("tcp " + t + "\tCONNECTED")
        s.close()
    except OSError as e:
        print("tcp " + t + "\t" + why(e))
    try:
        u = socket.socket(fam, socket.SOCK_DGRAM)
        u.sendto(b"x", (t, port))
        u.close()
    except OSError as e:
        pass
s = socket.create_connection((echo_host, echo_port), timeout=30)
s.sendall(b"ping through usernet")
s.shutdown(socket.SHUT_WR)
data = b""
while True:
    c = s.recv(4096)
    if not c:
        break
    data += c
print("echo\t" + data.decode())
def query(name):
    q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(10)
    u.sendto(q, ("10.0.2.3", 53))
    return u.recv(4096)
r = query("localhost")
print("dns localhost\trcode=%d answers=%d last=%s" % (r[3] & 15, struct.unpack(">H", r[6:8])[0], socket.inet_ntoa(r[-4:])))
r = query("nothing.invalid")
print("dns invalid\trcode=%d" % (r[3] & 15))
`

// TestNetwork is the acceptance test of a sandbox's network: a real
// network: true sandbox under QEMU, whose NIC the runner serves with
// usernet. The host listens on one port on every address it has,
// loopback included; from inside the guest nothing reaches it, over TCP
// or UDP, whichever address it tries. The same sandbox reaches an echo
// server on a test host in a network namespace, and the DNS address
// answers. A sandbox without network has no NIC at all.
func TestNetwork(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	host := netns.Start(t)
	echo, echoed := host.Echo(t)

	// The host's listeners, TCP and UDP on one port, standing in for the
	// engine and the Compose daemon: on loopback and on the host's side of
	// the test host's link (this workplace lets servers bind only those).
	// The host's other addresses are in the guesses below too; the policy
	// refuses them before any dial (usernet's unit tests), and a dial would
	// stay on this machine.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln2, err := net.Listen("tcp", net.JoinHostPort(host.Gateway.String(), fmt.Sprint(port)))
	assert.NilError(t, err)
	pc, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
	assert.NilError(t, err)
	pc2, err := net.ListenPacket("udp", net.JoinHostPort(host.Gateway.String(), fmt.Sprint(port)))
	assert.NilError(t, err)
	var mu sync.Mutex
	var reached []string
	var wg sync.WaitGroup
	for _, l := range []net.Listener{ln, ln2} {
		wg.Go(func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				reached = append(reached, "tcp from "+c.RemoteAddr().String()+" to "+l.Addr().String())
				mu.Unlock()
				_ = c.Close()
			}
		})
	}
	for _, pc := range []net.PacketConn{pc, pc2} {
		wg.Go(func() {
			buf := make([]byte, 2048)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				mu.Lock()
				reached = append(reached, "udp from "+from.String()+" to "+pc.LocalAddr().String())
				mu.Unlock()
			}
		})
	}
	defer waitfor.Group(t, &wg, waitfor.Default, "the test host's listeners to end")
	for _, c := range []io.Closer{ln, ln2, pc, pc2} {
		defer c.Close()
	}

	// What an attacker might guess: every address of the host (the test
	// host's gateway side among them).
	ifaddrs, err := net.InterfaceAddrs()
	assert.NilError(t, err)
	var guesses []string
	for _, a := range ifaddrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && !p.Addr().IsLinkLocalUnicast() {
			guesses = append(guesses, p.Addr().String())
		}
	}
	assert.Assert(t, is.Contains(guesses, host.Gateway.String()))

	p := start(t, e, dirs.Short(t, "sb"), nil)
	online := p.create(t, map[string]any{"network": true})
	offline := p.create(t, nil)

	// The first network sandbox boots; its template is recorded in the
	// background, and the second one is restored from it: both must
	// behave the same.
	argv := append([]string{"python3", "-c", probeScript, fmt.Sprint(port), echo.Addr().String(), fmt.Sprint(echo.Port())}, guesses...)
	probe := func(online string, wantEchoes int) {
		t.Helper()
		out := p.exec(t, online, argv...)
		assert.Assert(t, out.Success, "stdout:\n%s\nstderr:\n%s", out.Stdout, out.Stderr)
		t.Logf("from inside the sandbox:\n%s", out.Stdout)
		res := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out.Stdout), "\n") {
			k, v, _ := strings.Cut(line, "\t")
			res[k] = v
		}

		mu.Lock()
		assert.Check(t, is.Len(reached, 0), "the guest reached the host: %v", reached)
		mu.Unlock()
		for k, v := range res {
			if strings.HasPrefix(k, "tcp ") {
				assert.Check(t, v != "CONNECTED", "%s connected", k)
			}
		}
		// The gateway and DNS addresses refuse at once (a RST), rather
		// than leave the guest waiting.
		for _, k := range []string{"tcp 10.0.2.2", "tcp 10.0.2.3"} {
			assert.Check(t, is.Equal(res[k], "ConnectionRefusedError:ECONNREFUSED"), k)
		}
		for _, g := range guesses {
			assert.Check(t, is.Contains(res, "tcp "+g))
		}

		assert.Check(t, is.Equal(res["echo"], "ping through usernet"))
		assert.Check(t, is.Equal(echoed(), wantEchoes))
		assert.Check(t, is.Equal(res["dns localhost"], "rcode=0 answers=1 last=127.0.0.1"))
		assert.Check(t, is.Equal(res["dns invalid"], "rcode=3"))
	}
	probe(online, 1)
	waitTemplate(t, p, "python-1c512m-net/")
	restored := p.create(t, map[string]any{"network": true})
	assert.Check(t, strings.Contains(readyLine(t, p, restored), `"restored":true`))
	probe(restored, 2)
	p.stop(t, restored)

	// Without network: no device but loopback, and the test host is out
	// of reach.
	assert.Check(t, is.Equal(p.sh(t, offline, "ls /sys/class/net"), "lo\n"))
	out := p.exec(t, offline, "python3", "-c", fmt.Sprintf("import socket\nsocket.create_connection((%q, %d), timeout=5)", echo.Addr(), echo.Port()))
	assert.Check(t, !out.Success)
	assert.Check(t, is.Contains(out.Stderr, "Error"))
	assert.Check(t, is.Equal(echoed(), 2))
	p.stop(t, online)
	p.stop(t, offline)
}
