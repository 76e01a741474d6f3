package hostdir_test

import (
	"context"
	"testing"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir"
	"github.com/iii-sandbox/iii/plugins/sdk/sdktest"
)

// TestConformance builds sandbox-hostdir and runs the conformance suite
// against it as a real go-plugin subprocess, through the contract's gRPC
// client and decoders.
func TestConformance(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the adapter and runs the full conformance suite")
	}
	bin := sdktest.BuildPlugin(t, "./cmd/sandbox-hostdir")
	sdktest.Run(t, sdktest.Target{
		Image: "shell",
		Start: func(t *testing.T, config map[string]any) sdktest.Caller {
			return sdktest.StartPlugin(t, sdktest.PluginOptions{
				Path:   bin,
				Env:    []string{hostdir.EnvStateDir + "=" + t.TempDir()},
				Config: config,
			})
		},
		// The adapter runs as whatever user runs the tests, root
		// included, so permission bits prove nothing; a symbolic link
		// out of the sandbox is refused whoever the user is.
		DenyPath: func(ctx context.Context, t *testing.T, c sdktest.Caller, id string) string {
			_, err := c.Call(ctx, contract.OpExec, map[string]any{"sandbox_id": id, "argv": []string{"ln", "-s", "/", "escape"}})
			if err != nil {
				t.Fatalf("make a symbolic link out of the sandbox: %v", err)
			}
			return "/home/escape/tmp/sdktest-denied"
		},
	})
}
