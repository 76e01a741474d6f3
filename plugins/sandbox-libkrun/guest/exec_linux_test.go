package guest

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// collector gathers an exec's output like the session does, but in memory.
type collector struct {
	mu             sync.Mutex
	stdout, stderr bytes.Buffer
	pid            int
}

func (c *collector) io(stdin []byte) ExecIO {
	eio := ExecIO{
		Stdout: func(_ context.Context, p []byte) error {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.stdout.Write(p)
			return nil
		},
		Stderr: func(_ context.Context, p []byte) error {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.stderr.Write(p)
			return nil
		},
		Started: func(pid int) { c.mu.Lock(); defer c.mu.Unlock(); c.pid = pid },
	}
	if stdin != nil {
		eio.Stdin = chunksOf(stdin, 7000)
	}
	return eio
}

// chunksOf serves p in chunks, as stdin frames would arrive.
func chunksOf(p []byte, size int) func(context.Context) ([]byte, error) {
	var mu sync.Mutex
	return func(ctx context.Context) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(p) == 0 {
			return nil, io.EOF
		}
		n := min(size, len(p))
		c := p[:n]
		p = p[n:]
		return c, nil
	}
}

func newExecutor() *Executor {
	return &Executor{Waiter: PIDWaiter{}, DrainGrace: 100 * time.Millisecond}
}

func TestExecResults(t *testing.T) {
	dir := t.TempDir()
	noexec := filepath.Join(dir, "noexec.sh")
	assert.NilError(t, os.WriteFile(noexec, []byte("#!/bin/sh\necho no\n"), 0o644))
	script := filepath.Join(dir, "ok.sh")
	assert.NilError(t, os.WriteFile(script, []byte("#!/bin/sh\necho ok\n"), 0o755))

	tests := []struct {
		name       string
		req        agentproto.ExecRequest
		stdin      []byte
		wantCode   int
		wantSignal int
		wantOut    string
		wantErrSub string
	}{
		{name: "echo", req: agentproto.ExecRequest{Argv: []string{"echo", "hi"}}, wantOut: "hi\n"},
		{name: "exit code", req: agentproto.ExecRequest{Argv: []string{"sh", "-c", "echo err >&2; exit 3"}}, wantCode: 3, wantErrSub: "err"},
		{name: "explicit env, default PATH added", req: agentproto.ExecRequest{Argv: []string{"sh", "-c", "echo $FOO:$PATH"}, Env: []string{"FOO=bar"}},
			wantOut: "bar:" + agentproto.DefaultPath + "\n"},
		{name: "env does not leak from the agent", req: agentproto.ExecRequest{Argv: []string{"sh", "-c", "echo ${HOME:-unset}"}}, wantOut: "unset\n"},
		{name: "workdir", req: agentproto.ExecRequest{Argv: []string{"pwd"}, Workdir: dir}, wantOut: dir + "\n"},
		{name: "relative program in workdir", req: agentproto.ExecRequest{Argv: []string{"./ok.sh"}, Workdir: dir}, wantOut: "ok\n"},
		{name: "stdin", req: agentproto.ExecRequest{Argv: []string{"cat"}, Stdin: true}, stdin: []byte("abc\n"), wantOut: "abc\n"},
		{name: "empty stdin", req: agentproto.ExecRequest{Argv: []string{"wc", "-c"}, Stdin: true}, stdin: []byte{}, wantOut: "0\n"},
		{name: "no stdin is /dev/null", req: agentproto.ExecRequest{Argv: []string{"cat"}}, wantOut: ""},
		{name: "missing program", req: agentproto.ExecRequest{Argv: []string{"definitely-not-a-program"}}, wantCode: 127, wantErrSub: "not found"},
		{name: "missing path", req: agentproto.ExecRequest{Argv: []string{"/no/such/bin"}}, wantCode: 127},
		{name: "missing in explicit PATH", req: agentproto.ExecRequest{Argv: []string{"sh"}, Env: []string{"PATH=" + dir}}, wantCode: 127},
		{name: "not executable", req: agentproto.ExecRequest{Argv: []string{noexec}}, wantCode: 126, wantErrSub: "permission denied"},
		{name: "not executable via PATH", req: agentproto.ExecRequest{Argv: []string{"noexec.sh"}, Env: []string{"PATH=" + dir}}, wantCode: 126},
		{name: "a directory", req: agentproto.ExecRequest{Argv: []string{dir}}, wantCode: 126},
		{name: "killed by a signal", req: agentproto.ExecRequest{Argv: []string{"sh", "-c", "kill -TERM $$"}}, wantCode: 128 + 15, wantSignal: 15},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c collector
			st, err := newExecutor().Run(context.Background(), &tc.req, c.io(tc.stdin))
			assert.NilError(t, err)
			assert.Equal(t, st.ExitCode, tc.wantCode, "stderr: %s", c.stderr.String())
			assert.Equal(t, st.Signal, tc.wantSignal)
			assert.Equal(t, c.stdout.String(), tc.wantOut)
			assert.Assert(t, strings.Contains(c.stderr.String(), tc.wantErrSub), c.stderr.String())
			assert.Assert(t, !st.TimedOut && !st.StdoutTruncated && !st.StderrTruncated)
		})
	}
}

