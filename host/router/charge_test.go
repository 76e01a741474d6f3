package router

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/protocol"
)

// The channel an adapter makes for a caller's sandbox::fs::read is that
// caller's: it counts against its connection's share
// (engine.MaxChannelsPerConnection), not the adapter's, so one caller who
// never reads its streams is refused at its own share while another
// caller of the same adapter reads on; and it dies with that connection.
// The adapter's share (here 8, far below one caller's) holds only the
// channels of replies in flight.
func TestAdapterChannelsChargedToCaller(t *testing.T) {
	const adapterShare = 8
	te := newEnvWith(t, nil, pluginhost.Options{MaxChannels: adapterShare})
	te.startAdapter(t, "sandbox-hostdir", "default", nil)
	assert.NilError(t, te.router.Bind("sandbox-hostdir", "default"))
	adapter := engine.AdapterChannelOwner("default", "sandbox-hostdir")
	hoarder := te.Anonymous(t, "hoarder")
	other := te.Anonymous(t, "other")

	out, err := call(t, hoarder, "sandbox::create", map[string]any{"image": "shell"})
	assert.NilError(t, err)
	id := out["sandbox_id"].(string)
	// Binary, so fs::read does not inline it: the stream is the only way
	// to the bytes.
	content := make([]byte, 200<<10)
	_, _ = rand.Read(content)
	_, err = call(t, hoarder, "sandbox::fs::write", map[string]any{"sandbox_id": id, "path": "/home/bin",
		"content_b64": base64.StdEncoding.EncodeToString(content)})
	assert.NilError(t, err)
	read := map[string]any{"sandbox_id": id, "path": "/home/bin"}

	for i := range engine.MaxChannelsPerConnection {
		if _, err := call(t, hoarder, "sandbox::fs::read", read); err != nil {
			t.Fatalf("fs::read %d of %d, within the caller's share: %v", i+1, engine.MaxChannelsPerConnection, err)
		}
	}
	assert.Check(t, is.Equal(te.Engine.OwnedChannels(hoarder.WorkerID()), engine.MaxChannelsPerConnection))
	assert.Check(t, is.Equal(te.Engine.OwnedChannels(adapter), 0), "the adapter holds none of them")

	_, err = call(t, hoarder, "sandbox::fs::read", read)
	se := enginetest.SandboxError(t, err)
	assert.Check(t, is.Equal(se.Code, contract.S218))
	assert.Check(t, is.Contains(se.Message, engine.CodeLimitExceeded))
	assert.Check(t, is.Contains(se.Message, "the calling connection holds"))
	assert.Check(t, is.Equal(te.Engine.OwnedChannels(hoarder.WorkerID()), engine.MaxChannelsPerConnection), "the refused one is dropped")
	assert.Check(t, is.Equal(te.Engine.OwnedChannels(adapter), 0))

	// Another caller of the same adapter is not held up, and its stream,
	// now its own, carries the file.
	for range adapterShare + 1 {
		out, err = call(t, other, "sandbox::fs::read", read)
		assert.NilError(t, err, "another caller's fs::read")
		assert.Check(t, is.Equal(readStream(t, other, out["content"]), string(content)))
	}
	pollUntil(t, "the other caller's read channels finish", waitFor, func() bool {
		return te.Engine.OwnedChannels(other.WorkerID()) == 0
	})

	// The hoarder's channels die with its connection.
	gone := hoarder.WorkerID()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	assert.NilError(t, hoarder.Close(ctx))
	pollUntil(t, "the disconnected caller's channels are removed", waitFor, func() bool {
		return te.Engine.OwnedChannels(gone) == 0
	})
	assert.Check(t, is.Equal(te.Engine.OwnedChannels(adapter), 0))
}

// readStream reads the channel of ref (a decoded fs::read content) to its
// end as cl.
func readStream(t *testing.T, cl *client.Client, ref any) string {
	t.Helper()
	raw, err := json.Marshal(ref)
	assert.NilError(t, err)
	var r protocol.StreamChannelRef
	assert.NilError(t, json.Unmarshal(raw, &r))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	rd, err := cl.OpenChannelReader(ctx, r)
	assert.NilError(t, err)
	defer rd.Close()
	b, err := io.ReadAll(rd)
	assert.NilError(t, err)
	return string(b)
}
