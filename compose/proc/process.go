package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Shell runs every command Compose starts: scripts and start commands are
// shell command lines, as in a Makefile.
const Shell = "/bin/sh"

// pollInterval is how often a process that is not our child (adopted after
// a crash) or a process group is checked while waiting for it to end.
const pollInterval = 50 * time.Millisecond

// Spec describes a command to start in its own process group.
type Spec struct {
	// Command is run as `sh -c Command`.
	Command string
	// Dir is the working directory; it must exist.
	Dir string
	// Env is the complete environment; nothing is inherited from Compose.
	Env []string
	// Log receives stdout and stderr line by line; nil discards them.
	Log *Log
	// Argv, when set, is run directly instead of `sh -c Command`.
	Argv []string
	// ExtraFiles are passed to the child as fds 3, 4, ...
	ExtraFiles []*os.File
	// DieWithParent asks the kernel to send SIGTERM to the child when
	// Compose dies (Linux; elsewhere the lifeline pipe does this job).
	DieWithParent bool

	// onBusy, when set, is called after each start that failed with
	// "text file busy", before the next attempt (tests observe it).
	onBusy func(attempt int)
}

// Process is a process group Compose started (or adopted after a crash)
// and may stop. Its leader's pid is the group id.
type Process struct {
	Pid   int
	Birth string // "" when the platform cannot read it

	cmd     *exec.Cmd // nil for an adopted process
	done    chan struct{}
	waitErr error // set before done closes
	output  *capture
}

// busyAttempts bounds the starts of an executable that is "text file
// busy" (see Start).
const busyAttempts = 5

