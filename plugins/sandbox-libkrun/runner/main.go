package runner

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
)

// Exit statuses of a runner.
const (
	// ExitOK: the guest powered off, or the VM was killed because the
	// adapter released it, let go of it with no adoption grace, or did
	// not come back within the grace, or on SIGTERM.
	ExitOK = 0
	// ExitVMFailed: the VM could not start or ended with an error; the
	// reason is in runner.log, qemu.stderr and console.log.
	ExitVMFailed = 1
	// ExitUsage: not started by an adapter (bad arguments, no lifeline,
	// no configuration).
	ExitUsage = 2
)

// exitGrace is how long a runner whose adapter let go waits for its back
// end to kill the VM before it exits anyway (a VM inside this process dies
// with it either way).
const exitGrace = 5 * time.Second

// Main is the runner process: args are the arguments after the binary's
// name, [Subcommand, state dir]; backends are the back ends the binary
// carries. It runs the VM its runner.json describes until the VM ends, an
// adapter releases it, or no adapter has held it for the adoption grace
// (at once without one), and returns the exit status.
func Main(args []string, backends []backend.Backend) int {
	if len(args) != 2 || args[0] != Subcommand || !filepath.IsAbs(args[1]) {
		fmt.Fprintf(os.Stderr, "%s is started by the sandbox-libkrun adapter, one per VM; it is not meant to be run by hand\n", Subcommand)
		return ExitUsage
	}
	dir := args[1]
	lifeline, err := takeLifeline()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v; a runner must be started by its adapter\n", Subcommand, err)
		return ExitUsage
	}
	raw, err := os.ReadFile(filepath.Join(dir, ConfigName))
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", Subcommand, err)
		return ExitUsage
	}
	cfg, err := DecodeConfig(raw)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", Subcommand, err)
		return ExitUsage
	}
	if filepath.Clean(cfg.Spec.StateDir) != filepath.Clean(dir) {
		fmt.Fprintf(os.Stderr, "%s: runner.json names state dir %s, not %s\n", Subcommand, cfg.Spec.StateDir, dir)
		return ExitUsage
	}
	log := hclog.New(&hclog.LoggerOptions{
		Name:   "vm-runner",
		Output: os.Stderr,
		Level:  hclog.LevelFromString(cfg.LogLevel),
	}).With("sandbox_id", cfg.Spec.ID)
	if log.GetLevel() == hclog.NoLevel {
		log.SetLevel(hclog.Info)
	}
	var be backend.Backend
	for _, b := range backends {
		if b.Name() == cfg.Backend {
			be = b
		}
	}
	if be == nil {
		log.Error("this binary has no such back end", "backend", cfg.Backend)
		return ExitVMFailed
	}
	if err := WritePID(filepath.Join(dir, RunnerPIDName), os.Getpid()); err != nil {
		log.Error("write runner.pid", "error", err)
		return ExitVMFailed
	}
	return run(log, be, cfg, filepath.Clean(dir), lifeline)
}

func run(log hclog.Logger, be backend.Backend, cfg *Config, dir string, lifeline *os.File) int {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)

	var key []byte
	var ln *net.UnixListener
	if cfg.AdoptGraceMS > 0 {
		// Adoption was asked for: a runner that cannot offer it fails
		// now rather than lose its VM at the adapter's next restart.
		var err error
		if key, err = readAdoptKey(filepath.Join(dir, AdoptKeyName)); err != nil {
			log.Error("cannot offer adoption", "error", err)
			return ExitVMFailed
		}
		if ln, err = listenAdopt(filepath.Join(dir, AdoptSocketName)); err != nil {
			log.Error("cannot offer adoption", "error", err)
			return ExitVMFailed
		}
		// Once the VM is being stopped nobody may adopt it; closing
		// the listener also removes the socket, so a later Adopt finds
		// no runner.
		context.AfterFunc(ctx, func() { _ = ln.Close() })
		defer ln.Close()
	}
	k := newKeeper(log, dir, key, cfg.AdoptGrace(), cancel)
	if ln != nil {
		go k.serve(ln)
	}
	go k.watch(lifeline, "lifeline")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			k.end(fmt.Errorf("signal %v", s))
		case <-ctx.Done():
		}
	}()
	// Whatever the back end does, a runner whose adapter has gone must
	// not stay: past the grace it exits, which takes an in-process VM
	// with it and a QEMU through its parent-death signal.
	go func() {
		<-ctx.Done()
		time.Sleep(exitGrace)
		log.Error("the back end did not stop the VM in time; exiting", "cause", context.Cause(ctx))
		os.Exit(ExitVMFailed)
	}()

	log.Info("starting VM", "backend", be.Name(), "accel", cfg.Spec.Accel, "cpus", cfg.Spec.CPUs, "memory_mib", cfg.Spec.MemoryMiB)
	err := be.Run(ctx, cfg.Spec, func(s backend.Started) {
		k.vmPID.Store(int64(s.VMPID))
		if werr := WritePID(filepath.Join(cfg.Spec.StateDir, VMPIDName), s.VMPID); werr != nil {
			log.Warn("write vm.pid", "error", werr)
		}
		log.Info("VM started", "vm_pid", s.VMPID)
	})
	switch {
	case ctx.Err() != nil:
		log.Info("VM stopped", "cause", context.Cause(ctx))
		return ExitOK
	case err != nil:
		log.Error("VM failed", "error", err)
		return ExitVMFailed
	}
	log.Info("the guest powered off")
	return ExitOK
}

// takeLifeline adopts the inherited lifeline descriptor and keeps it from
// the VM process (a QEMU holding it would not matter for EOF, but nothing
// of the adapter's belongs in a VM process).
func takeLifeline() (*os.File, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(lifelineFD, &st); err != nil {
		return nil, fmt.Errorf("no lifeline on fd %d: %w", lifelineFD, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		return nil, fmt.Errorf("fd %d is not a lifeline pipe", lifelineFD)
	}
	syscall.CloseOnExec(lifelineFD)
	return os.NewFile(lifelineFD, "lifeline"), nil
}
