package e2e

import (
	"context"
	"testing"

	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/plugins/sdk/sdktest"
)

// TestConformance runs the sandbox contract's conformance suite against
// sandbox-libkrun as a real go-plugin subprocess booting real VMs, with
// file contents through channels (the suite's Caller carries them).
func TestConformance(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	stateDir := dirs.Short(t, "sb")
	sdktest.Run(t, sdktest.Target{
		Image:  "python",
		Config: map[string]any{"state_dir": stateDir, "cache_dir": e.cacheDir},
		Start: func(t *testing.T, config map[string]any) sdktest.Caller {
			return sdktest.StartPlugin(t, sdktest.PluginOptions{Path: e.bin, Config: config})
		},
		// Every sandbox acts as root, so permission bits deny nothing;
		// sysfs refuses new files whoever asks.
		DenyPath: func(context.Context, *testing.T, sdktest.Caller, string) string { return "/sys/sdktest-denied" },
	})
}
