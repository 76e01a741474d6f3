package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk"
)

// Subcommand is the hidden first argument that makes the adapter binary a
// runner: `<adapter> __vm-run <state dir>`.
const Subcommand = "__vm-run"

// lifelineFD is where a runner finds the read end of its lifeline: the
// first of exec.Cmd.ExtraFiles.
const lifelineFD = 3

// SpawnOptions start one runner.
type SpawnOptions struct {
	// Executable is the adapter binary (os.Executable()).
	Executable string
	// Dir is the VM's state directory, already created and locked.
	Dir *Dir
	// Config is written to Dir as runner.json (0600).
	Config Config
	// Env is the runner's environment; nil means this process's, without
	// the go-plugin variables that are meant for the adapter alone.
	Env []string
}

// Process is a runner as its adapter sees it: one it spawned, or one it
// adopted from an adapter before it.
type Process struct {
	PID int
	dir string

	// lifeline is the write end of the lifeline pipe (spawned) or the
	// adopted connection; nil once let go of.
	lifeline io.WriteCloser
	lmu      sync.Mutex
	// adopted: the runner is not this process's child. Done comes from
	// the connection, and its pid is checked before it is signalled.
	adopted bool

	done    chan struct{}
	waitErr error
}

// Spawn writes the runner's configuration and starts it. The runner runs
// in a session of its own (setsid), with the read end of a lifeline pipe
// this Process holds the write end of; its stdout and stderr go to
// runner.log. Spawn returns once the process has started; the VM boots in
// the background.
func Spawn(ctx context.Context, opts SpawnOptions) (*Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if opts.Dir == nil || opts.Executable == "" {
		return nil, errors.New("runner: Spawn needs a state directory and an executable")
	}
	cfg, err := opts.Config.Encode()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(opts.Dir.File(ConfigName), cfg, 0o600); err != nil {
		return nil, fmt.Errorf("write the runner configuration: %w", err)
	}
	// A runner that may be adopted reads its key at start; one that may
	// not must not find an earlier runner's.
	keyPath := opts.Dir.File(AdoptKeyName)
	if opts.Config.AdoptGraceMS > 0 {
		if err := writeAdoptKey(keyPath); err != nil {
			return nil, err
		}
	} else if err := os.Remove(keyPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove an old adoption key: %w", err)
	}
	logf, err := os.OpenFile(opts.Dir.File(LogName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the runner log: %w", err)
	}
	defer logf.Close() // the child has its own descriptor
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("lifeline pipe: %w", err)
	}
	env := opts.Env
	if env == nil {
		env = RunnerEnv(os.Environ())
	}
	cmd := exec.Command(opts.Executable, Subcommand, opts.Dir.Path)
	cmd.Env = env
	cmd.Dir = "/"
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	// The runner has its own copy of the read end; this process keeps
	// only the write end, so that its death is the runner's EOF.
	_ = r.Close()
	if err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("start the VM runner %s: %w", opts.Executable, err)
	}
	p := &Process{PID: cmd.Process.Pid, dir: opts.Dir.Path, lifeline: w, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// RunnerEnv is env without what only the adapter should see: go-plugin's
// handshake variables (a runner is not a plugin) and the engine's lifeline
// number.
func RunnerEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PLUGIN_") || k == contract.HandshakeMagicCookieKey || k == sdk.EnvLifelineFD {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// Done is closed once the runner has exited (and, when this process
// spawned it, been reaped).
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitErr is how the runner exited; valid once Done is closed. It is nil
// for an adopted runner, whose exit status only its parent sees.
func (p *Process) ExitErr() error {
	select {
	case <-p.done:
		return p.waitErr
	default:
		return nil
	}
}

// Release tells the runner to kill its VM now and exit: it sends the stop
// byte on the lifeline and closes it. It is safe to call more than once,
// and after Detach (when it does nothing).
func (p *Process) Release() { p.letGo(true) }

// Detach lets go of the runner without stopping it: it closes the lifeline
// without the stop byte. A runner started with Config.AdoptGraceMS keeps
// its VM that long for a new adapter to Adopt, then kills it and exits;
// one without kills its VM at once. Done still closes when the runner
// exits. It is safe to call more than once, and after Release (when it
// does nothing).
func (p *Process) Detach() { p.letGo(false) }

// letGo ends this process's hold on the lifeline, with the stop byte or
// without. An adopted connection is only half-closed, so that its EOF
// still tells when the runner exits.
func (p *Process) letGo(stop bool) {
	p.lmu.Lock()
	defer p.lmu.Unlock()
	if p.lifeline == nil {
		return
	}
	conn, isConn := p.lifeline.(*net.UnixConn)
	if stop {
		if isConn {
			// A runner that is alive reads at once; a frozen one
			// must not hold the adapter up.
			_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
		}
		// A runner that has gone makes this EPIPE, which changes
		// nothing.
		_, _ = p.lifeline.Write([]byte{stopByte})
	}
	if isConn {
		_ = conn.CloseWrite()
	} else {
		_ = p.lifeline.Close()
	}
	p.lifeline = nil
}

// Kill SIGKILLs the runner's session and the VM process it recorded (after
// checking the pid really is this directory's VM), then waits for the
// runner to be gone, up to ctx. An adopted runner is signalled only while
// its pid is still this directory's runner (it is not our child: its pid
// could have been reused once it exited).
func (p *Process) Kill(ctx context.Context) error {
	p.Release()
	select {
	case <-p.done:
	default:
		if !p.adopted || BelongsTo(procArgs(p.PID), p.dir) {
			kill(p.PID)
		}
	}
	if pid, err := ReadPID(p.dir + "/" + VMPIDName); err == nil && pid != p.PID && BelongsTo(procArgs(pid), p.dir) {
		kill(pid)
	}
	if !p.adopted {
		return p.Wait(ctx)
	}
	// The connection's EOF comes when the runner's descriptors close; a
	// pid that is gone will do too.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if !alive(p.PID) {
				return nil
			}
		}
	}
}

// Wait waits for the runner to exit.
func (p *Process) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop ends the runner gently, then firmly: Release and give the runner
// grace to kill its VM and exit, then SIGKILL everything.
func (p *Process) Stop(ctx context.Context, grace time.Duration) error {
	p.Release()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killWait)
	defer cancel()
	return p.Kill(kctx)
}