// command is the exec.Cmd that starts spec with its output into out.
func command(spec Spec, out *capture) *exec.Cmd {
	cmd := exec.Command(Shell, "-c", spec.Command)
	if len(spec.Argv) > 0 {
		cmd = exec.Command(spec.Argv[0], spec.Argv[1:]...)
	}
	cmd.Dir = spec.Dir
	cmd.ExtraFiles = spec.ExtraFiles
	cmd.Env = spec.Env
	if cmd.Env == nil {
		// exec treats a nil Env as "inherit"; Compose never inherits.
		cmd.Env = []string{}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if spec.DieWithParent {
		dieWithParent(cmd.SysProcAttr)
	}
	// Real files, not io.Writers: exec then hands them to the child as
	// they are, and Wait does not wait for grandchildren that keep the
	// pipes open.
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = out.stdoutW, out.stderrW
	return cmd
}

// Start spawns spec as the leader of a new process group. Output copying
// stops once every process holding the pipes has exited.
func Start(spec Spec) (*Process, error) {
	if spec.Dir != "" {
		st, err := os.Stat(spec.Dir)
		if err != nil {
			return nil, fmt.Errorf("working directory: %w", err)
		}
		if !st.IsDir() {
			return nil, fmt.Errorf("working directory %s is not a directory", spec.Dir)
		}
	}
	out, err := newCapture(spec.Log)
	if err != nil {
		return nil, err
	}
	var cmd *exec.Cmd
	for attempt := 1; ; attempt++ {
		cmd = command(spec, out)
		err := cmd.Start()
		if err == nil {
			break
		}
		// An executable written just now (a package Compose installed) is
		// "text file busy" while a child forked meanwhile elsewhere in
		// this process still holds the file's write descriptor; the child
		// drops it when it execs, within moments.
		if !errors.Is(err, syscall.ETXTBSY) || attempt == busyAttempts {
			out.abort()
			return nil, err
		}
		if spec.onBusy != nil {
			spec.onBusy(attempt)
		}
		time.Sleep(time.Duration(attempt) * 10 * time.Millisecond)
	}
	out.started()
	p := &Process{Pid: cmd.Process.Pid, cmd: cmd, done: make(chan struct{}), output: out}
	if b, err := Birth(p.Pid); err == nil {
		p.Birth = b
	}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Adopt takes over a process group a previous Compose started, once Check
// has said the pid is the same process. Its exit is seen by polling.
func Adopt(pid int, birth string) *Process {
	return &Process{Pid: pid, Birth: birth}
}

// Adopted reports whether p was adopted rather than started.
func (p *Process) Adopted() bool { return p.cmd == nil }

// Exited reports whether the leader has exited.
func (p *Process) Exited() bool {
	if p.cmd == nil {
		return Check(p.Pid, p.Birth) == Gone
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done is closed when a started process exits; nil for an adopted one.
func (p *Process) Done() <-chan struct{} {
	if p.cmd == nil {
		return nil
	}
	return p.done
}

// ExitStatus describes how the leader ended ("exit status 1", "signal:
// killed"); "" while it runs or when it was adopted.
func (p *Process) ExitStatus() string {
	if p.cmd == nil || !p.Exited() {
		return ""
	}
	if p.waitErr == nil {
		return "exit status 0"
	}
	var ee *exec.ExitError
	if errors.As(p.waitErr, &ee) {
		return ee.ProcessState.String()
	}
	return p.waitErr.Error()
}

// Wait blocks until the leader exits or ctx ends.
func (p *Process) Wait(ctx context.Context) error {
	if p.cmd != nil {
		select {
		case <-p.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for !p.Exited() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// OutputDone is closed when the output of the whole group has been copied
// to the log (every holder of the pipes has exited), or at once when there
// is no output to copy.
func (p *Process) OutputDone() <-chan struct{} {
	if p.output == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return p.output.done
}

// Signal sends sig to the whole process group.
func (p *Process) Signal(sig syscall.Signal) error {
	return signalGroup(p.Pid, p.Birth, sig)
}

// Stop ends the group: SIGTERM to every member, up to grace for the group
// to empty, then SIGKILL, then SIGKILL again for stragglers until the
// group is gone. It returns once the group is empty, or when ctx ends.
func (p *Process) Stop(ctx context.Context, grace time.Duration) error {
	if err := p.stop(ctx, grace); err != nil {
		return err
	}
	if p.output != nil {
		// Members that left the group (setsid) may still hold the pipes;
		// they are not ours to wait for.
		p.output.closeAfter(ctx, time.Second)
	}
	return nil
}

func (p *Process) stop(ctx context.Context, grace time.Duration) error {
	if p.cmd == nil && p.Birth != "" && Check(p.Pid, p.Birth) == Gone && Alive(p.Pid) {
		// The recorded leader is gone and its pid now names another
		// process. Its group cannot exist any more (a pid is not handed
		// out while it is in use as a group id), so nothing is ours.
		return nil
	}
	if p.groupGone() {
		return p.reap(ctx)
	}
	_ = signalGroup(p.Pid, p.Birth, syscall.SIGTERM)
	polite, cancel := context.WithTimeout(ctx, grace)
	err := p.waitGroupGone(polite)
	cancel()
	if err == nil {
		return p.reap(ctx)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	_ = killGroup(p.Pid)
	// SIGKILL cannot be refused: the group empties at once, apart from
	// members that were being forked while we signalled. Keep killing
	// until it is empty.
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for !p.groupGone() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		_ = killGroup(p.Pid)
	}
	return p.reap(ctx)
}

// reap waits for our own leader to be collected, so its exit status is
// known when Stop returns.
func (p *Process) reap(ctx context.Context) error {
	return p.Wait(ctx)
}

// groupGone reports whether no process is left in the group. An exited
// leader that is not reaped yet still counts as a member, so a started
// process's group is gone only after Wait has collected it.
func (p *Process) groupGone() bool {
	return errors.Is(syscall.Kill(-p.Pid, 0), syscall.ESRCH)
}

func (p *Process) waitGroupGone(ctx context.Context) error {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for !p.groupGone() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// signalGroup signals the group led by pid, unless the leader is alive and
// is not the process that was recorded (its pid was reused).
func signalGroup(pid int, birth string, sig syscall.Signal) error {
	if pid <= 1 {
		return fmt.Errorf("refusing to signal process group %d", pid)
	}
	if birth != "" && Alive(pid) {
		if live, err := Birth(pid); err == nil && live != birth {
			return fmt.Errorf("pid %d is now another process", pid)
		}
	}
	err := syscall.Kill(-pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

func killGroup(pid int) error {
	if pid <= 1 {
		return nil
	}
	return syscall.Kill(-pid, syscall.SIGKILL)
}

// Capture helper ---------------------------------------------------------

// capture copies a child's stdout and stderr into a Log through pipes we
// own.
type capture struct {
	stdoutW, stderrW *os.File // the child's ends (closed in the parent after start)
	stdoutR, stderrR *os.File
	done             chan struct{}
	once             sync.Once
}

func newCapture(l *Log) (*capture, error) {
	c := &capture{done: make(chan struct{})}
	if l == nil {
		null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		if err != nil {
			return nil, err
		}
		c.stdoutW, c.stderrW = null, null
		close(c.done)
		return c, nil
	}
	var err error
	if c.stdoutR, c.stdoutW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if c.stderrR, c.stderrW, err = os.Pipe(); err != nil {
		c.stdoutR.Close()
		c.stdoutW.Close()
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); l.copyFrom(Stdout, c.stdoutR) }()
	go func() { defer wg.Done(); l.copyFrom(Stderr, c.stderrR) }()
	go func() {
		wg.Wait()
		close(c.done)
	}()
	return c, nil
}

// started closes the parent's copies of the child's ends, so the readers
// see EOF once the child's side is closed.
func (c *capture) started() {
	c.stdoutW.Close()
	if c.stderrW != c.stdoutW {
		c.stderrW.Close()
	}
}

// abort undoes newCapture after a failed start.
func (c *capture) abort() {
	c.started()
	c.closeReaders()
	<-c.done
}

func (c *capture) closeReaders() {
	c.once.Do(func() {
		if c.stdoutR != nil {
			c.stdoutR.Close()
		}
		if c.stderrR != nil {
			c.stderrR.Close()
		}
	})
}

// closeAfter waits up to d (or ctx) for the copying to finish, then closes
// the read ends so a process that escaped the group cannot hold the
// goroutines forever.
func (c *capture) closeAfter(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.done:
		return
	case <-t.C:
	case <-ctx.Done():
	}
	c.closeReaders()
	<-c.done
}
