package mine_test

import (
	"context"
	"testing"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk/sdktest"
)

// TestConformance builds the binary and runs the conformance suite
// against it as a go-plugin subprocess, as the engine runs it.
func TestConformance(t *testing.T) {
	bin := sdktest.BuildPlugin(t, "./cmd/sandbox-mine")
	sdktest.Run(t, sdktest.Target{
		Image: "shell", // an image with /bin/sh, sleep and cat
		Start: func(t *testing.T, config map[string]any) sdktest.Caller {
			// Each start gets its own state_dir, removed after the test.
			config = sdktest.Merge(config, map[string]any{"state_dir": t.TempDir()})
			return sdktest.StartPlugin(t, sdktest.PluginOptions{Path: bin, Config: config})
		},
		// Run as root, the adapter may write anywhere its permission
		// bits say no, so a 0555 directory proves nothing. A symbolic
		// link out of the sandbox is refused (S215) whoever runs it.
		DenyPath: func(ctx context.Context, t *testing.T, c sdktest.Caller, id string) string {
			_, err := c.Call(ctx, contract.OpExec, map[string]any{
				"sandbox_id": id, "argv": []string{"ln", "-s", "/", "escape"},
			})
			if err != nil {
				t.Fatalf("make a symbolic link out of the sandbox: %v", err)
			}
			return "/home/escape/sdktest-denied"
		},
	})
}
