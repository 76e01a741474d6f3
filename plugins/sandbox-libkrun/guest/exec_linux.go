package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// Executor runs exec requests.
type Executor struct {
	Waiter Waiter
	// DrainGrace is how long output is still read after the process has
	// exited. A background child (`cmd &`) inherits the pipes and may hold
	// them open for ever; after the grace the agent stops reading and
	// replies.
	DrainGrace time.Duration
}

// DefaultDrainGrace is the Executor's DrainGrace when it is zero.
const DefaultDrainGrace = 250 * time.Millisecond

// Run runs req to completion. A program that cannot be found or executed is
// a normal result (exit 127 or 126), as in a shell. When the timeout fires
// or ctx ends, the whole process tree of the exec is killed before Run
// returns.
func (e *Executor) Run(ctx context.Context, req *agentproto.ExecRequest, eio ExecIO) (*agentproto.ExitStatus, error) {
	env := withDefaultPath(req.Env)
	dir := req.Workdir
	if dir == "" {
		dir = "/"
	}
	maxOut := req.MaxOutputBytes
	if maxOut == 0 {
		maxOut = agentproto.DefaultMaxOutput
	}

	// The workdir is not checked up front: the child's chdir checks it, and
	// notRunnable tells a bad workdir from a bad program when something
	// fails. A stat here would cost every exec a syscall for the rare
	// failure.
	prog, err := lookPath(req.Argv[0], envValue(env, "PATH"), dir)
	if err != nil {
		return e.notRunnable(ctx, req.Argv[0], dir, err, eio)
	}

	stdoutR, stdoutW, err := childPipe(false)
	if err != nil {
		return nil, agentproto.Errorf(agentproto.CodeInternal, "stdout pipe: %v", err)
	}
	defer stdoutR.Close()
	stderrR, stderrW, err := childPipe(false)
	if err != nil {
		_ = syscall.Close(stdoutW)
		return nil, agentproto.Errorf(agentproto.CodeInternal, "stderr pipe: %v", err)
	}
	defer stderrR.Close()
	var stdinW *os.File
	var stdinChild int
	if eio.Stdin != nil {
		stdinW, stdinChild, err = childPipe(true)
	} else {
		stdinChild, err = syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	}
	if err != nil {
		_ = syscall.Close(stdoutW)
		_ = syscall.Close(stderrW)
		return nil, agentproto.Errorf(agentproto.CodeInternal, "stdin: %v", err)
	}

	start := time.Now()
	pid, exited, err := e.Waiter.Start(func() (int, error) {
		return syscall.ForkExec(prog, req.Argv, &syscall.ProcAttr{
			Dir:   dir,
			Env:   env,
			Files: []uintptr{uintptr(stdinChild), uintptr(stdoutW), uintptr(stderrW)},
			// A new session makes the exec a process group of its own
			// (pgid = pid) and marks every descendant with session id =
			// pid, so a timeout can find and kill even those that moved
			// to another process group.
			Sys: &syscall.SysProcAttr{Setsid: true},
		})
	})
	_ = syscall.Close(stdinChild)
	_ = syscall.Close(stdoutW)
	_ = syscall.Close(stderrW)
	if err != nil {
		if stdinW != nil {
			_ = stdinW.Close()
		}
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return e.notRunnable(ctx, req.Argv[0], dir, errno, eio)
		}
		return nil, agentproto.Errorf(agentproto.CodeInternal, "start %s: %v", req.Argv[0], err)
	}
	if eio.Started != nil {
		eio.Started(pid)
	}

	// Output pumps run until the pipes close or the drain grace ends.
	outCtx, stopOut := context.WithCancel(context.WithoutCancel(ctx))
	defer stopOut()
	// Each pump reports on pumped when its pipe has closed.
	pumped := make(chan struct{}, 2)
	var stdoutTrunc, stderrTrunc bool
	go func() { stdoutTrunc = pump(outCtx, stdoutR, eio.Stdout, maxOut); pumped <- struct{}{} }()
	go func() { stderrTrunc = pump(outCtx, stderrR, eio.Stderr, maxOut); pumped <- struct{}{} }()

	stdinCtx, stopStdin := context.WithCancel(ctx)
	defer stopStdin()
	var stdinWG sync.WaitGroup
	if stdinW != nil {
		stdinWG.Add(1)
		go func() { defer stdinWG.Done(); feedStdin(stdinCtx, stdinW, eio.Stdin) }()
	}

	var timeoutC <-chan time.Time
	if req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeoutC = t.C
	}
	done := ctx.Done()
	var ws syscall.WaitStatus
	var timedOut, canceled bool
