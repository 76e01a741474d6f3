//go:build linux || darwin

package libkrun

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// findPasst resolves the passt binary.
func findPasst(bin string) (string, error) {
	if bin == "" {
		bin = "passt"
	}
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", &Error{Code: CodePasst, Message: fmt.Sprintf("network is on but %s was not found (%v): install passt (Debian/Ubuntu: apt-get install passt; Fedora: dnf install passt; macOS: not packaged, turn network off or use hypervisor: qemu)", bin, err)}
	}
	return p, nil
}

// PasstArgs are passt's arguments when it serves the VM over an inherited,
// already connected socket on fd 3. passt exits when the VM end closes
// (--one-off), that is when the runner process ends, so it never outlives
// its VM. The addresses match QEMU's user network (GuestAddress,
// GuestGateway), and traffic to the gateway reaches the host, as with QEMU.
func PasstArgs() []string {
	addr, bits, _ := strings.Cut(GuestAddress, "/")
	return []string{
		"--foreground", "--one-off", "--quiet", "--stderr",
		"--fd", "3",
		"--address", addr, "--netmask", bits, "--gateway", GuestGateway,
	}
}

// passtProc is a running passt.
type passtProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	once sync.Once
}

// startPasst starts passt on fd, which it takes over: the child gets a
// copy as its fd 3 and this process's copy is closed. passt's output goes
// to this process's stderr, next to libkrun's log.
func startPasst(bin string, fd int, log hclog.Logger) (*passtProc, error) {
	f := os.NewFile(uintptr(fd), "passt-socket")
	defer f.Close()
	cmd := exec.Command(bin, PasstArgs()...)
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	// Its own process group: a signal for the runner's group (a
	// terminal's ^C) does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, &Error{Code: CodePasst, Message: fmt.Sprintf("start %s: %v", bin, err)}
	}
	p := &passtProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	log.Debug("passt started", "pid", cmd.Process.Pid, "args", cmd.Args)
	return p, nil
}

// exited reports an error if passt has already stopped (bad options, no
// usable host network): better said now than as a dead NIC in the guest.
func (p *passtProc) exited() error {
	select {
	case <-p.done:
		return &Error{Code: CodePasst, Message: fmt.Sprintf("passt exited during setup: %v (its messages are above on stderr)", p.err)}
	default:
		return nil
	}
}

// kill stops passt and waits for it.
func (p *passtProc) kill() {
	p.once.Do(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = p.cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
	})
}
