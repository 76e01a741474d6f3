package boot

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentclient"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/libkrun"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/runner"
)

// hwProbeTimeout bounds a probe boot on a hardware accelerator: such a
// boot answers in well under a second, and a KVM that cannot run the
// kernel (nested virtualisation without support) hangs instead of failing.
const hwProbeTimeout = 5 * time.Second

// Selection is the back end VMs boot with, and how it was chosen.
type Selection struct {
	Backend     string
	Accel       string
	QEMUBinary  string
	LibkrunPath string
	Kernel      qemu.Kernel
	Agent       string
	Initrd      string
	// Skipped says why each better option was not taken.
	Skipped []string
	// Probe holds QEMU's accelerator probe, when one ran.
	Probe       []qemu.AccelResult
	ProbeCached bool
	// Libkrun holds the library's facts, when it loaded.
	Libkrun map[string]any
}

// Facts are the selection's adapter::info facts.
func (s *Selection) Facts() map[string]any {
	m := map[string]any{
		"hypervisor":  s.Backend,
		"accel":       s.Accel,
		"kernel":      s.Kernel.Path,
		"initramfs":   s.Initrd,
		"guest_agent": s.Agent,
		"skipped":     append([]string{}, s.Skipped...),
	}
	if s.Kernel.Boot != "" {
		m["kernel_boot_image"] = s.Kernel.Boot
	}
	if s.Kernel.ModulesDir != "" {
		m["kernel_modules"] = s.Kernel.ModulesDir
	}
	if s.QEMUBinary != "" {
		m["qemu_binary"] = s.QEMUBinary
	}
	if len(s.Probe) > 0 {
		var probe []any
		for _, r := range s.Probe {
			p := map[string]any{"accel": r.Accel, "ok": r.OK}
			if r.Reason != "" {
				p["reason"] = r.Reason
			}
			if r.OK {
				p["hello_ms"] = r.TimeToHello.Milliseconds()
			}
			probe = append(probe, p)
		}
		m["accel_probe"] = probe
		m["accel_probe_cached"] = s.ProbeCached
	}
	if s.Libkrun != nil {
		m["libkrun"] = s.Libkrun
	}
	return m
}

// Select resolves the kernel, the agent and the initramfs, and picks
// the back end and accelerator: libkrun when it loads and boots a VM here,
// else QEMU with the best accelerator that really boots one, else S300
// saying what is missing. It never waits on a hung boot for longer than
// the probe timeouts.
func Select(ctx context.Context, p Host) (*Selection, error) {
	cfg := p.Config()
	arch := runtime.GOARCH
	s := &Selection{}
	k, err := findKernel(cfg, arch)
	if err != nil {
		return nil, err
	}
	s.Kernel = *k
	if arch == "amd64" {
		s.Kernel.Boot = unpackKernel(ctx, p, k.Path)
	}
	if s.Agent, err = findAgent(agentCandidates(cfg, p.Executable(), p.Home(), arch), arch); err != nil {
		return nil, err
	}
	if s.Initrd, err = buildInitramfs(ctx, k, s.Agent, cfg.CacheDir); err != nil {
		return nil, err
	}

	if cfg.Hypervisor != backend.QEMU && cfg.Accel != backend.AccelTCG {
		err := tryLibkrun(ctx, p, s)
		if err == nil {
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if cfg.Hypervisor == backend.Libkrun {
			return nil, contract.AsError(err, contract.S300)
		}
		s.Skipped = append(s.Skipped, "libkrun: "+firstLine(err.Error()))
	}
	if err := tryQEMU(ctx, p, s); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		msg := err.Error()
		if len(s.Skipped) > 0 {
			msg += "; also skipped: " + strings.Join(s.Skipped, "; ")
		}
		return nil, contract.NewError(contract.S300, "no VM back end works on this host: %s", msg)
	}
	return s, nil
}

// hostAccel is the hardware accelerator libkrun uses on this OS.
func hostAccel() string {
	if runtime.GOOS == "darwin" {
		return backend.AccelHVF
	}
	return backend.AccelKVM
}

