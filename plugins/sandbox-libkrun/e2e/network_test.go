package e2e

import (
	"fmt"
	"net"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/dirs"
)

// TestNetwork gives a sandbox outbound networking and reaches a server on
// the host's loopback through the guest's gateway; a sandbox without
// network has no way out.
func TestNetwork(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("hello from the host"))
			_ = c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	script := fmt.Sprintf("import socket\ns = socket.create_connection(('10.0.2.2', %d), timeout=10)\nprint(s.recv(100).decode())", port)

	p := start(t, e, dirs.Short(t, "sb"), nil)
	online := p.create(t, map[string]any{"network": true})
	offline := p.create(t, nil)
	out := p.exec(t, online, "python3", "-c", script)
	assert.Equal(t, out.Stdout, "hello from the host\n", "stderr: %s", out.Stderr)

	out = p.exec(t, offline, "python3", "-c", script)
	assert.Check(t, !out.Success)
	assert.Check(t, is.Contains(out.Stderr, "Error"))
	p.stop(t, online)
	p.stop(t, offline)
}
