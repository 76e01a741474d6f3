package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/consolelog"
)

// consoleDrain bounds how long the end of a VM waits for the console's
// and stderr's pipes to end after QEMU exited (a descendant that kept one
// open does not hold the end up).
const consoleDrain = 5 * time.Second

// stderrMaxBytes caps qemu.stderr (and its rotated qemu.stderr.1).
const stderrMaxBytes = 1 << 20

// cappedPipe is a pipe whose write end QEMU inherits and whose read end
// this process copies into a capped log (package consolelog).
type cappedPipe struct {
	in, out *os.File
	log     *consolelog.Log
	pumped  chan struct{}
}

func newCappedPipe(path string, maxBytes int64) (*cappedPipe, error) {
	l, err := consolelog.Create(path, maxBytes)
	if err != nil {
		return nil, err
	}
	in, out, err := os.Pipe()
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	return &cappedPipe{in: in, out: out, log: l, pumped: make(chan struct{})}, nil
}

// start lets go of this process's write end (the child holds its own)
// and copies the pipe into the log until it ends.
func (p *cappedPipe) start() {
	_ = p.out.Close()
	go func() {
		defer close(p.pumped)
		_ = consolelog.Pump(p.in, p.log)
	}()
}

// abort releases a pipe that was never started.
func (p *cappedPipe) abort() {
	_ = p.out.Close()
	_ = p.in.Close()
	_ = p.log.Close()
}

// drain waits, at most consoleDrain, for the pipe to end.
func (p *cappedPipe) drain() {
	select {
	case <-p.pumped:
	case <-time.After(consoleDrain):
		_ = p.in.Close()
		<-p.pumped
	}
}

// socketWait bounds how long Launch waits for QEMU to create the agent
// socket (it does so right after parsing its options, in milliseconds).
const socketWait = 10 * time.Second

// VM is a running QEMU process.
type VM struct {
	PID         int
	SocketPath  string
	StderrPath  string
	ConsolePath string
	Args        []string // the full command line, for logs

	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	killMu  sync.Mutex
}

// Launch starts QEMU and returns once the agent socket exists, so the
// caller can connect at once (the guest itself boots in the background).
// If anything fails after QEMU started, QEMU is killed before Launch
// returns.
func Launch(ctx context.Context, cfg Config) (*VM, error) {
	bin, err := cfg.Binary()
	if err != nil {
		return nil, err
	}
	args, err := cfg.Args()
	if err != nil {
		return nil, err
	}
	if cfg.Network && cfg.NetSocket == nil {
		return nil, &Error{Code: CodeBadConfig, Message: "network needs the NIC's socket (NetSocket)"}
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, &Error{Code: CodeStartFailed, Message: fmt.Sprintf("state dir: %v", err)}
	}
	console, err := newCappedPipe(filepath.Join(cfg.StateDir, ConsoleName), cfg.ConsoleMaxBytes)
	if err != nil {
		return nil, &Error{Code: CodeStartFailed, Message: fmt.Sprintf("console: %v", err)}
	}
	started := false
	defer func() {
		if !started {
			console.abort()
		}
	}()
	cfg.consoleOut = console.out
	vm := &VM{
		SocketPath:  cfg.SocketPath(),
		StderrPath:  filepath.Join(cfg.StateDir, StderrName),
		ConsolePath: filepath.Join(cfg.StateDir, ConsoleName),
		Args:        append([]string{bin}, args...),
		done:        make(chan struct{}),
	}
	// A socket left by an earlier VM in this dir would look ready.
	_ = os.Remove(vm.SocketPath)
	// QEMU's stderr is capped too: what a guest makes QEMU warn about
	// must not grow a file without bound either.
	stderr, err := newCappedPipe(vm.StderrPath, stderrMaxBytes)
	if err != nil {
		return nil, &Error{Code: CodeStartFailed, Message: fmt.Sprintf("stderr file: %v", err)}
	}
	defer func() {
		if !started {
			stderr.abort()
		}
	}()
	cmd := exec.Command(bin, args...)
	cmd.Stdin = nil
	cmd.Stdout = stderr.out
	cmd.Stderr = stderr.out
	cmd.ExtraFiles = cfg.extraFiles()
	// A process group of its own: signals meant for the caller's group
	// do not reach it, and Kill can take down anything it spawned.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if cfg.DieWithParent {
		setDieWithParent(cmd.SysProcAttr)
	}
	if err := cmd.Start(); err != nil {
		return nil, &Error{Code: CodeStartFailed, Message: fmt.Sprintf("start %s: %v", bin, err)}
	}
	started = true
	// Only QEMU writes them now: its exit is the pipes' EOF.
	console.start()
	stderr.start()
	vm.cmd, vm.PID = cmd, cmd.Process.Pid
	go func() {
		vm.waitErr = cmd.Wait()
		// What QEMU wrote before it exited is in the logs before Done.
		stderr.drain()
		console.drain()
		close(vm.done)
	}()

	deadline := time.NewTimer(socketWait)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(vm.SocketPath); err == nil {
			if cfg.Incoming == nil {
				return vm, nil
			}
			if err := vm.restore(ctx, cfg); err != nil {
				_ = vm.Kill()
				return nil, err
			}
			return vm, nil
		}
		select {
		case <-vm.done:
			return nil, vm.failure(CodeStartFailed, fmt.Sprintf("qemu exited during start: %v", vm.waitErr))
		case <-ctx.Done():
			_ = vm.Kill()
			return nil, ctx.Err()
		case <-deadline.C:
			_ = vm.Kill()
			return nil, vm.failure(CodeStartFailed, fmt.Sprintf("qemu did not create %s within %s", vm.SocketPath, socketWait))
		case <-tick.C:
		}
	}
}

