package pluginhost

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/iii-sandbox/iii/contract"
)

// BenchmarkPluginHop splits the cost of a call to an adapter the host
// runs: the adapter's gRPC call alone (AutoMTLS, another process; "grpc"
// through the typed Go client, which marshals and decodes the JSON,
// "call" with the JSON as it is), the host's handler around it (contexts,
// the error cases), and the engine's in-process Invoke on top. scripts/bench/router measures the
// whole path over WebSocket beside its floors.
func BenchmarkPluginHop(b *testing.B) {
	te := newEnv(b, Options{})
	if _, err := te.start(b, map[string]any{"adapter": "sandbox-hostdir", "path": testBins.Path(b, "sandbox-hostdir"), "config": hostdirConfig(b, nil)}); err != nil {
		b.Fatal(err)
	}
	m := te.host.entries[key{"sandbox-hostdir", "default"}]
	m.mu.Lock()
	w := m.worker
	m.mu.Unlock()
	if w == nil {
		b.Fatal("not published")
	}
	ctx := context.Background()
	m.mu.Lock()
	in := m.current
	m.mu.Unlock()
	if in == nil {
		b.Fatal("no running instance")
	}
	b.Run("health", func(b *testing.B) {
		for b.Loop() {
			if err := in.ping(ctx, waitFor); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("grpc", func(b *testing.B) {
		for b.Loop() {
			if _, err := in.adapter.CatalogList(ctx, &contract.CatalogListRequest{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("call", func(b *testing.B) {
		for b.Loop() {
			if _, body, err := in.adapter.Call(ctx, contract.OpCatalogList, json.RawMessage(`{}`)); err != nil || body != nil {
				b.Fatal(err, body)
			}
		}
	})
	b.Run("handler", func(b *testing.B) {
		for b.Loop() {
			if _, err := in.serve(ctx, contract.OpCatalogList, json.RawMessage(`{}`)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("invoke", func(b *testing.B) {
		for b.Loop() {
			if _, err := te.Engine.Invoke(ctx, "", "sandbox-hostdir::catalog::list", json.RawMessage(`{}`)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
