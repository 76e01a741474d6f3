// Command sandbox-libkrun is the iii sandbox adapter that runs every
// sandbox as a microVM: libkrun where it loads and the host can
// virtualize, else QEMU with the best accelerator that boots (KVM, HVF or
// TCG). The engine starts it as a go-plugin subprocess (sdk.Serve).
//
// On another machine it runs as a worker of a remote engine instead:
//
//	sandbox-libkrun serve --engine wss://ENGINE:49134 --credential-file F --host-name NAME [--config-file F]
//
// sdk.Serve reads those flags (docs/remote-adapters.md).
//
// The same binary is also each VM's runner: the adapter re-executes itself
// with the hidden first argument __vm-run, one process per VM, so a VM
// that takes its process over (libkrun) or crashes touches nothing else.
// docs/sandbox-libkrun.md describes configuration and operation.
package main

import (
	"context"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/adapter"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/libkrun"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/catalog"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/runner"
	"github.com/iii-sandbox/iii/plugins/sdk"
)

func main() {
	// A runner must be dispatched before sdk.Serve, which would take it
	// for a plugin started by hand.
	if len(os.Args) > 1 && os.Args[1] == runner.Subcommand {
		log := hclog.New(&hclog.LoggerOptions{Name: "vm-runner", Output: os.Stderr})
		os.Exit(runner.Main(os.Args[1:], []backend.Backend{qemu.Backend{Log: log}, libkrun.Backend{Log: log}}))
	}
	// Everything else, `serve --engine …` included, is sdk.Serve's: the
	// same path for the go-plugin child and the remote adapter.
	sdk.Serve(sdk.ServeConfig{
		Name:    adapter.Name,
		Version: adapter.Version,
		New: func(_ context.Context, log hclog.Logger) (contract.Adapter, error) {
			return adapter.New(adapter.Options{Log: log})
		},
		// --help's configuration examples name the presets.
		Images: func() []string {
			var names []string
			for _, e := range catalog.Presets() {
				names = append(names, e.Name)
			}
			return names
		},
	})
}