func TestExecBadWorkdir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	assert.NilError(t, os.WriteFile(file, nil, 0o755))
	// The workdir is judged only when the program does not start, so
	// every way of naming the program must still report the workdir.
	for _, argv0 := range []string{"true", "/bin/true", "./file", "no-such-program", "/no/such/program"} {
		for _, wd := range []string{"/no/such/dir", file} {
			_, err := newExecutor().Run(context.Background(), &agentproto.ExecRequest{Argv: []string{argv0}, Workdir: wd}, ExecIO{})
			assert.Equal(t, codeOf(t, err), agentproto.CodeInvalidRequest, "%s in %s", argv0, wd)
		}
	}
}

func TestExecTruncatesButDrains(t *testing.T) {
	var c collector
	// 3 MiB to stdout, then a line on stderr: the process only gets to
	// write the stderr line if stdout keeps being drained past the cap.
	st, err := newExecutor().Run(context.Background(), &agentproto.ExecRequest{
		Argv: []string{"sh", "-c", "head -c 3145728 /dev/zero; echo done >&2"},
	}, c.io(nil))
	assert.NilError(t, err)
	assert.Equal(t, st.ExitCode, 0)
	assert.Equal(t, c.stdout.Len(), agentproto.DefaultMaxOutput)
	assert.Assert(t, st.StdoutTruncated)
	assert.Assert(t, !st.StderrTruncated)
	assert.Equal(t, c.stderr.String(), "done\n")

	c = collector{}
	st, err = newExecutor().Run(context.Background(), &agentproto.ExecRequest{
		Argv: []string{"sh", "-c", "echo 0123456789"}, MaxOutputBytes: 4,
	}, c.io(nil))
	assert.NilError(t, err)
	assert.Equal(t, c.stdout.String(), "0123")
	assert.Assert(t, st.StdoutTruncated)
}

// liveMembers returns the processes of the exec's session or group that
// are still alive.
func liveMembers(pid int) []int { return sessionMembers(pid) }

func TestExecTimeoutKillsTheWholeTree(t *testing.T) {
	var c collector
	// Two background processes, one of which moved to a process group of
	// its own: all of them must die.
	st, err := newExecutor().Run(context.Background(), &agentproto.ExecRequest{
		Argv:      []string{"sh", "-c", `"$SELF" -test.run=^$ & sleep 100 & sleep 0.1; echo $$; wait`},
		Env:       []string{"SELF=" + os.Args[0], "GUEST_TEST_HELPER=pgidsleep"},
		TimeoutMS: 1000,
	}, c.io(nil))
	assert.NilError(t, err)
	assert.Assert(t, st.TimedOut)
	assert.Equal(t, st.ExitCode, 128+9)
	assert.Equal(t, st.Signal, 9)
	assert.Equal(t, strings.TrimSpace(c.stdout.String()), strconv.Itoa(c.pid))
	assert.DeepEqual(t, liveMembers(c.pid), []int(nil))
}