func (vm *VM) failure(code, msg string) *Error {
	return &Error{Code: code, Message: msg, StderrTail: vm.StderrTail(20), ConsoleTail: vm.ConsoleTail(20)}
}

// Done is closed when QEMU has exited.
func (vm *VM) Done() <-chan struct{} { return vm.done }

// Wait waits for QEMU to exit. A clean power-off (exit status 0) returns
// nil; anything else an *Error with the logs' tails.
func (vm *VM) Wait(ctx context.Context) error {
	select {
	case <-vm.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if vm.waitErr != nil {
		return vm.failure(CodeExited, fmt.Sprintf("qemu (pid %d) exited: %v", vm.PID, vm.waitErr))
	}
	return nil
}

// Kill kills QEMU's process group and waits for it to exit. It is safe to
// call more than once and after QEMU has exited.
func (vm *VM) Kill() error {
	vm.killMu.Lock()
	defer vm.killMu.Unlock()
	select {
	case <-vm.done:
		return nil
	default:
	}
	// The group first (QEMU may have helpers), then the pid itself in
	// case it left the group.
	_ = syscall.Kill(-vm.PID, syscall.SIGKILL)
	_ = syscall.Kill(vm.PID, syscall.SIGKILL)
	select {
	case <-vm.done:
		return nil
	case <-time.After(10 * time.Second):
		return &Error{Code: CodeExited, Message: fmt.Sprintf("qemu (pid %d) did not die after SIGKILL", vm.PID)}
	}
}

// StderrTail returns the last n lines QEMU wrote to stderr.
func (vm *VM) StderrTail(n int) string { return consolelog.Tail(vm.StderrPath, n, 64<<10) }

// ConsoleTail returns the last n lines of the guest console (its rotated
// file's too, when the newest holds fewer).
func (vm *VM) ConsoleTail(n int) string { return consolelog.Tail(vm.ConsolePath, n, 64<<10) }

// tailFile returns the last n lines of a file, reading at most 64 KiB.
func tailFile(p string, n int) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	const window = 64 << 10
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(fi.Size()-window, 0)
	b, err := io.ReadAll(io.NewSectionReader(f, off, window))
	if err != nil && !errors.Is(err, io.EOF) {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
