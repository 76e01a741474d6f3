package libkrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/consolelog"
)

// Backend is the libkrun back end as a runner runs it (backend.Backend): the runner process
// becomes the VM (krun_start_enter never returns), relays the guest
// agent's console port, a socketpair libkrun holds the other end of, to
// the unix socket the adapter dials, as QEMU serves it for the QEMU back
// end, and serves the NIC with its user-mode network.
type Backend struct {
	// Log receives libkrun's and the relay's messages.
	Log hclog.Logger
}

var _ backend.Backend = Backend{}

// Name implements backend.Backend.
func (Backend) Name() string { return backend.Libkrun }

// SpecFor maps a back-end Spec to libkrun's, minus the channel callback
// Run supplies.
func SpecFor(spec backend.Spec) (Spec, error) {
	if spec.Template != nil {
		// libkrun has no API to save or restore a VM.
		return Spec{}, errors.New("libkrun cannot record or restore snapshot templates")
	}
	arch := runtime.GOARCH
	format, err := DetectKernelFile(spec.Kernel, arch)
	if err != nil {
		return Spec{}, err
	}
	cmdline, err := BuildCmdline(CmdlineOptions{
		Arch:       arch,
		RootDisk:   spec.RootDisk != "",
		DataDisk:   spec.DataDisk != "",
		RootFSType: spec.RootFSType,
		Hostname:   spec.Hostname,
		Debug:      spec.Debug,
	})
	if err != nil {
		return Spec{}, err
	}
	return Spec{
		VCPUs:        spec.CPUs,
		MemoryMiB:    spec.MemoryMiB,
		Kernel:       spec.Kernel,
		KernelFormat: format,
		KernelConfig: spec.KernelConfig,
		Initramfs:    spec.Initrd,
		Cmdline:      cmdline,
		RootDisk:     spec.RootDisk,
		DataDisk:     spec.DataDisk,
		Env:          []string{},
		Network:      spec.Network,
		ConsoleLog:   spec.StateDir + "/" + backend.ConsoleName,
		Verbosity:    "warn",
	}, nil
}

// Run implements backend.Backend. It returns only when the VM could not
// start. Once it has started, the VM is this process: when ctx ends (the
// adapter let go) Run exits the process, which ends the VM with it.
func (l Backend) Run(ctx context.Context, spec backend.Spec, started func(backend.Started)) error {
	log := l.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	ks, err := SpecFor(spec)
	if err != nil {
		return err
	}
	lib, err := Open(Options{Path: spec.LibkrunPath})
	if err != nil {
		return err
	}
	_ = os.Remove(spec.SocketPath())
	ln, err := net.Listen("unix", spec.SocketPath())
	if err != nil {
		return fmt.Errorf("listen on the agent socket: %w", err)
	}
	defer ln.Close()
	ks.Log = log
	if ks.ConsoleLog != "" {
		// The console goes through a pipe into a capped log, as QEMU's
		// does: libkrun would write its file without bound.
		clog, err := consolelog.Create(ks.ConsoleLog, spec.ConsoleLogMaxBytes)
		if err != nil {
			return err
		}
		r, w, err := os.Pipe()
		if err != nil {
			_ = clog.Close()
			return fmt.Errorf("console pipe: %w", err)
		}
		// The VM is this process: the pipe ends with it, or when Boot
		// returns because the VM did not start.
		defer w.Close()
		go func() { _ = consolelog.Pump(r, clog) }()
		ks.ConsoleOut, ks.ConsoleLog = w, ""
	}
	// The NIC's frames are served here, as for QEMU. The network needs no
	// waiting for: it ends with this process, which is the VM.
	ks.OnNetwork = func(host *os.File) error {
		_, err := backend.ServeNetwork(ctx, host, spec, log)
		return err
	}
	ks.OnChannel = func(host *os.File) error {
		conn, err := net.FileConn(host)
		_ = host.Close() // FileConn holds its own descriptor
		if err != nil {
			return fmt.Errorf("agent channel: %w", err)
		}
		go relay(ln, conn, log)
		// A VM inside this process cannot be killed apart from it.
		go func() {
			<-ctx.Done()
			log.Info("the adapter let go of the VM; exiting", "cause", context.Cause(ctx))
			os.Exit(0) // the runner's ExitOK: the VM was let go of
		}()
		started(backend.Started{VMPID: os.Getpid()})
		return nil
	}
	return lib.Boot(ctx, ks)
}

// relay joins each client of ln, one at a time, to the guest's channel.
// The channel stays open across clients, so the guest never sees a client
// leave; the adapter keeps one connection for a VM's life, and the agent's
// magic lets a later client skip what an earlier one left half-sent.
func relay(ln net.Listener, guest net.Conn, log hclog.Logger) {
	defer guest.Close()
	for {
		c, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				log.Warn("agent socket accept failed", "error", err)
			}
			return
		}
		done := make(chan error, 2)
		go func() { _, err := io.Copy(c, guest); done <- err }()
		go func() { _, err := io.Copy(guest, c); done <- err }()
		first := <-done
		_ = c.Close()
		// Unblock whichever copy still reads from the guest, then keep
		// the channel for the next client.
		if dl, ok := guest.(interface{ SetReadDeadline(time.Time) error }); ok {
			_ = dl.SetReadDeadline(time.Now())
		}
		<-done
		if dl, ok := guest.(interface{ SetReadDeadline(time.Time) error }); ok {
			_ = dl.SetReadDeadline(time.Time{})
		}
		if first != nil && !errors.Is(first, net.ErrClosed) && !errors.Is(first, os.ErrDeadlineExceeded) {
			log.Debug("agent client relay ended", "error", first)
		}
	}
}