wait:
	for {
		select {
		case ws = <-exited:
			break wait
		case <-timeoutC:
			timedOut, timeoutC = true, nil
			KillTree(pid)
		case <-done:
			canceled, done = true, nil
			KillTree(pid)
		}
	}
	dur := time.Since(start)
	if timedOut || canceled {
		// The leader is gone; make sure nothing it started lives on.
		KillTree(pid)
	}
	stopStdin()
	stdinWG.Wait()

	grace := e.DrainGrace
	if grace == 0 {
		grace = DefaultDrainGrace
	}
	drainTimer := time.NewTimer(grace)
	defer drainTimer.Stop()
	for left := 2; left > 0; {
		select {
		case <-pumped:
			left--
		case <-drainTimer.C:
			stopOut()
			_ = stdoutR.Close()
			_ = stderrR.Close()
			for ; left > 0; left-- {
				<-pumped
			}
		}
	}

	st := &agentproto.ExitStatus{
		TimedOut:        timedOut,
		Canceled:        canceled,
		StdoutTruncated: stdoutTrunc,
		StderrTruncated: stderrTrunc,
		DurationUS:      dur.Microseconds(),
	}
	switch {
	case ws.Exited():
		st.ExitCode = ws.ExitStatus()
	case ws.Signaled():
		st.Signal = int(ws.Signal())
		st.ExitCode = 128 + st.Signal
	default:
		st.ExitCode = -1
	}
	return st, nil
}

// notRunnable reports a program that could not be started the way a shell
// does: a message on stderr and exit 127 (missing) or 126 (not executable).
// A workdir that is not a directory fails the request instead: the lookup
// and the child's chdir report it as one of the same errors.
func (e *Executor) notRunnable(ctx context.Context, name, dir string, err error, eio ExecIO) (*agentproto.ExitStatus, error) {
	if fi, serr := os.Stat(dir); serr != nil || !fi.IsDir() {
		return nil, agentproto.Errorf(agentproto.CodeInvalidRequest, "workdir %s does not exist or is not a directory", dir)
	}
	code, what := 127, "command not found"
	switch {
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM), errors.Is(err, syscall.ENOEXEC),
		errors.Is(err, syscall.EISDIR):
		code, what = 126, "permission denied or not an executable"
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ENOTDIR):
	default:
		return nil, agentproto.Errorf(agentproto.CodeInternal, "start %s: %v", name, err)
	}
	if eio.Stderr != nil {
		_ = eio.Stderr(ctx, []byte(name+": "+what+"\n"))
	}
	return &agentproto.ExitStatus{ExitCode: code}, nil
}

// childPipe makes a pipe between the agent and a child: the child's end is
// a plain blocking descriptor (closed with syscall.Close once the child has
// it), the agent's end an *os.File on the runtime's poller. os.Pipe would
// put both ends on the poller and make them non-blocking, and handing the
// child its end (Fd) would then make that one blocking again: syscalls
// every exec paid for nothing.
func childPipe(childReads bool) (ours *os.File, child int, err error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return nil, -1, err
	}
	mine, child := p[0], p[1]
	if childReads {
		mine, child = p[1], p[0]
	}
	if err := syscall.SetNonblock(mine, true); err != nil {
		_ = syscall.Close(p[0])
		_ = syscall.Close(p[1])
		return nil, -1, err
	}
	// NewFile sees a non-blocking descriptor and puts it on the poller.
	return os.NewFile(uintptr(mine), "|"), child, nil
}

// minPumpBuffer is the size of pump's first read.
const minPumpBuffer = 4 << 10

// pump reads r until it closes, handing at most limit bytes to sink and
// dropping the rest, so the process never blocks on a full pipe. It reports
// whether output was dropped.
func pump(ctx context.Context, r io.Reader, sink func(context.Context, []byte) error, limit int64) (truncated bool) {
	var sent int64
	sinkOK := sink != nil
	// Each read gets a buffer of its own (the sink may keep it), sized by
	// the last read: most execs print little or nothing, and zeroing two
	// ChunkSize buffers per exec was most of an exec's allocation; a
	// process that fills its buffer gets twice as much next time.
	size := minPumpBuffer
	for {
		buf := make([]byte, size)
		n, err := r.Read(buf)
		if n == size {
			size = min(2*size, agentproto.ChunkSize)
		}
		if n > 0 {
			keep := int64(n)
			if sent+keep > limit {
				keep = limit - sent
				truncated = true
			}
			if keep > 0 && sinkOK {
				if serr := sink(ctx, buf[:keep]); serr != nil {
					sinkOK = false
				}
			}
			sent += keep
		}
		if err != nil {
			return truncated
		}
	}
}