// tryLibkrun takes libkrun when the library loads, can boot a sandbox VM,
// and a probe VM really answers through it within hwProbeTimeout.
func tryLibkrun(ctx context.Context, p Host, s *Selection) error {
	lib, err := libkrun.Open(libkrun.Options{Path: p.Config().LibkrunPath})
	if err != nil {
		return err
	}
	s.Libkrun = lib.Facts()
	s.LibkrunPath = lib.Path()
	err = lib.CheckBoot(true, false)
	_ = lib.Close()
	if err != nil {
		return err
	}
	// A kernel libkrun cannot load, or that cannot find libkrun's devices,
	// is known from its headers and configuration, without a probe that
	// would only fail or time out.
	if _, err := libkrun.DetectKernelFile(s.Kernel.BootImage(), runtime.GOARCH); err != nil {
		return err
	}
	if s.Kernel.Config != "" {
		if err := libkrun.CheckKernelConfigFile(s.Kernel.Config, runtime.GOARCH, true, false); err != nil {
			return err
		}
	}
	s.Backend, s.Accel = backend.Libkrun, hostAccel()
	if err := ProbeViaRunner(ctx, p, s, hwProbeTimeout); err != nil {
		s.Backend, s.Accel = "", ""
		return fmt.Errorf("a probe VM did not answer: %w", err)
	}
	return nil
}

// tryQEMU takes QEMU with the configured accelerator, or with auto the best
// one the probe (or its cached answer) says boots.
func tryQEMU(ctx context.Context, p Host, s *Selection) error {
	cfg := p.Config()
	qc := qemu.Config{QEMU: cfg.QEMUBinary}
	bin, err := qc.Binary()
	if err != nil {
		return err
	}
	if cfg.QEMUBinary != "" {
		if fi, err := os.Stat(bin); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return &qemu.Error{Code: qemu.CodeNotFound, Message: fmt.Sprintf("qemu_binary %s is not an executable file", bin)}
		}
	}
	s.Backend, s.QEMUBinary = backend.QEMU, bin
	if cfg.Accel != config.Auto {
		s.Accel = cfg.Accel
		return nil
	}
	cands := qemu.DefaultCandidates()
	fp := probeFingerprint(bin, s.Kernel.BootImage(), s.Initrd, cands)
	cacheDir := filepath.Join(cfg.CacheDir, "sandbox-libkrun")
	results, cached := loadProbeCache(cacheDir, fp, p.Now())
	if !cached {
		results, err = probeQEMU(ctx, p, bin, s, cands)
		if err != nil {
			return err
		}
		// A host where nothing boots is not remembered: the operator
		// is likely fixing it, and the next create should look again.
		if slices.ContainsFunc(results, func(r qemu.AccelResult) bool { return r.OK }) {
			if err := saveProbeCache(cacheDir, fp, results, p.Now()); err != nil {
				p.Log().Warn("could not cache the accelerator probe", "error", err)
			}
		}
	}
	s.Probe, s.ProbeCached = results, cached
	res := &qemu.ProbeResult{Results: results}
	for _, r := range results {
		if r.OK && res.Best == "" {
			res.Best = r.Accel
		}
	}
	best, err := res.Usable()
	if err != nil {
		return err
	}
	s.Accel = best
	for _, r := range results {
		if !r.OK {
			s.Skipped = append(s.Skipped, "qemu with "+r.Accel+": "+firstLine(r.Reason))
		}
	}
	return nil
}

// probeQEMU boots the initramfs under each candidate accelerator, in a
// locked state directory of its own so an adapter that dies mid-probe
// leaves nothing another start would not clean.
func probeQEMU(ctx context.Context, p Host, bin string, s *Selection, cands []string) ([]qemu.AccelResult, error) {
	dir, err := runner.CreateDir(p.Config().StateDir, "probe-"+randomSuffix())
	if err != nil {
		return nil, contract.NewError(contract.S300, "accelerator probe: %v", err)
	}
	defer func() { _ = dir.Remove() }()
	pr := qemu.NewProber(qemu.ProbeConfig{
		QEMU: bin, Kernel: s.Kernel.BootImage(), Initrd: s.Initrd, StateDir: dir.Path,
		Candidates: cands, HWTimeout: hwProbeTimeout, Log: p.Log().Named("probe"),
	})
	res, err := pr.Probe(ctx)
	if err != nil {
		return nil, err
	}
	return res.Results, nil
}

