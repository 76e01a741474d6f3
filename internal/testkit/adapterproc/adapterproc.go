// Package adapterproc starts a sandbox adapter binary as a real go-plugin
// subprocess the way the engine's plugin host does (the contract's
// handshake and versioned plugin set, gRPC with automatic mTLS), for the
// tests and benchmarks that drive an adapter directly, without an engine.
package adapterproc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterrpc"
)

// StartTimeout bounds the adapter's handshake: a loaded two-core machine
// (and an adapter built with -race) can be slow to print it.
const StartTimeout = time.Minute

// Options say how to run the adapter.
type Options struct {
	// Cmd is the adapter's command, not yet started.
	Cmd *exec.Cmd
	// Stderr receives the adapter's stderr lines that are not its log
	// (nil: discarded).
	Stderr io.Writer
	// SyncStdout receives what the adapter writes on stdout after the
	// handshake (nil: discarded).
	SyncStdout io.Writer
	// Logger is go-plugin's host-side log, the adapter's structured log
	// among it (nil: discarded).
	Logger hclog.Logger
}

// NewClient is the go-plugin client of the adapter; its process starts at
// the first Dispense. The caller kills it.
func NewClient(o Options) *plugin.Client {
	return plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  contract.Handshake(),
		VersionedPlugins: adapterrpc.VersionedPlugins(&adapterrpc.Plugin{}),
		Cmd:              o.Cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		StartTimeout:     StartTimeout,
		Stderr:           o.Stderr,
		SyncStdout:       o.SyncStdout,
		Logger:           o.Logger,
	})
}

// Dispense starts the client's process if it is not running and returns
// its sandbox adapter.
func Dispense(c *plugin.Client) (contract.Adapter, error) {
	rpc, err := c.Client()
	if err != nil {
		return nil, fmt.Errorf("start the adapter: %w", err)
	}
	raw, err := rpc.Dispense(contract.PluginName)
	if err != nil {
		return nil, fmt.Errorf("dispense the sandbox plugin: %w", err)
	}
	a, ok := raw.(contract.Adapter)
	if !ok {
		return nil, fmt.Errorf("the sandbox plugin dispensed %T, not a contract.Adapter", raw)
	}
	return a, nil
}

// Configure hands config, as JSON, to the adapter's Configure and returns
// the adapter's error as it is: tests check what it says (and it must not
// quote the configuration back, or every key would be "named").
func Configure(ctx context.Context, a contract.Adapter, config any) error {
	b, err := json.Marshal(config)
	if err != nil {
		return fmt.Errorf("marshal the adapter configuration: %w", err)
	}
	return a.Configure(ctx, b)
}
