package runner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

var (
	testKey   = bytes.Repeat([]byte{7}, keyLen)
	testNonce = bytes.Repeat([]byte{9}, nonceLen)
)

// TestHandshakeLines: each side parses what the other formats, and
// nothing else.
func TestHandshakeLines(t *testing.T) {
	hello := formatHello(testNonce)
	assert.Equal(t, hello, "III-RUNNER 1 "+strings.Repeat("09", nonceLen)+"\n")
	nonce, err := parseHello(strings.TrimSuffix(hello, "\n"))
	assert.NilError(t, err)
	assert.DeepEqual(t, nonce, testNonce)
	mac := adoptMAC(testKey, "/s/x", testNonce)
	got, err := parseAdopt(strings.TrimSuffix(formatAdopt(mac), "\n"))
	assert.NilError(t, err)
	assert.DeepEqual(t, got, mac)
	rp, vp, err := parseReply(strings.TrimSuffix(formatOK(1234, 0), "\n"))
	assert.NilError(t, err)
	assert.Equal(t, rp, 1234)
	assert.Equal(t, vp, 0)
	_, _, err = parseReply(strings.TrimSuffix(formatNo("busy"), "\n"))
	assert.Check(t, errors.Is(err, ErrRefused))
	assert.Check(t, is.ErrorContains(err, "busy"))

	// The MAC binds the directory and the challenge.
	assert.Check(t, !bytes.Equal(mac, adoptMAC(testKey, "/s/y", testNonce)))
	assert.Check(t, !bytes.Equal(mac, adoptMAC(testKey, "/s/x", testNonce[1:])))

	hex64 := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name, line, want string
		parse            func(string) error
	}{
		{"hello: another version", "III-RUNNER 2 " + hex64, "protocol \"2\"", helloErr},
		{"hello: another word", "SSH-2.0-OpenSSH", "not a runner's greeting", helloErr},
		{"hello: no nonce", "III-RUNNER 1", "malformed", helloErr},
		{"hello: extra field", "III-RUNNER 1 " + hex64 + " x", "malformed", helloErr},
		{"hello: short nonce", "III-RUNNER 1 abcd", "hex digits", helloErr},
		{"hello: not hex", "III-RUNNER 1 " + strings.Repeat("zz", 32), "not hex", helloErr},
		{"adopt: lower case word", "adopt " + hex64, "not an adoption request", adoptErr},
		{"adopt: two spaces", "ADOPT  " + hex64, "not an adoption request", adoptErr},
		{"adopt: short mac", "ADOPT abcd", "hex digits", adoptErr},
		{"reply: other word", "MAYBE 1 2", "not a runner's answer", replyErr},
		{"reply: one pid", "OK 1234", "malformed", replyErr},
		{"reply: pid 1", "OK 1 2", "not a pid", replyErr},
		{"reply: negative vm pid", "OK 1234 -2", "not a pid", replyErr},
		{"reply: huge pid", "OK 99999999999 2", "not a pid", replyErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorContains(t, tc.parse(tc.line), tc.want)
		})
	}
}

func helloErr(l string) error { _, err := parseHello(l); return err }
func adoptErr(l string) error { _, err := parseAdopt(l); return err }
func replyErr(l string) error { _, _, err := parseReply(l); return err }

// TestReadLine: lines are bounded and nothing past the newline is read.
func TestReadLine(t *testing.T) {
	r := strings.NewReader("first\nsecond")
	l, err := readLine(r, maxLine)
	assert.NilError(t, err)
	assert.Equal(t, l, "first")
	rest, _ := io.ReadAll(r)
	assert.Equal(t, string(rest), "second")

	_, err = readLine(strings.NewReader("half"), maxLine)
	assert.Check(t, errors.Is(err, io.ErrUnexpectedEOF), "%v", err)
	_, err = readLine(strings.NewReader(""), maxLine)
	assert.Check(t, errors.Is(err, io.EOF), "%v", err)
	_, err = readLine(strings.NewReader(strings.Repeat("a", maxLine)+"\n"), maxLine)
	assert.ErrorContains(t, err, "longer than")
	l, err = readLine(strings.NewReader(strings.Repeat("a", maxLine-1)+"\n"), maxLine)
	assert.NilError(t, err)
	assert.Equal(t, len(l), maxLine-1)
}

