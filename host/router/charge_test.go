package router

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strings"
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

// inlineEnv is an engine with sandbox-hostdir bound, one sandbox, and a
// caller connection that owns it.
type inlineEnv struct {
	*testEnv
	caller *client.Client
	id     string
}

func newInlineEnv(t *testing.T) *inlineEnv {
	t.Helper()
	te := newEnv(t, nil)
	te.startAdapter(t, "sandbox-hostdir", "default", nil)
	assert.NilError(t, te.router.Bind("sandbox-hostdir", "default"))
	caller := te.Anonymous(t, "reader")
	out, err := call(t, caller, "sandbox::create", map[string]any{"image": "shell"})
	assert.NilError(t, err)
	return &inlineEnv{testEnv: te, caller: caller, id: out["sandbox_id"].(string)}
}

func (ie *inlineEnv) write(t *testing.T, path, content string) {
	t.Helper()
	_, err := call(t, ie.caller, "sandbox::fs::write", map[string]any{"sandbox_id": ie.id, "path": path, "content": content})
	assert.NilError(t, err)
}

func (ie *inlineEnv) read(t *testing.T, path string) (map[string]any, error) {
	t.Helper()
	return call(t, ie.caller, "sandbox::fs::read", map[string]any{"sandbox_id": ie.id, "path": path})
}

// held is what the caller's connection holds of its channel share.
func (ie *inlineEnv) held() int { return ie.Engine.OwnedChannels(ie.caller.WorkerID()) }

// smallFiles writes n small text files (fs::read inlines them) and
// returns their paths and contents.
func (ie *inlineEnv) smallFiles(t *testing.T, n int) (paths, contents []string) {
	t.Helper()
	for i := range n {
		paths = append(paths, fmt.Sprintf("/home/f%d.txt", i))
		contents = append(contents, fmt.Sprintf("package f%d // %s\n", i, strings.Repeat("x", i*37)))
		ie.write(t, paths[i], contents[i])
	}
	return paths, contents
}

// An honest caller that reads many small files and uses the inline body,
// never opening the streams, is never refused: the streams whose content
// it already has give way in its share, oldest first, so it never holds
// more than engine.MaxChannelsPerConnection.
func TestInlineReadsNeverThrottled(t *testing.T) {
	const reads = 600
	ie := newInlineEnv(t)
	paths, contents := ie.smallFiles(t, 23)
	adapter := engine.AdapterChannelOwner("default", "sandbox-hostdir")

	for i := range reads {
		f := i % len(paths)
		out, err := ie.read(t, paths[f])
		if err != nil {
			t.Fatalf("fs::read %d of %d: %v", i+1, reads, err)
		}
		assert.Check(t, is.Equal(out["body"], contents[f]), "fs::read %d", i+1)
		assert.Check(t, out["content"] != nil, "the stream is there as well")
		if n, want := ie.held(), min(i+1, engine.MaxChannelsPerConnection); n != want {
			t.Fatalf("after fs::read %d the caller holds %d channels, want %d", i+1, n, want)
		}
	}
	assert.Check(t, is.Equal(ie.Engine.OwnedChannels(adapter), 0))
	// The newest stream was not evicted, and carries its file.
	out, err := ie.read(t, paths[0])
	assert.NilError(t, err)
	assert.Check(t, is.Equal(readStream(t, ie.caller, out["content"]), contents[0]))
}

