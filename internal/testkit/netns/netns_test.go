//go:build linux

package netns

import (
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestEcho(t *testing.T) {
	h := Start(t)
	assert.Equal(t, h.Gateway.Next(), h.Addr)
	addr, accepted := h.Echo(t)
	assert.Equal(t, addr.Addr(), h.Addr)
	c, err := net.DialTimeout("tcp", addr.String(), 10*time.Second)
	assert.NilError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "ping")
	assert.NilError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	assert.NilError(t, err)
	assert.Equal(t, string(buf), "ping")
	assert.Equal(t, accepted(), 1)

	// A second host at once gets its own block.
	h2 := Start(t)
	assert.Assert(t, h2.Addr != h.Addr)
	// The listener lives in the namespace: this side has no such address.
	_, err = net.Listen("tcp", net.JoinHostPort(h.Addr.String(), "0"))
	assert.Assert(t, err != nil)
}
