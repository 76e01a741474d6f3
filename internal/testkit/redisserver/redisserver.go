// Package redisserver runs a real redis-server for a test: on a free
// loopback port, without persistence, stopped in the test's cleanup.
// scripts/setup-test.sh installs it (Debian's redis-server); a test fails,
// not skips, without it.
package redisserver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/loopback"
)

// wait bounds the server's start and stop.
const wait = 20 * time.Second

// Server is a running redis-server.
type Server struct {
	// URL is redis://127.0.0.1:<port>.
	URL string
	// Client is a plain client, to look into Redis and tamper with it.
	Client *redis.Client
}

// Start runs a redis-server until the test ends.
func Start(t *testing.T) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not installed: run scripts/setup-test.sh (it installs the Debian package redis-server)")
	}
	port, err := loopback.FreePort()
	assert.NilError(t, err)
	dir := t.TempDir()
	logf, err := os.Create(filepath.Join(dir, "redis.log"))
	assert.NilError(t, err)
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	assert.NilError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	s := &Server{URL: "redis://" + addr, Client: redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})}
	t.Cleanup(func() {
		_ = s.Client.Close()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(wait):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logf.Close()
	})
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case err := <-exited:
			exited <- err
			out, _ := os.ReadFile(logf.Name())
			return poll.Error(fmt.Errorf("redis-server exited (%v): %s", err, out))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := s.Client.Ping(ctx).Err(); err != nil {
			return poll.Continue("redis-server not answering yet: %v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(wait), poll.WithDelay(20*time.Millisecond))
	return s
}
