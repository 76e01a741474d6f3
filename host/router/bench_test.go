package router

import (
	"context"
	"encoding/json"
	"testing"
)

// BenchmarkRouterHop is the router's share of a sandbox call, in process:
// sandbox::catalog::list through the router against the same call straight
// to the adapter's function, both through Engine.Invoke. The difference is
// the router's hop (its handler plus one more in-process invocation).
// scripts/bench/router measures the whole path over WebSocket.
func BenchmarkRouterHop(b *testing.B) {
	te := newEnv(b, nil)
	te.startAdapter(b, "sandbox-hostdir", "default", nil)
	if err := te.router.Bind("sandbox-hostdir", ""); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, fn := range []string{"sandbox-hostdir::catalog::list", "sandbox::catalog::list"} {
		b.Run(fn, func(b *testing.B) {
			for b.Loop() {
				if _, err := te.Engine.Invoke(ctx, "", fn, json.RawMessage(`{}`)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