// ProbeViaRunner boots the bare initramfs with the selection's back end
// through a real runner and waits for the agent's hello: what every
// sandbox boot does, minus the image.
func ProbeViaRunner(ctx context.Context, p Host, s *Selection, timeout time.Duration) error {
	dir, err := runner.CreateDir(p.Config().StateDir, "probe-"+randomSuffix())
	if err != nil {
		return err
	}
	defer func() { _ = dir.Remove() }()
	spec := backend.Spec{
		ID: filepath.Base(dir.Path), CPUs: 1, MemoryMiB: 256,
		Kernel: s.Kernel.BootImage(), KernelConfig: s.Kernel.Config, Initrd: s.Initrd, StateDir: dir.Path,
		Accel: s.Accel, QEMUBinary: s.QEMUBinary, LibkrunPath: s.LibkrunPath,
		ConsoleLogMaxBytes: p.Current().ConsoleLogMaxBytes,
	}
	proc, err := runner.Spawn(ctx, runner.SpawnOptions{
		Executable: p.Executable(), Dir: dir,
		Config: runner.Config{Version: runner.ConfigVersion, Backend: s.Backend, Spec: spec},
	})
	if err != nil {
		return err
	}
	defer func() {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = proc.Stop(kctx, 0)
	}()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := DialAgent(cctx, proc, spec.SocketPath(), p.Log())
	if err != nil {
		return fmt.Errorf("%v%s", err, VMTails(dir.Path, 3))
	}
	_ = c.Close()
	return nil
}

// deadlinePassed reports whether ctx has a deadline that is now past.
func deadlinePassed(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// errRunnerExited ends a dial whose VM is gone.
var errRunnerExited = errors.New("the VM runner exited")

// How long one connection waits for the agent's hello before it hangs up
// and dials again: the first window covers a TCG boot on a busy host, and
// each retry doubles it. A fresh connection recovers the rare boot where
// the guest never learns that the host end is open (seen once in hundreds
// of TCG boots on an overloaded host: the agent was up and the hello never
// came); reconnecting re-announces the host end to the guest.
const (
	firstHelloWindow = 10 * time.Second
	maxHelloWindow   = 40 * time.Second
)

// vmProcess is what DialAgent watches: the runner.
type vmProcess interface {
	Done() <-chan struct{}
	ExitErr() error
}

// DialAgent connects to the VM's agent and waits for its hello until ctx
// ends, giving up as soon as the runner exits.
func DialAgent(ctx context.Context, proc vmProcess, socket string, log hclog.Logger) (*agentclient.Client, error) {
	return dialAgentWindows(ctx, proc, socket, log, firstHelloWindow, maxHelloWindow)
}

func dialAgentWindows(ctx context.Context, proc vmProcess, socket string, log hclog.Logger, first, most time.Duration) (*agentclient.Client, error) {
	dctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-proc.Done():
			cancel(errRunnerExited)
		case <-dctx.Done():
		}
	}()
	window := first
	for {
		actx, acancel := context.WithTimeout(dctx, window)
		c, err := agentclient.Dial(actx, socket, agentclient.Options{Log: log})
		// A dial can fail with its own i/o timeout a moment before the
		// context's timer marks it done: the deadline decides.
		timedOut := actx.Err() != nil || deadlinePassed(actx)
		acancel()
		if err == nil {
			return c, nil
		}
		switch {
		case errors.Is(context.Cause(dctx), errRunnerExited):
			return nil, fmt.Errorf("the VM exited before its guest agent answered (runner: %v)", proc.ExitErr())
		case errors.Is(ctx.Err(), context.DeadlineExceeded) || deadlinePassed(ctx):
			return nil, errors.New("no hello from the guest agent in time")
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case !timedOut:
			return nil, err
		}
		log.Debug("no hello from the guest agent yet; connecting again", "waited", window)
		window = min(2*window, most)
	}
}

func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// firstLine keeps reasons in info and logs to one line; errors such as
// libkrun's list every place they looked below it.
func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return strings.TrimSpace(s[:i])
	}
	return s
}
