// Command sandbox-mine is the adapter binary the engine starts.
package main

import (
	"context"

	"example.com/sandbox-mine"
	"github.com/hashicorp/go-hclog"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk"
)

func main() {
	// First thing: Serve guards stdout (only go-plugin's handshake goes
	// there) and builds the adapter with New.
	sdk.Serve(sdk.ServeConfig{
		Name:    mine.Name,
		Version: mine.Version,
		New: func(_ context.Context, log hclog.Logger) (contract.Adapter, error) {
			return mine.NewAdapter(log), nil
		},
	})
}