// Streams that came without an inline body (files of 1 MiB and more) do
// not give way: a caller holding its share of them unread is refused the
// next fs::read with S218, a large one and a small one alike (a small
// read's stream gives way only to a later need; it cannot evict the
// streams the caller has no other copy of), and a caller that reads or
// drops them gets its share back.
func TestUnreadStreamsStillBounded(t *testing.T) {
	ie := newInlineEnv(t)
	big := strings.Repeat("0123456789abcde\n", (1<<20)/16) // 1 MiB: not inlined
	ie.write(t, "/home/big.txt", big)
	ie.write(t, "/home/small.txt", "small\n")

	var first any
	for i := range engine.MaxChannelsPerConnection {
		out, err := ie.read(t, "/home/big.txt")
		if err != nil {
			t.Fatalf("fs::read %d of %d, within the share: %v", i+1, engine.MaxChannelsPerConnection, err)
		}
		assert.Check(t, is.Nil(out["body"]), "a 1 MiB file is not inlined")
		if i == 0 {
			first = out["content"]
		}
	}
	assert.Check(t, is.Equal(ie.held(), engine.MaxChannelsPerConnection))
	for _, path := range []string{"/home/big.txt", "/home/small.txt"} {
		_, err := ie.read(t, path)
		se := enginetest.SandboxError(t, err)
		assert.Check(t, is.Equal(se.Code, contract.S218), path)
		assert.Check(t, is.Contains(se.Message, engine.CodeLimitExceeded), path)
		assert.Check(t, is.Contains(se.Message, "none of them is an unopened stream whose content came inline"), path)
		assert.Check(t, is.Equal(ie.held(), engine.MaxChannelsPerConnection), path)
	}

	// Reading one to its end frees its slot: the oldest is whole.
	assert.Check(t, is.Equal(readStream(t, ie.caller, first), big))
	pollUntil(t, "the read stream finishes", waitFor, func() bool { return ie.held() < engine.MaxChannelsPerConnection })
	out, err := ie.read(t, "/home/small.txt")
	assert.NilError(t, err)
	assert.Check(t, is.Equal(out["body"], "small\n"))
}

// A stream the caller has started to read is its own to finish, even when
// its content also came inline: 600 inline reads later it is still there
// and carries its whole file. One is read over a WebSocket, as a caller
// does; on loopback the sockets take in a whole inline-sized stream at
// once, so the other is read in-process, where what is not read yet stays
// in the engine's buffer, which an eviction would lose.
func TestOpenedInlineStreamNotEvicted(t *testing.T) {
	const reads = 600
	ie := newInlineEnv(t)
	paths, contents := ie.smallFiles(t, 7)
	// Just under 1 MiB, so inlined, in 16 pieces.
	long := strings.Repeat("a line of text that the caller streams\n", (1<<20-1)/39)
	ie.write(t, "/home/long.txt", long)
	openLong := func() protocol.StreamChannelRef {
		t.Helper()
		out, err := ie.read(t, "/home/long.txt")
		assert.NilError(t, err)
		assert.Check(t, is.Equal(out["body"], long), "inlined")
		raw, err := json.Marshal(out["content"])
		assert.NilError(t, err)
		var ref protocol.StreamChannelRef
		assert.NilError(t, json.Unmarshal(raw, &ref))
		return ref
	}
	head := make([]byte, 10)

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	wsRead, err := ie.caller.OpenChannelReader(ctx, openLong())
	assert.NilError(t, err)
	defer wsRead.Close()
	_, err = io.ReadFull(wsRead, head)
	assert.NilError(t, err, "reading has started")

	inRead, err := ie.Engine.OpenChannelReader(openLong())
	assert.NilError(t, err)
	defer inRead.Close()
	_, err = io.ReadFull(inRead, head)
	assert.NilError(t, err, "reading has started")

	for i := range reads {
		f := i % len(paths)
		out, err := ie.read(t, paths[f])
		if err != nil {
			t.Fatalf("fs::read %d of %d: %v", i+1, reads, err)
		}
		assert.Check(t, is.Equal(out["body"], contents[f]))
		if n := ie.held(); n > engine.MaxChannelsPerConnection {
			t.Fatalf("after fs::read %d the caller holds %d channels", i+1, n)
		}
	}
	for name, rd := range map[string]io.Reader{"over a WebSocket": wsRead, "in-process": inRead} {
		rest, err := io.ReadAll(rd)
		assert.Check(t, err, "the stream opened %s ends normally", name)
		assert.Check(t, string(head)+string(rest) == long, "the stream opened %s carries the whole file (%d bytes of %d)", name, len(head)+len(rest), len(long))
	}
}
