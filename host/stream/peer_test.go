package stream

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestOtherUserRule(t *testing.T) {
	req := func(remote, auth string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = remote
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 3112}
		return r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, local))
	}
	isAdmin := func(tok string) bool { return tok == "the-token" }
	owner := func(uid int) func(netip.AddrPort, netip.AddrPort) (int, bool) {
		return func(server, peer netip.AddrPort) (int, bool) {
			assert.Check(t, is.Equal(server.Port(), uint16(3112)))
			return uid, true
		}
	}
	unknown := func(netip.AddrPort, netip.AddrPort) (int, bool) { return 0, false }
	for _, tc := range []struct {
		name, remote, auth string
		lookup             func(netip.AddrPort, netip.AddrPort) (int, bool)
		refused            bool
	}{
		{"the engine's user", "127.0.0.1:5000", "", owner(1000), false},
		{"another user", "127.0.0.1:5000", "", owner(1001), true},
		{"another user, IPv6 loopback", "[::1]:5000", "", owner(1001), true},
		{"another user with a wrong token", "127.0.0.1:5000", "Bearer nope", owner(1001), true},
		{"another user with the engine token", "127.0.0.1:5000", "Bearer the-token", owner(1001), false},
		{"tables unreadable", "127.0.0.1:5000", "", unknown, false},
		{"beyond loopback", "192.0.2.1:5000", "", owner(1001), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why := otherUser(req(tc.remote, tc.auth), isAdmin, tc.lookup, 1000)
			assert.Equal(t, why != "", tc.refused, why)
		})
	}
}

// envDial makes the test binary a client of the stream socket at its
// value (TestHelperDialStream), run as another user.
const envDial = "III_STREAM_TEST_DIAL"

func TestHelperDialStream(t *testing.T) {
	addr := os.Getenv(envDial)
	if addr == "" {
		t.Skip("a helper: runs only as the other user's client of TestOtherUserRefused")
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws://"+addr+"/", nil)
	if err == nil {
		_ = c.CloseNow()
		fmt.Println("STATUS 101")
		return
	}
	if resp == nil {
		t.Fatalf("dial: %v", err)
	}
	fmt.Printf("STATUS %d\n", resp.StatusCode)
}

// A local process of another user cannot open the stream socket (no
// auth_function): 401, and it joins nothing. The engine's own user can.
func TestOtherUserRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	f := start(t, Config{})
	addr := f.w.Addr()
	// The test binary, where the other user can run it.
	dir, err := os.MkdirTemp("", "iii-stream-peer-")
	assert.NilError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	assert.NilError(t, os.Chmod(dir, 0o755))
	self, err := os.Executable()
	assert.NilError(t, err)
	data, err := os.ReadFile(self)
	assert.NilError(t, err)
	bin := filepath.Join(dir, "stream.test")
	assert.NilError(t, os.WriteFile(bin, data, 0o755))

	run := func(cred *syscall.Credential) string {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "-test.run=^TestHelperDialStream$", "-test.count=1")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), envDial+"="+addr, "HOME="+dir, "GOCACHE="+dir, "TMPDIR="+dir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		// Its exit status is not the point (the helper's own goroutine
		// checks may object to the refused dial): the status line is.
		out, _ := cmd.CombinedOutput()
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "STATUS ") {
				return strings.TrimPrefix(line, "STATUS ")
			}
		}
		t.Fatalf("the helper printed no status:\n%s", out)
		return ""
	}
	assert.Equal(t, run(&syscall.Credential{Uid: 65534, Gid: 65534}), "401", "another user")
	assert.Equal(t, run(nil), "101", "the engine's user")
}