// TestHandshakeConversation runs both sides of the handshake against each
// other: the right key is accepted, a wrong key or directory refused.
func TestHandshakeConversation(t *testing.T) {
	wrongKey := bytes.Repeat([]byte{8}, keyLen)
	for _, tc := range []struct {
		name     string
		key      []byte
		dir      string
		accepted bool
	}{
		{"right key", testKey, "/s/x", true},
		{"wrong key", wrongKey, "/s/x", false},
		{"other directory", testKey, "/s/y", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runnerEnd, adapterEnd := net.Pipe()
			defer runnerEnd.Close()
			defer adapterEnd.Close()
			type result struct {
				reason string
				err    error
			}
			res := make(chan result, 1)
			go func() {
				reason, err := checkAdopt(runnerEnd, testKey, "/s/x", testNonce)
				if err != nil {
					_, _ = io.WriteString(runnerEnd, formatNo(reason))
				} else {
					_, _ = io.WriteString(runnerEnd, formatOK(4321, 4322))
				}
				res <- result{reason, err}
			}()
			rp, vp, err := proveAdopt(adapterEnd, tc.key, tc.dir)
			r := waitfor.Recv(t, res, waitfor.Default, "the runner's side")
			if tc.accepted {
				assert.NilError(t, err)
				assert.NilError(t, r.err)
				assert.Equal(t, rp, 4321)
				assert.Equal(t, vp, 4322)
				return
			}
			assert.Check(t, errors.Is(err, ErrRefused), "%v", err)
			assert.Check(t, errors.Is(r.err, errBadProof), "%v", r.err)
			assert.Equal(t, r.reason, "refused")
		})
	}
}

// TestKeeperAdoptionStopsTheGrace drives a keeper in-process: an adoption
// during the grace stops its timer, so a timer that fires late changes
// nothing; a grace that runs out with nobody there stops the VM.
func TestKeeperAdoptionStopsTheGrace(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	k := newKeeper(hclog.NewNullLogger(), "/s/x", testKey, time.Hour, cancel)
	defer k.end(errors.New("test over"))

	k.detached("lifeline", "EOF")
	k.mu.Lock()
	gen, timer := k.gen, k.timer
	k.mu.Unlock()
	assert.Check(t, timer != nil, "no grace timer")

	runnerEnd, adapterEnd := net.Pipe()
	defer runnerEnd.Close()
	defer adapterEnd.Close()
	adopted := make(chan bool, 1)
	go func() { adopted <- k.handshake(runnerEnd) }()
	_, _, err := proveAdopt(adapterEnd, testKey, "/s/x")
	assert.NilError(t, err)
	assert.Check(t, waitfor.Recv(t, adopted, waitfor.Default, "the handshake"))
	k.mu.Lock()
	assert.Check(t, k.live)
	assert.Check(t, k.timer == nil, "the grace timer still runs")
	k.mu.Unlock()

	k.expire(gen) // the old grace's timer, firing late
	assert.NilError(t, ctx.Err(), "a stale grace stopped an adopted VM")

	// The adopter goes; nobody comes back.
	k.detached("adopted lifeline", "EOF")
	k.mu.Lock()
	gen = k.gen
	k.mu.Unlock()
	k.expire(gen)
	assert.Check(t, is.ErrorContains(context.Cause(ctx), "no adapter adopted the VM within 1h0m0s"))

	// A stopping runner refuses even the right key.
	r2, a2 := net.Pipe()
	defer r2.Close()
	defer a2.Close()
	go func() { adopted <- k.handshake(r2) }()
	_, _, err = proveAdopt(a2, testKey, "/s/x")
	assert.Check(t, is.ErrorContains(err, "stopping"))
	assert.Check(t, !waitfor.Recv(t, adopted, waitfor.Default, "the refused handshake"))
}

// FuzzHandshakeLines feeds arbitrary bytes to the handshake's line reader
// and parsers: nothing panics, lines stay bounded, and whatever parses
// formats back to a line that parses the same.
func FuzzHandshakeLines(f *testing.F) {
	f.Add([]byte(formatHello(testNonce)))
	f.Add([]byte(formatAdopt(adoptMAC(testKey, "/s/x", testNonce))))
	f.Add([]byte(formatOK(1234, 5678)))
	f.Add([]byte(formatOK(1234, 0)))
	f.Add([]byte(formatNo("busy")))
	f.Add([]byte("III-RUNNER 2 x\n"))
	f.Add([]byte("OK 0001 2\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		line, err := readLine(bytes.NewReader(b), maxLine)
		if err != nil {
			return
		}
		if len(line) >= maxLine || strings.ContainsRune(line, '\n') {
			t.Fatalf("readLine returned %q", line)
		}
		if nonce, err := parseHello(line); err == nil {
			if len(nonce) != nonceLen {
				t.Fatalf("nonce of %d bytes", len(nonce))
			}
			again, err := parseHello(strings.TrimSuffix(formatHello(nonce), "\n"))
			if err != nil || !bytes.Equal(again, nonce) {
				t.Fatalf("hello round trip: %v", err)
			}
		}
		if mac, err := parseAdopt(line); err == nil {
			if len(mac) != sha256.Size {
				t.Fatalf("MAC of %d bytes", len(mac))
			}
			again, err := parseAdopt(strings.TrimSuffix(formatAdopt(mac), "\n"))
			if err != nil || !bytes.Equal(again, mac) {
				t.Fatalf("adopt round trip: %v", err)
			}
		}
		if rp, vp, err := parseReply(line); err == nil {
			if rp <= 1 || vp < 0 {
				t.Fatalf("pids %d %d", rp, vp)
			}
			arp, avp, err := parseReply(strings.TrimSuffix(formatOK(rp, vp), "\n"))
			if err != nil || arp != rp || avp != vp {
				t.Fatalf("reply round trip: %v", err)
			}
		}
	})
}
