package boot

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// fakeRunner stands in for a runner process in dial tests.
type fakeRunner struct{ done chan struct{} }

func (f *fakeRunner) Done() <-chan struct{} { return f.done }
func (f *fakeRunner) ExitErr() error        { return errors.New("exit status 1") }

// fakeAgent serves the agent's handshake on a unix socket, ignoring the
// first `silent` connections' hellos (a guest that never saw them).
func fakeAgent(t *testing.T, silent int32) (string, *atomic.Int32) {
	t.Helper()
	sock := filepath.Join(dirs.Short(t, "ah"), "exec.sock")
	ln, err := net.Listen("unix", sock)
	assert.NilError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	var conns atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				if err := agentproto.SkipToMagic(br); err != nil {
					return
				}
				f, err := agentproto.ReadFrameBuffered(br)
				if err != nil || n <= silent {
					_, _ = br.ReadByte() // hold the connection until the host hangs up
					return
				}
				host, err := agentproto.DecodeHello(f.Payload)
				if err != nil {
					return
				}
				p, _ := json.Marshal(agentproto.Hello{Role: agentproto.RoleAgent, ProtocolMajor: agentproto.ProtocolMajor, Nonce: host.Nonce})
				buf, _ := agentproto.AppendFrame([]byte(agentproto.Magic), agentproto.Frame{Kind: agentproto.KindHello, Payload: p})
				_, _ = c.Write(buf)
				_, _ = br.ReadByte()
			}()
		}
	}()
	return sock, &conns
}

func TestDialAgentReconnects(t *testing.T) {
	sock, conns := fakeAgent(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := dialAgentWindows(ctx, &fakeRunner{done: make(chan struct{})}, sock, hclog.NewNullLogger(), 50*time.Millisecond, 100*time.Millisecond)
	assert.NilError(t, err)
	assert.NilError(t, c.Close())
	assert.Equal(t, conns.Load(), int32(3))
}

func TestDialAgentGivesUp(t *testing.T) {
	t.Run("at the boot deadline", func(t *testing.T) {
		sock, _ := fakeAgent(t, 1000)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := dialAgentWindows(ctx, &fakeRunner{done: make(chan struct{})}, sock, hclog.NewNullLogger(), 50*time.Millisecond, 50*time.Millisecond)
		assert.ErrorContains(t, err, "no hello from the guest agent in time")
	})
	t.Run("when the runner exits", func(t *testing.T) {
		sock, _ := fakeAgent(t, 1000)
		r := &fakeRunner{done: make(chan struct{})}
		time.AfterFunc(100*time.Millisecond, func() { close(r.done) })
		_, err := dialAgentWindows(context.Background(), r, sock, hclog.NewNullLogger(), time.Hour, time.Hour)
		assert.ErrorContains(t, err, "the VM exited before its guest agent answered (runner: exit status 1)")
	})
}
