// Package sdktest is the sandbox contract's conformance suite. Any adapter
// runs it from its own tests to prove it behaves like every other adapter:
//
//	func TestConformance(t *testing.T) {
//		bin := sdktest.BuildPlugin(t, "./cmd/sandbox-mine")
//		sdktest.Run(t, sdktest.Target{
//			Image: "alpine",
//			Start: func(t *testing.T, config map[string]any) sdktest.Caller {
//				return sdktest.StartPlugin(t, sdktest.PluginOptions{Path: bin, Config: config})
//			},
//		})
//	}
//
// The suite drives the adapter through JSON, exactly as callers of
// sandbox::* do, so it is transport-agnostic: StartPlugin talks to a real
// go-plugin subprocess, NewAdapterCaller to an adapter in the same
// process, and a Caller over a real engine works the same way. It covers
// every operation and every validation code with real filesystem states,
// and restarts the adapter with small limits and a short reaper tick
// (reaper_tick_ms) to check them. It never asserts on how fast an adapter
// is; its deadlines only bound how long a broken adapter can hang it.
package sdktest
