package runner

import (
	"context"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
)

// QEMU is the QEMU back end as a runner runs it: QEMU in a child process
// that dies with the runner (parent-death signal on Linux, the lifeline
// and the runner's own kill everywhere).
type QEMU struct{}

var _ backend.Backend = QEMU{}

// Name implements backend.Backend.
func (QEMU) Name() string { return backend.QEMU }

// QEMUConfig maps a Spec to the QEMU back end's configuration.
func QEMUConfig(spec backend.Spec) qemu.Config {
	cfg := qemu.Config{
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
	}
	if spec.Hostname != "" {
		cfg.ExtraAppend = append(cfg.ExtraAppend, agentproto.ParamHostname+"="+spec.Hostname)
	}
	return cfg
}

// Run implements backend.Backend.
func (QEMU) Run(ctx context.Context, spec backend.Spec, started func(backend.Started)) error {
	vm, err := qemu.Launch(ctx, QEMUConfig(spec))
	if err != nil {
		return err
	}
	started(backend.Started{VMPID: vm.PID})
	select {
	case <-vm.Done():
		return vm.Wait(context.Background())
	case <-ctx.Done():
		_ = vm.Kill()
		return ctx.Err()
	}
}
