package pluginhost

import (
	"context"
	"encoding/json"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
)

// An adapter process cannot grow the engine's channel table without
// bound. Every fs::read makes a channel; one read by a caller with a
// connection (here the engine token's holder, who alone may call the
// adapter's functions directly) becomes that connection's once the reply
// is through, so it does not count against the adapter's share
// (Options.MaxChannels, by default engine.MaxChannelsPerAdapter) and dies
// with the connection. A caller without one (the engine itself) leaves it
// the adapter's: such reads that nobody reads fill the share, after which
// fs::read fails with S218 naming the limit, and nothing else breaks.
// (host/router's TestAdapterChannelsChargedToCaller is the same through
// sandbox::fs::read, with callers bounded by their own share.)
func TestAdapterChannelsBounded(t *testing.T) {
	const limit = 8
	te := newEnv(t, Options{MaxChannels: limit})
	_, err := te.start(t, map[string]any{"adapter": "sandbox-hostdir", "path": testBins.Path(t, "sandbox-hostdir"), "config": hostdirConfig(t, nil)})
	assert.NilError(t, err)
	sb := te.MustCall(t, "sandbox-hostdir::create", map[string]any{"image": "shell"})
	id := sb["sandbox_id"].(string)
	te.MustCall(t, "sandbox-hostdir::fs::write", map[string]any{"sandbox_id": id, "path": "/home/a.txt", "content": "a\n"})
	adapter := engine.AdapterChannelOwner(engine.DefaultNamespace, "sandbox-hostdir")
	read := map[string]any{"sandbox_id": id, "path": "/home/a.txt"}

	// The connection's reads are its own, past the adapter's share.
	for i := range 2 * limit {
		if _, err := te.Call(t, "sandbox-hostdir::fs::read", read); err != nil {
			t.Fatalf("fs::read %d of %d over a connection: %v", i+1, 2*limit, err)
		}
	}
	assert.Check(t, is.Equal(te.Engine.OwnedChannels(te.Client.WorkerID()), 2*limit))
	assert.Check(t, is.Equal(te.Engine.OwnedChannels(adapter), 0))

	// The engine's own reads are the adapter's.
	raw, err := json.Marshal(read)
	assert.NilError(t, err)
	invoke := func() (json.RawMessage, error) {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		return te.Engine.Invoke(ctx, engine.DefaultNamespace, "sandbox-hostdir::fs::read", raw)
	}
	for i := range limit {
		out, err := invoke()
		if err != nil {
			t.Fatalf("in-process fs::read %d of %d: %v", i+1, limit, err)
		}
		var got contract.FsReadResponse
		assert.NilError(t, json.Unmarshal(out, &got))
		assert.Check(t, is.Equal(*got.Body, "a\n"))
	}
	assert.Check(t, is.Equal(te.Engine.OwnedChannels(adapter), limit))
	_, err = invoke()
	se := enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S218)
	assert.Check(t, is.Contains(se.Message, engine.CodeLimitExceeded))
	assert.Check(t, is.Contains(se.Message, adapter+" holds 8 channels"))

	// The sandbox still answers what needs no channel.
	te.MustCall(t, "sandbox-hostdir::fs::write", map[string]any{"sandbox_id": id, "path": "/home/b.txt", "content": "b\n"})
}