func TestExecCancelKills(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var c collector
	eio := c.io(nil)
	started := make(chan int, 1)
	eio.Started = func(pid int) { started <- pid }
	done := make(chan *agentproto.ExitStatus, 1)
	go func() {
		st, _ := newExecutor().Run(ctx, &agentproto.ExecRequest{Argv: []string{"sh", "-c", "sleep 100 & sleep 100"}}, eio)
		done <- st
	}()
	pid := waitfor.Recv(t, started, waitfor.Default, "the exec to start")
	cancel()
	st := waitfor.Recv(t, done, waitfor.Default, "the cancelled exec to end")
	assert.Assert(t, st.Canceled)
	assert.Equal(t, st.ExitCode, 128+9)
	assert.DeepEqual(t, liveMembers(pid), []int(nil))
}

func TestExecBackgroundChildDoesNotHoldTheReply(t *testing.T) {
	var c collector
	st, err := newExecutor().Run(context.Background(), &agentproto.ExecRequest{
		Argv: []string{"sh", "-c", "sleep 30 & echo done"},
	}, c.io(nil))
	assert.NilError(t, err)
	assert.Equal(t, st.ExitCode, 0)
	assert.Equal(t, c.stdout.String(), "done\n")
	// Detached work is allowed to go on; clean it up here.
	KillTree(c.pid)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if len(liveMembers(c.pid)) == 0 {
			return poll.Success()
		}
		return poll.Continue("background sleep still alive")
	})
}

func TestExecStdinLargerThanPipe(t *testing.T) {
	in := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	var c collector
	st, err := newExecutor().Run(context.Background(), &agentproto.ExecRequest{Argv: []string{"cat"}, Stdin: true, MaxOutputBytes: 2 << 20}, c.io(in))
	assert.NilError(t, err)
	assert.Equal(t, st.ExitCode, 0)
	assert.Assert(t, bytes.Equal(c.stdout.Bytes(), in))

	// A process that never reads stdin still finishes; the input is dropped.
	c = collector{}
	st, err = newExecutor().Run(context.Background(), &agentproto.ExecRequest{Argv: []string{"true"}, Stdin: true}, c.io(in))
	assert.NilError(t, err)
	assert.Equal(t, st.ExitCode, 0)
}

func TestExecConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c collector
			st, err := newExecutor().Run(context.Background(), &agentproto.ExecRequest{Argv: []string{"echo", strconv.Itoa(i)}}, c.io(nil))
			assert.Check(t, err)
			assert.Check(t, st != nil && st.ExitCode == 0)
			assert.Check(t, c.stdout.String() == strconv.Itoa(i)+"\n")
		}()
	}
	waitfor.Group(t, &wg, waitfor.Default, "the concurrent execs")
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "x"), nil, 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "y"), nil, 0o644))
	p, err := lookPath("x", "/nonexistent:"+dir, "/")
	assert.NilError(t, err)
	assert.Equal(t, p, filepath.Join(dir, "x"))
	_, err = lookPath("y", dir, "/")
	assert.ErrorContains(t, err, "permission denied")
	_, err = lookPath("z", dir, "/")
	assert.ErrorContains(t, err, "no such file")
	p, err = lookPath("x", ".", dir)
	assert.NilError(t, err)
	assert.Equal(t, p, filepath.Join(dir, "x"))
}

func TestParseProcStat(t *testing.T) {
	tests := []struct {
		in   string
		want ProcStat
		err  bool
	}{
		{"1 (init) S 0 1 1 0 -1", ProcStat{State: 'S', PPID: 0, Pgrp: 1, Session: 1}, false},
		{"42 (a b) c)) R 7 42 40 0", ProcStat{State: 'R', PPID: 7, Pgrp: 42, Session: 40}, false},
		{"42 (x) Z 1 2", ProcStat{}, true},
		{"no parens", ProcStat{}, true},
		{"1 (x) S a 1 1", ProcStat{}, true},
		{"1 (x) SS 1 1 1", ProcStat{}, true},
	}
	for _, tc := range tests {
		got, err := ParseProcStat(tc.in)
		assert.Equal(t, err != nil, tc.err, tc.in)
		if !tc.err {
			assert.Equal(t, got, tc.want)
		}
	}
}

func FuzzParseProcStat(f *testing.F) {
	f.Add("1 (init) S 0 1 1 0 -1")
	f.Add("2 ((x)) R 1 2 3")
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = ParseProcStat(s)
	})
}
