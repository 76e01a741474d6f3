// Command sandbox-hostdir is the hostdir example adapter: sandboxes that are
// host directories, with NO isolation. For adapter development and tests
// only; see the hostdir package documentation.
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
		Name:    hostdir.Name,
		Version: hostdir.Version,
		New: func(_ context.Context, log hclog.Logger) (contract.Adapter, error) {
			return hostdir.NewAdapter(log), nil
		},
		// --help's configuration examples name the presets.
		Images: func() []string {
			var names []string
			for _, img := range hostdir.NewProvider(hclog.NewNullLogger()).Presets() {
				names = append(names, img.Name)
			}
			return names
		},
	})
}