// feedStdin copies stdin chunks into the pipe. After the process stops
// reading (EPIPE) it keeps taking chunks and drops them, because taking a
// chunk is what returns flow-control credit to the host.
func feedStdin(ctx context.Context, w *os.File, next func(context.Context) ([]byte, error)) {
	defer w.Close()
	writable := true
	for {
		p, err := next(ctx)
		if len(p) > 0 && writable {
			if _, werr := w.Write(p); werr != nil {
				writable = false
			}
		}
		if err != nil {
			return
		}
	}
}

func withDefaultPath(env []string) []string {
	out := make([]string, 0, len(env)+1)
	out = append(out, env...)
	if !hasKey(env, "PATH") {
		out = append(out, "PATH="+agentproto.DefaultPath)
	}
	return out
}

func hasKey(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

// envValue returns the last value of key, as getenv in the child would see.
func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// lookPath finds a program the way execvp does, but in the PATH of the
// exec's own environment (not the agent's). It returns ENOENT when nothing
// is found and EACCES when only non-executable candidates are. A name with
// a slash is returned as it is, for execve to judge.
func lookPath(file, pathEnv, dir string) (string, error) {
	check := func(p string) error {
		full := p
		if !filepath.IsAbs(full) {
			full = filepath.Join(dir, full)
		}
		fi, err := os.Stat(full)
		if err != nil {
			var errno syscall.Errno
			if errors.As(err, &errno) && errno != syscall.ENOENT && errno != syscall.ENOTDIR {
				return errno
			}
			return syscall.ENOENT
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return syscall.EACCES
		}
		return nil
	}
	if strings.Contains(file, "/") {
		// A path is not searched: execve itself reports what a stat
		// would (ENOENT, EACCES for a directory or a file without x),
		// and notRunnable turns that into 127 or 126.
		return file, nil
	}
	found := error(syscall.ENOENT)
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, file)
		err := check(p)
		if err == nil {
			if !filepath.IsAbs(p) {
				p = filepath.Join(dir, p)
			}
			return p, nil
		}
		if errors.Is(err, syscall.EACCES) {
			found = err
		}
	}
	return "", found
}

// KillTree kills the process group and session led by pid: everything the
// exec started, including processes that left its process group (but not
// those that started a session of their own: they have chosen to be
// daemons). It returns when none of them is alive (zombies waiting for the
// reaper do not count) or after a bounded number of rounds.
func KillTree(pid int) {
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	for round := 0; round < 100; round++ {
		left := sessionMembers(pid)
		if len(left) == 0 {
			return
		}
		for _, p := range left {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		time.Sleep(2 * time.Millisecond)
	}
}

// sessionMembers lists live processes whose session or process group is
// sid.
func sessionMembers(sid int) []int {
	des, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, de := range des {
		pid, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		st, err := ReadProcStat(pid)
		if err != nil || st.State == 'Z' || st.State == 'X' {
			continue
		}
		if st.Session == sid || st.Pgrp == sid {
			out = append(out, pid)
		}
	}
	return out
}

// ProcStat is the part of /proc/<pid>/stat the agent uses.
type ProcStat struct {
	State   byte
	PPID    int
	Pgrp    int
	Session int
}

// ReadProcStat reads /proc/<pid>/stat.
func ReadProcStat(pid int) (ProcStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ProcStat{}, err
	}
	return ParseProcStat(string(b))
}

// ParseProcStat parses the text of /proc/<pid>/stat. The command name is in
// parentheses and may itself hold spaces and parentheses, so fields are
// counted from the last ')'.
func ParseProcStat(s string) (ProcStat, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ProcStat{}, errors.New("proc stat: no command name")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 4 || len(f[0]) != 1 {
		return ProcStat{}, errors.New("proc stat: too few fields")
	}
	var st ProcStat
	st.State = f[0][0]
	var err error
	if st.PPID, err = strconv.Atoi(f[1]); err != nil {
		return ProcStat{}, fmt.Errorf("proc stat: ppid: %w", err)
	}
	if st.Pgrp, err = strconv.Atoi(f[2]); err != nil {
		return ProcStat{}, fmt.Errorf("proc stat: pgrp: %w", err)
	}
	if st.Session, err = strconv.Atoi(f[3]); err != nil {
		return ProcStat{}, fmt.Errorf("proc stat: session: %w", err)
	}
	return st, nil
}
