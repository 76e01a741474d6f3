//go:build linux

package agentclient

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// waitScript is a shell line that waits for the file name in dir.
func waitScript(dir, name string) string {
	return "while [ ! -e " + filepath.Join(dir, name) + " ]; do sleep 0.02; done"
}

func touch(t *testing.T, dir, name string) {
	t.Helper()
	assert.NilError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o600))
}

// waitGone waits until pid no longer exists (the agent reaped it).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return poll.Success()
		}
		return poll.Continue("pid %d still exists", pid)
	}, poll.WithTimeout(20*time.Second), poll.WithDelay(10*time.Millisecond))
}

// TestKeptProcessOutlivesItsConnection: a process spawned with Keep goes on
// when its host connection closes (an adapter restart); a new connection
// attaches to it by name, gets what it wrote meanwhile and then its live
// output, and its exit.
func TestKeptProcessOutlivesItsConnection(t *testing.T) {
	env := startAgent(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	c1 := env.connect(t)
	var first lines
	script := "echo before; " + waitScript(dir, "go1") + "; echo during; echo oops >&2; " + waitScript(dir, "go2") + "; echo after; exit 3"
	p1, err := c1.Spawn(ctx, agentproto.SpawnRequest{Name: "worker", Argv: []string{"/bin/sh", "-c", script}, Keep: true}, first.sink)
	assert.NilError(t, err)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if first.get(agentproto.KindStdout) == "before\n" {
			return poll.Success()
		}
		return poll.Continue("no first line yet")
	}, poll.WithTimeout(20*time.Second), poll.WithDelay(10*time.Millisecond))
	// The agent learns the first host is gone when the next says hello.
	assert.NilError(t, c1.Close())
	c2 := env.connect(t)
	touch(t, dir, "go1") // written while nobody is attached

	var second lines
	p2, err := c2.Attach(ctx, "worker", second.sink)
	assert.NilError(t, err)
	assert.Equal(t, p2.PID, p1.PID, "the same process")
	assert.Equal(t, p2.Dropped, int64(0))
	touch(t, dir, "go2")
	es, err := p2.Wait(ctx)
	assert.NilError(t, err)
	assert.Equal(t, es.ExitCode, 3)
	assert.Equal(t, second.get(agentproto.KindStdout), "during\nafter\n")
	assert.Equal(t, second.get(agentproto.KindStderr), "oops\n")
	assert.Equal(t, first.get(agentproto.KindStdout), "before\n", "the first connection got nothing more")

	// Its exit stays attachable (a report may have reached nobody).
	p3, err := c2.Attach(ctx, "worker", nil)
	assert.NilError(t, err)
	es, err = p3.Wait(ctx)
	assert.NilError(t, err)
	assert.Equal(t, es.ExitCode, 3)
}

// TestKeptProcessExitsWhileDetached: the exit of a kept process that ended
// with no host attached is held for the next attach, with its output.
func TestKeptProcessExitsWhileDetached(t *testing.T) {
	env := startAgent(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c1 := env.connect(t)
	p1, err := c1.Spawn(ctx, agentproto.SpawnRequest{Name: "worker", Keep: true,
		Argv: []string{"/bin/sh", "-c", waitScript(dir, "go") + "; echo last words; exit 7"}}, nil)
	assert.NilError(t, err)
	assert.NilError(t, c1.Close())
	c2 := env.connect(t)
	touch(t, dir, "go")
	waitGone(t, p1.PID)

	var got lines
	p2, err := c2.Attach(ctx, "worker", got.sink)
	assert.NilError(t, err)
	es, err := p2.Wait(ctx)
	assert.NilError(t, err)
	assert.Equal(t, es.ExitCode, 7)
	assert.Equal(t, got.get(agentproto.KindStdout), "last words\n")

	// A new process may take the name now.
	p3, err := c2.Spawn(ctx, agentproto.SpawnRequest{Name: "worker", Argv: []string{"true"}, Keep: true}, nil)
	assert.NilError(t, err)
	es, err = p3.Wait(ctx)
	assert.NilError(t, err)
	assert.Equal(t, es.ExitCode, 0)
}

// TestKeptOutputIsBounded: what a detached process writes is held up to
// KeptOutputBytes, the newest kept, the rest counted as dropped.
func TestKeptOutputIsBounded(t *testing.T) {
	env := startAgent(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const total = 3_000_000
	c1 := env.connect(t)
	p1, err := c1.Spawn(ctx, agentproto.SpawnRequest{Name: "noisy", Keep: true,
		Argv: []string{"/bin/sh", "-c", waitScript(dir, "go") + "; head -c 2999999 /dev/zero | tr '\\0' x; echo"}}, nil)
	assert.NilError(t, err)
	assert.NilError(t, c1.Close())
	c2 := env.connect(t)
	touch(t, dir, "go")
	waitGone(t, p1.PID)

	var got lines
	p2, err := c2.Attach(ctx, "noisy", got.sink)
	assert.NilError(t, err)
	_, err = p2.Wait(ctx)
	assert.NilError(t, err)
	out := got.get(agentproto.KindStdout)
	assert.Equal(t, len(out), agentproto.KeptOutputBytes)
	assert.Equal(t, p2.Dropped, int64(total-agentproto.KeptOutputBytes))
	assert.Assert(t, strings.HasSuffix(out, "xx\n"), "the newest output is kept")
}

// TestCancelKillsAKeptProcess: the host's Cancel (Proc.Cancel) kills a kept
// process, as it does one bound to its stream; only the connection ending
// detaches.
func TestCancelKillsAKeptProcess(t *testing.T) {
	env := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := env.connect(t)
	p, err := c.Spawn(ctx, agentproto.SpawnRequest{Name: "sleeper", Keep: true, Argv: []string{"sleep", "300"}}, nil)
	assert.NilError(t, err)
	p.Cancel()
	waitfor.Closed(t, p.Done(), 20*time.Second, "the canceled kept process to end")
	waitGone(t, p.PID)
	noneLeft(t, c, "sleeper")

	// ProcStop stops one that is detached.
	p, err = c.Spawn(ctx, agentproto.SpawnRequest{Name: "sleeper", Keep: true, Argv: []string{"sleep", "300"}}, nil)
	assert.NilError(t, err)
	assert.NilError(t, c.Close())
	c2 := env.connect(t)
	res, err := c2.StopProc(ctx, "sleeper", 100)
	assert.NilError(t, err)
	assert.Assert(t, res.Stopped)
	waitGone(t, p.PID)
	noneLeft(t, c2, "sleeper")
}

// noneLeft waits until the agent has forgotten the kept process name (it
// does so just after the process is reaped).
func noneLeft(t *testing.T, c *Client, name string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := c.Attach(ctx, name, nil)
		switch {
		case agentproto.IsCode(err, agentproto.CodeNoProcess):
			return poll.Success()
		case err != nil:
			return poll.Error(err)
		}
		p.Cancel()
		return poll.Continue("the agent still holds %s", name)
	}, poll.WithTimeout(20*time.Second), poll.WithDelay(20*time.Millisecond))
}
