package sdk

import (
	"maps"

	"github.com/iii-sandbox/iii/internal/procstats"
)

// RuntimeFactKey is the adapter::info key under which every adapter
// served with Serve reports its own process: {goroutines, open_fds,
// rss_bytes} (-1 where the system cannot tell). It is read-only and
// sampled at each call, so a long run can watch the adapter for leaks
// through the ordinary call; the engine's engine::runtime::stats reports
// the engine in the same shape.
const RuntimeFactKey = "runtime"

// withRuntime returns facts with the runtime block of this process set,
// leaving the adapter's own map untouched (it may hand out a shared one).
// The block is the SDK's: an adapter's own "runtime" fact is replaced.
func withRuntime(facts map[string]any, s procstats.Stats) map[string]any {
	out := make(map[string]any, len(facts)+1)
	maps.Copy(out, facts)
	out[RuntimeFactKey] = s.Map()
	return out
}
