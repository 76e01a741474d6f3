package qemu

import (
	"context"
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/usernet"
)

// Backend is the QEMU back end as a runner runs it (backend.Backend): QEMU
// in a child process that dies with the runner (parent-death signal on
// Linux, the lifeline and the runner's own kill everywhere), its NIC served
// by this process.
type Backend struct {
	// Log receives the network's messages.
	Log hclog.Logger
}

var _ backend.Backend = Backend{}

// Name implements backend.Backend.
func (Backend) Name() string { return backend.QEMU }

// ConfigFor maps a back-end Spec to QEMU's configuration.
// WorkerTBSizeMiB is the TCG translation buffer of a worker VM (a VM with
// a data disk); sandboxes keep Config's default of 64 MiB.
const WorkerTBSizeMiB = 512

func ConfigFor(spec backend.Spec) Config {
	cfg := Config{
		QEMU:          spec.QEMUBinary,
		Accel:         spec.Accel,
		MemoryMiB:     spec.MemoryMiB,
		CPUs:          spec.CPUs,
		Kernel:        spec.Kernel,
		Initrd:        spec.Initrd,
		RootDisk:      spec.RootDisk,
		RootFSType:    spec.RootFSType,
		UpperDisk:     spec.DataDisk,
		Network:       spec.Network,
		StateDir:      spec.StateDir,
		Debug:         spec.Debug,
		DieWithParent: true,

		ConsoleMaxBytes: spec.ConsoleLogMaxBytes,
	}
	if spec.DataDisk != "" {
		// A worker VM (the only kind with a data disk) runs a language
		// runtime for its whole life: under TCG, Node's start alone
		// filled the 64 MiB translation buffer 28 times, each flush
		// retranslating the guest's code. 512 MiB took the start from
		// 24–28 s to 18–21 s (BENCHMARKS.md, C2). Address space is
		// reserved, memory is used as code is translated.
		cfg.TBSizeMiB = WorkerTBSizeMiB
	}
	if spec.Hostname != "" {
		cfg.ExtraAppend = append(cfg.ExtraAppend, agentproto.ParamHostname+"="+spec.Hostname)
	}
	// The control socket is always served: a sandbox is paused
	// through it (SaveTemplate of the running VM, then Quit).
	cfg.Control = true
	if t := spec.Template; t != nil {
		cfg.MemoryFile = t.MemoryFile
		cfg.MemoryShared = t.StateFile == ""
	}
	return cfg
}

// Run implements backend.Backend. With network, the VM's NIC is a
// socketpair: QEMU gets one end, and this process serves the other with
// its user-mode network, which ends once QEMU has.
func (q Backend) Run(ctx context.Context, spec backend.Spec, started func(backend.Started)) error {
	log := q.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	cfg := ConfigFor(spec)
	if spec.Restores() {
		f, err := os.Open(spec.Template.StateFile)
		if err != nil {
			return fmt.Errorf("restore from a template: %w", err)
		}
		defer f.Close() // QEMU reads its own copy
		cfg.Incoming = f
	}
	waitNet := func() {}
	if spec.Network {
		runnerEnd, vmEnd, err := usernet.Pair()
		if err != nil {
			return err
		}
		defer vmEnd.Close() // QEMU has its own copy once started
		if waitNet, err = backend.ServeNetwork(ctx, runnerEnd, spec, log); err != nil {
			return err
		}
		cfg.NetSocket = vmEnd
	}
	vm, err := Launch(ctx, cfg)
	if cfg.NetSocket != nil {
		// Only QEMU keeps the VM's end: its exit is the network's EOF.
		_ = cfg.NetSocket.Close()
	}
	if err != nil {
		waitNet()
		return err
	}
	defer waitNet()
	started(backend.Started{VMPID: vm.PID})
	select {
	case <-vm.Done():
		return vm.Wait(context.Background())
	case <-ctx.Done():
		_ = vm.Kill()
		return ctx.Err()
	}
}
