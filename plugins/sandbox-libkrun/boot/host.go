// Package boot is how sandbox-libkrun brings a VM up: the back end chosen
// once per process (libkrun when it loads and boots a probe VM, else QEMU
// with the best accelerator that boots), and each VM booted through a
// pipeline of named steps (DefaultBootSteps): resolve the image, build the
// initramfs, find a snapshot template, lock a state directory, spawn the
// VM's runner process, wait for the guest agent's hello, configure the
// guest. Every step undoes its work when a later one fails. Snapshot
// templates and the warm pool are here too: they are ways to boot faster.
//
// The adapter that runs the boots (sandboxes, worker VMs) is a Host; boot
// imports neither the adapter nor the worker VMs.
package boot

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/config"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images"
)

// Host is what the boot steps, the templates and the warm pool need from
// the adapter they boot for.
type Host interface {
	Log() hclog.Logger
	// Executable is the adapter binary runners are started from.
	Executable() string
	// Home is the user's home directory (the agent's default place).
	Home() string
	Now() time.Time
	// Config is the configuration as started (the keys that need a
	// restart); Current is as last reloaded.
	Config() *config.Config
	Current() *config.Config
	Images() *images.Store
	// Steps is the pipeline sandboxes boot through.
	Steps() BootSteps
	// Background is what outlives a call (a template's recording) and
	// ends with the adapter.
	Background() context.Context
	// Selected waits for the back end chosen for this process.
	Selected(ctx context.Context) (*Selection, error)
	// Templates is the snapshot template store.
	Templates() *Templates
	// StopBooted stops a VM that was booted for nobody (a warm pool VM
	// no longer wanted), as a sandbox's stop would.
	StopBooted(ctx context.Context, b *Boot) error
}
