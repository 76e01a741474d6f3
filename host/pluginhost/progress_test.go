package pluginhost

import (
	"context"
	"errors"
	"io"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// readProgress reads a progress channel to its end: every message must be
// a text progress event.
func readProgress(ctx context.Context, r *client.ChannelReader) ([]contract.ProgressEvent, error) {
	var out []contract.ProgressEvent
	for {
		m, err := r.ReadMessage(ctx)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if !m.Text {
			return out, errors.New("a binary message on a progress channel")
		}
		ev, err := contract.DecodeProgressEvent(m.Data)
		if err != nil {
			return out, err
		}
		out = append(out, *ev)
	}
}

// create and run with a progress channel, through the real engine and a
// real plugin subprocess (hostdir reports no phases of its own; the kit
// reports ready): the channel carries the events and is closed before the
// reply arrives. Either end of the channel is accepted.
func TestProgressChannel(t *testing.T) {
	te := newEnv(t, Options{})
	_, err := te.start(t, map[string]any{"adapter": "sandbox-hostdir", "path": testBins.Path(t, "sandbox-hostdir"), "config": hostdirConfig(t, nil)})
	assert.NilError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	for _, tc := range []struct {
		name, fn string
		payload  map[string]any
		pass     func(w, r protocol.StreamChannelRef) protocol.StreamChannelRef
	}{
		{"create with the write end", "sandbox-hostdir::create", map[string]any{"image": "shell"},
			func(w, _ protocol.StreamChannelRef) protocol.StreamChannelRef { return w }},
		{"create with the read end", "sandbox-hostdir::create", map[string]any{"image": "shell"},
			func(_, r protocol.StreamChannelRef) protocol.StreamChannelRef { return r }},
		{"run kept", "sandbox-hostdir::run", map[string]any{"image": "shell", "lang": "sh", "code": "echo hi", "keep_sandbox": true},
			func(w, _ protocol.StreamChannelRef) protocol.StreamChannelRef { return w }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wref, rref, err := te.Client.CreateChannel(ctx, 0)
			assert.NilError(t, err)
			r, err := te.Client.OpenChannelReader(ctx, rref)
			assert.NilError(t, err)
			defer r.Close()
			type result struct {
				evs []contract.ProgressEvent
				err error
			}
			read := make(chan result, 1)
			go func() {
				evs, err := readProgress(ctx, r)
				read <- result{evs, err}
			}()

			tc.payload["progress"] = tc.pass(wref, rref)
			out := te.MustCall(t, tc.fn, tc.payload)
			got := waitfor.Recv(t, read, waitFor, "the progress events to be read")
			assert.NilError(t, got.err)
			id, _ := out["sandbox_id"].(string)
			assert.Assert(t, id != "")
			assert.DeepEqual(t, got.evs, []contract.ProgressEvent{
				{Phase: contract.ProgressReady, Image: "shell", ImageRef: "host:/bin/sh", SandboxID: id},
			})
		})
	}

	t.Run("a channel that cannot be written is S001", func(t *testing.T) {
		_, err := te.Call(t, "sandbox-hostdir::create", map[string]any{"image": "shell",
			"progress": map[string]any{"channel_id": "nope", "access_key": "nope", "direction": "write"}})
		se := enginetest.SandboxError(t, err)
		assert.Equal(t, se.Code, contract.S001)
		assert.Check(t, is.Contains(se.Message, "progress channel"))
	})

	t.Run("a malformed progress field is S001", func(t *testing.T) {
		_, err := te.Call(t, "sandbox-hostdir::run", map[string]any{"image": "shell", "lang": "sh", "code": "true", "progress": true})
		assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S001)
	})

	t.Run("nobody reads the channel", func(t *testing.T) {
		// The reply still comes: the host never waits on the caller's
		// reading for long.
		wref, _, err := te.Client.CreateChannel(ctx, 0)
		assert.NilError(t, err)
		out := te.MustCall(t, "sandbox-hostdir::create", map[string]any{"image": "shell", "progress": wref})
		assert.Check(t, out["sandbox_id"] != "")
	})
}
