package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentclient"
)

// Connect dials the VM's agent and waits for its hello. It fails early,
// with QEMU's stderr and console tails, if QEMU exits first.
func (vm *VM) Connect(ctx context.Context, opts agentclient.Options) (*agentclient.Client, error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-vm.done:
			cancel()
		case <-cctx.Done():
		}
	}()
	c, err := agentclient.Dial(cctx, vm.SocketPath, opts)
	if err == nil {
		return c, nil
	}
	// A connection that QEMU drops is usually QEMU exiting: give it a
	// moment, so the error carries its stderr instead of a bare reset.
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-vm.done:
		return nil, vm.failure(CodeExited, fmt.Sprintf("qemu (pid %d) exited before the guest agent answered: %v", vm.PID, vm.waitErr))
	case <-t.C:
	}
	if ctx.Err() != nil {
		return nil, vm.failure(CodeStartFailed, fmt.Sprintf("no hello from the guest agent: %v", ctx.Err()))
	}
	return nil, err
}

// ProbeConfig says how to probe accelerators.
type ProbeConfig struct {
	QEMU string
	Arch string
	// Kernel and Initrd boot the probe VM; the initramfs must hold the
	// guest agent. No root disk is attached.
	Kernel, Initrd string
	// StateDir is where probe VMs keep their sockets and logs.
	StateDir string
	// Candidates in order of preference; default kvm then tcg on Linux,
	// hvf then tcg on macOS.
	Candidates []string
	// HWTimeout bounds a kvm or hvf probe. A hardware-accelerated boot
	// answers in well under a second; a KVM that cannot run the kernel
	// (nested virtualisation without support) hangs, and this is what
	// detects it. Default 5 s.
	HWTimeout time.Duration
	// TCGTimeout bounds a tcg probe (about 2 s on an idle host). Default
	// 60 s.
	TCGTimeout time.Duration
	Log        hclog.Logger
}

// AccelResult is the outcome of probing one accelerator.
type AccelResult struct {
	Accel       string
	OK          bool
	Reason      string        // why it is unusable
	TimeToHello time.Duration // from QEMU start to the agent's hello
}

// ProbeResult lists what was probed; Best is the first usable candidate.
type ProbeResult struct {
	Results []AccelResult
	Best    string
}

// Prober probes once and remembers the answer; keep one per process.
type Prober struct {
	cfg ProbeConfig
	mu  sync.Mutex
	res *ProbeResult
}

// NewProber returns a Prober.
func NewProber(cfg ProbeConfig) *Prober { return &Prober{cfg: cfg} }

// DefaultCandidates lists the accelerators worth trying on this host OS.
func DefaultCandidates() []string {
	if runtime.GOOS == "darwin" {
		return []string{AccelHVF, AccelTCG}
	}
	return []string{AccelKVM, AccelTCG}
}

// Probe boots the agent initramfs with each candidate accelerator and
// reports which ones answer. The first complete result is cached; a probe
// cut short by ctx is not.
func (p *Prober) Probe(ctx context.Context) (*ProbeResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.res != nil {
		return p.res, nil
	}
	cands := p.cfg.Candidates
	if cands == nil {
		cands = DefaultCandidates()
	}
	res := &ProbeResult{}
	for _, a := range cands {
		r := p.probeOne(ctx, a)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		p.log().Info("accelerator probed", "accel", a, "ok", r.OK, "reason", r.Reason, "hello_ms", r.TimeToHello.Milliseconds())
		res.Results = append(res.Results, r)
		if r.OK && res.Best == "" {
			res.Best = a
		}
	}
	p.res = res
	return res, nil
}

// Usable returns the best accelerator, or an error that says what each
// candidate lacked.
func (r *ProbeResult) Usable() (string, error) {
	if r.Best != "" {
		return r.Best, nil
	}
	var why []string
	for _, x := range r.Results {
		why = append(why, x.Accel+": "+x.Reason)
	}
	return "", &Error{Code: CodeNoAccel, Message: "no accelerator boots a VM on this host (" + strings.Join(why, "; ") + ")"}
}

func (p *Prober) log() hclog.Logger {
	if p.cfg.Log == nil {
		return hclog.NewNullLogger()
	}
	return p.cfg.Log
}

func (p *Prober) probeOne(ctx context.Context, accel string) AccelResult {
	r := AccelResult{Accel: accel}
	if reason := accelAvailable(accel); reason != "" {
		r.Reason = reason
		return r
	}
	timeout := p.cfg.HWTimeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	if accel == AccelTCG {
		timeout = p.cfg.TCGTimeout
		if timeout == 0 {
			timeout = 60 * time.Second
		}
	}
	if err := os.MkdirAll(p.cfg.StateDir, 0o700); err != nil {
		r.Reason = err.Error()
		return r
	}
	dir, err := os.MkdirTemp(p.cfg.StateDir, "probe-"+accel+"-")
	if err != nil {
		r.Reason = err.Error()
		return r
	}
	defer os.RemoveAll(dir)

	start := time.Now()
	vm, err := Launch(ctx, Config{QEMU: p.cfg.QEMU, Arch: p.cfg.Arch, Accel: accel, MemoryMiB: 256,
		Kernel: p.cfg.Kernel, Initrd: p.cfg.Initrd, StateDir: dir, DieWithParent: true})
	if err != nil {
		r.Reason = oneLine(err)
		return r
	}
	defer vm.Kill()
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := vm.Connect(hctx, agentclient.Options{})
	if err != nil {
		var qe *Error
		if errors.As(err, &qe) && qe.Code == CodeExited {
			r.Reason = "qemu exited: " + lastLine(qe.StderrTail)
		} else {
			r.Reason = fmt.Sprintf("no hello from the guest within %s (a KVM that cannot run this kernel, such as nested virtualisation without support, hangs here)", timeout)
			if accel == AccelTCG {
				r.Reason = fmt.Sprintf("no hello from the guest within %s: %s", timeout, lastLine(vm.ConsoleTail(5)))
			}
		}
		return r
	}
	r.TimeToHello = time.Since(start)
	r.OK = true
	sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
	defer scancel()
	_ = c.Shutdown(sctx)
	_ = c.Close()
	return r
}

// accelAvailable says why an accelerator cannot work before trying it.
func accelAvailable(accel string) string {
	switch accel {
	case AccelKVM:
		if runtime.GOOS != "linux" {
			return "kvm exists only on Linux"
		}
		f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
		if err != nil {
			return fmt.Sprintf("cannot open /dev/kvm: %v", err)
		}
		_ = f.Close()
	case AccelHVF:
		if runtime.GOOS != "darwin" || runtime.GOARCH != "arm64" {
			return "hvf is used only on Apple silicon"
		}
	case AccelTCG:
	default:
		return fmt.Sprintf("unknown accelerator %q", accel)
	}
	return ""
}

func oneLine(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
