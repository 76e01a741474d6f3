package pluginhost

import (
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
)

// An adapter process cannot grow the engine's channel table without
// bound: every fs::read makes a channel, and a caller who never reads
// them fills the adapter's share (Options.MaxChannels, by default
// engine.MaxChannelsPerAdapter), after which fs::read fails with S218
// naming the limit, and nothing else breaks.
func TestAdapterChannelsBounded(t *testing.T) {
	const limit = 8
	te := newEnv(t, Options{MaxChannels: limit})
	_, err := te.start(t, map[string]any{"adapter": "sandbox-hostdir", "path": testBins.Path(t, "sandbox-hostdir"), "config": hostdirConfig(t, nil)})
	assert.NilError(t, err)
	sb := te.MustCall(t, "sandbox-hostdir::create", map[string]any{"image": "shell"})
	id := sb["sandbox_id"].(string)
	te.MustCall(t, "sandbox-hostdir::fs::write", map[string]any{"sandbox_id": id, "path": "/home/a.txt", "content": "a\n"})

	read := map[string]any{"sandbox_id": id, "path": "/home/a.txt"}
	for i := range limit {
		if _, err := te.Call(t, "sandbox-hostdir::fs::read", read); err != nil {
			t.Fatalf("fs::read %d of %d: %v", i+1, limit, err)
		}
	}
	_, err = te.Call(t, "sandbox-hostdir::fs::read", read)
	se := enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S218)
	assert.Check(t, is.Contains(se.Message, engine.CodeLimitExceeded))

	// The sandbox still answers what needs no channel.
	te.MustCall(t, "sandbox-hostdir::fs::write", map[string]any{"sandbox_id": id, "path": "/home/b.txt", "content": "b\n"})
}
