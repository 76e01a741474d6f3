// Command sandbox-infomajor is a test-only adapter served with the SDK
// (so the go-plugin handshake succeeds) whose adapter::info reports
// contract 2.0: the engine must refuse it on that report alone.
package main

import (
	"context"

	"github.com/hashicorp/go-hclog"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk"
	"github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir"
)

func main() {
	sdk.Serve(sdk.ServeConfig{
		Name:    "sandbox-infomajor",
		Version: "2.0.0-test",
		New: func(_ context.Context, log hclog.Logger) (contract.Adapter, error) {
			return &adapter{Adapter: hostdir.NewAdapter(log)}, nil
		},
	})
}

type adapter struct{ contract.Adapter }

func (a *adapter) Info(ctx context.Context) (*contract.AdapterInfo, error) {
	info, err := a.Adapter.Info(ctx)
	if err != nil {
		return nil, err
	}
	info.Contract = contract.ContractVersion{Major: 2, Minor: 0}
	return info, nil
}

// Shutdown lets the hostdir manager underneath clean up.
func (a *adapter) Shutdown(ctx context.Context) error {
	if s, ok := a.Adapter.(sdk.Shutdowner); ok {
		return s.Shutdown(ctx)
	}
	return nil
}
