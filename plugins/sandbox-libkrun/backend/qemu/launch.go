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
// pipe to end after QEMU exited.
const consoleDrain = 5 * time.Second

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
	console *consolelog.Log
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
	consoleIn, consoleOut, err := os.Pipe()
	if err != nil {
		return nil, &Error{Code: CodeStartFailed, Message: fmt.Sprintf("console pipe: %v", err)}
	}
	defer consoleOut.Close() // QEMU holds its own copy once started
	started := false
	defer func() {
		if !started {
			_ = consoleIn.Close()
		}
	}()
	cfg.consoleOut = consoleOut
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
	vm := &VM{
		SocketPath:  cfg.SocketPath(),
		StderrPath:  filepath.Join(cfg.StateDir, StderrName),
		ConsolePath: filepath.Join(cfg.StateDir, ConsoleName),
		Args:        append([]string{bin}, args...),
		done:        make(chan struct{}),
	}
	// A socket left by an earlier VM in this dir would look ready.
	_ = os.Remove(vm.SocketPath)
	stderr, err := os.OpenFile(vm.StderrPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, &Error{Code: CodeStartFailed, Message: fmt.Sprintf("stderr file: %v", err)}
	}
	defer stderr.Close() // the child holds its own descriptor
	console, err := consolelog.Create(vm.ConsolePath, cfg.ConsoleMaxBytes)
	if err != nil {
		return nil, &Error{Code: CodeStartFailed, Message: err.Error()}
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdin = nil
	cmd.Stdout = stderr
	cmd.Stderr = stderr
	cmd.ExtraFiles = cfg.extraFiles()
	// A process group of its own: signals meant for the caller's group
	// do not reach it, and Kill can take down anything it spawned.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if cfg.DieWithParent {
		setDieWithParent(cmd.SysProcAttr)
	}
	if err := cmd.Start(); err != nil {
		_ = console.Close()
		return nil, &Error{Code: CodeStartFailed, Message: fmt.Sprintf("start %s: %v", bin, err)}
	}
	started = true
	_ = consoleOut.Close() // only QEMU writes the console: its exit is the pipe's EOF
	vm.cmd, vm.PID = cmd, cmd.Process.Pid
	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		_ = consolelog.Pump(consoleIn, console)
	}()
	go func() {
		vm.waitErr = cmd.Wait()
		// What QEMU wrote before it exited is in the log before Done;
		// a descendant that kept the pipe open does not hold that up.
		select {
		case <-pumped:
		case <-time.After(consoleDrain):
			_ = consoleIn.Close()
			<-pumped
		}
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
func (vm *VM) StderrTail(n int) string { return tailFile(vm.StderrPath, n) }

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
