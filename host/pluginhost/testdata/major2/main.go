// Command sandbox-major2 is a test-only adapter that serves the sandbox
// plugin under contract major 2 only, as a future adapter would: the
// go-plugin handshake with a contract-1 engine finds no common version.
// It uses go-plugin directly because the SDK always serves this
// repository's major.
package main

import (
	"context"

	"github.com/hashicorp/go-plugin"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterrpc"
)

func main() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: contract.Handshake(),
		VersionedPlugins: map[int]plugin.PluginSet{
			2: {contract.PluginName: &adapterrpc.Plugin{Impl: info2{}}},
		},
		GRPCServer: plugin.DefaultGRPCServer,
	})
}

// info2 answers adapter::info only; a contract-2 engine would call more.
type info2 struct{ contract.Adapter }

func (info2) Info(context.Context) (*contract.AdapterInfo, error) {
	return &contract.AdapterInfo{Adapter: "sandbox-major2", AdapterVersion: "2.0.0", Contract: contract.ContractVersion{Major: 2}}, nil
}
