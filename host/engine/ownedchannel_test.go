package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/protocol"
)

// TestCreateOwnedChannelBound: an owner gets limit channels and then a
// LIMIT_EXCEEDED error; finishing one gives its slot back; another owner
// is not held up by the first one's count.
func TestCreateOwnedChannelBound(t *testing.T) {
	te := startEngine(t, Options{})
	const limit = 3
	var refs [][2]string
	for range limit {
		w, r, err := te.CreateOwnedChannel("adapter:default/a", limit)
		assert.NilError(t, err)
		assert.Equal(t, w.ChannelID, r.ChannelID)
		refs = append(refs, [2]string{w.ChannelID, w.AccessKey})
	}
	w0, r0 := te.channels.get(refs[0][0]).refs()

	_, _, err := te.CreateOwnedChannel("adapter:default/a", limit)
	assert.ErrorContains(t, err, CodeLimitExceeded)
	assert.Check(t, is.Contains(err.Error(), "adapter:default/a holds 3 channels"))

	_, _, err = te.CreateOwnedChannel("adapter:default/b", limit)
	assert.NilError(t, err, "another owner has its own count")

	// Finish the first channel: written, closed, read to its end.
	wr, err := te.OpenChannelWriter(w0)
	assert.NilError(t, err)
	_, err = wr.Write([]byte("done"))
	assert.NilError(t, err)
	assert.NilError(t, wr.Close())
	rd, err := te.OpenChannelReader(r0)
	assert.NilError(t, err)
	b, err := io.ReadAll(rd)
	assert.NilError(t, err)
	assert.Equal(t, string(b), "done")
	assert.NilError(t, rd.Close())
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if n := te.channels.owned("adapter:default/a"); n < limit {
			return poll.Success()
		}
		return poll.Continue("owner still holds its channels")
	})
	_, _, err = te.CreateOwnedChannel("adapter:default/a", limit)
	assert.NilError(t, err, "a finished channel gives its slot back")
}

// TestCreateOwnedChannelEngineBound: the engine-wide MaxChannels holds
// whatever an owner's own limit says.
func TestCreateOwnedChannelEngineBound(t *testing.T) {
	te := startEngine(t, Options{})
	for range MaxChannels {
		te.CreateChannel(0)
	}
	_, _, err := te.CreateOwnedChannel("adapter:default/a", MaxChannels*2)
	assert.ErrorContains(t, err, CodeLimitExceeded)
	assert.Check(t, strings.Contains(err.Error(), "the engine holds"))
}

// TestChargeReplyChannels: the channels an adapter made for a reply move
// to the caller's connection, within its share (the engine token's holder
// is not bounded, as for its own creations); they stay the adapter's when
// the caller has no connection; they are removed, with an error, when the
// caller is at its share or gone; and nothing moves that is not the
// adapter's or is not named with its key at the reply's top level.
func TestChargeReplyChannels(t *testing.T) {
	const from = "adapter:default/a"
	type env struct {
		te            *testEngine
		caller, admin *rawClient
		ref           protocol.StreamChannelRef // the channel's read end
	}
	socket := func(e env) *Call { return &Call{CallerWorkerID: e.caller.workerID} }
	content := func(e env) string { return `{"content":` + string(mustJSON(t, e.ref)) + `,"size":4}` }
	for _, tc := range []struct {
		name  string
		owner string // the channel's owner before; "" = from
		fill  int    // channels the caller holds already
		call  func(env) *Call
		reply func(env) string // nil = content
		// want is who holds the channel after: "caller", "adapter",
		// "removed", or an owner as it is.
		want, wantErr string
	}{
		{name: "a connection", call: socket, want: "caller"},
		{name: "a connection at its share", fill: MaxChannelsPerConnection, call: socket, want: "removed",
			wantErr: CodeLimitExceeded + ": the calling connection holds 256 channels; its share is 256"},
		{name: "a connection one short of its share", fill: MaxChannelsPerConnection - 1, call: socket, want: "caller"},
		{name: "the engine token's connection", fill: MaxChannelsPerConnection,
			call: func(e env) *Call { return &Call{CallerWorkerID: e.admin.workerID, CallerAdmin: true} }, want: "caller"},
		{name: "the engine itself", call: func(env) *Call { return &Call{CallerAdmin: true} }, want: "adapter"},
		{name: "an in-process worker", call: func(e env) *Call {
			l, err := e.te.AttachLocalWorker(LocalWorkerSpec{Name: "inproc"})
			assert.NilError(t, err)
			t.Cleanup(l.Detach)
			return &Call{CallerWorkerID: l.Caller().WorkerID(), CallerAdmin: true}
		}, want: "adapter"},
		{name: "a call config.yaml set up", call: func(env) *Call { return &Call{CallerWorkerID: "middleware", CallerAdmin: true} }, want: "adapter"},
		{name: "a connection gone", call: func(e env) *Call {
			gone := e.te.dial(t)
			_ = gone.c.CloseNow()
			pollUntil(t, "the connection is gone", func() bool { return e.te.lookupWorker(gone.workerID) == nil })
			return &Call{CallerWorkerID: gone.workerID}
		}, want: "removed", wantErr: "is gone"},
		{name: "a wrong key", call: socket, want: "adapter", reply: func(e env) string {
			r := e.ref
			r.AccessKey = strings.Repeat("0", len(r.AccessKey))
			return `{"content":` + string(mustJSON(t, r)) + `}`
		}},
		{name: "nested deeper", call: socket, want: "adapter", reply: func(e env) string { return `{"x":` + content(e) + `}` }},
		{name: "another owner's channel", owner: "someone-else", call: socket, want: "someone-else"},
		{name: "named twice", call: socket, want: "caller", reply: func(e env) string {
			ref := string(mustJSON(t, e.ref))
			return `{"a":` + ref + `,"b":` + ref + `}`
		}},
		{name: "a string that mentions one", call: socket, want: "adapter", reply: func(e env) string {
			return `{"body":` + string(mustJSON(t, string(mustJSON(t, e.ref)))) + `}`
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			te := startEngine(t, Options{})
			e := env{te: te, caller: te.dial(t), admin: te.dialAdmin(t)}
			owner := tc.owner
			if owner == "" {
				owner = from
			}
			_, e.ref = te.channels.create(te.Engine, 0, owner).refs()
			call := tc.call(e)
			for range tc.fill {
				te.channels.create(te.Engine, 0, call.CallerWorkerID)
			}
			reply := content
			if tc.reply != nil {
				reply = tc.reply
			}
			held := te.OwnedChannels(call.CallerWorkerID)

			err := te.ChargeReplyChannels(from, call, json.RawMessage(reply(e)))
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
			} else {
				assert.NilError(t, err)
			}
			got := "removed"
			if c := te.channels.get(e.ref.ChannelID); c != nil {
				te.channels.mu.Lock()
				got = c.owner
				te.channels.mu.Unlock()
				switch {
				case got == call.CallerWorkerID && got != "":
					got = "caller"
				case got == from:
					got = "adapter"
				}
			}
			assert.Check(t, is.Equal(got, tc.want))
			if tc.want == "caller" {
				assert.Check(t, is.Equal(te.OwnedChannels(call.CallerWorkerID), held+1))
			} else if call.CallerWorkerID != "" {
				assert.Check(t, is.Equal(te.OwnedChannels(call.CallerWorkerID), held))
			}
			if tc.want == "caller" || tc.want == "removed" {
				assert.Check(t, is.Equal(te.OwnedChannels(from), 0))
			}
		})
	}
}

// TestChargedChannelLifetime: a channel handed to a caller carries its
// stream to the caller's reader as before, and one the caller never reads
// is removed when the caller disconnects, which the adapter's writer sees.
func TestChargedChannelLifetime(t *testing.T) {
	const from = "adapter:default/a"
	te := startEngine(t, Options{})
	caller := te.dial(t)
	call := &Call{CallerWorkerID: caller.workerID}

	w, r, err := te.CreateOwnedChannel(from, 4)
	assert.NilError(t, err)
	wr, err := te.OpenChannelWriter(w)
	assert.NilError(t, err)
	assert.NilError(t, te.ChargeReplyChannels(from, call, mustJSON(t, map[string]any{"content": r})))
	_, err = wr.Write([]byte("file bytes"))
	assert.NilError(t, err)
	assert.NilError(t, wr.Close())
	rd, err := te.OpenChannelReader(r)
	assert.NilError(t, err)
	b, err := io.ReadAll(rd)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(string(b), "file bytes"))
	assert.NilError(t, rd.Close())
	pollUntil(t, "the read channel finishes", func() bool { return te.OwnedChannels(caller.workerID) == 0 })

	w, r, err = te.CreateOwnedChannel(from, 4)
	assert.NilError(t, err)
	wr, err = te.OpenChannelWriter(w)
	assert.NilError(t, err)
	assert.NilError(t, te.ChargeReplyChannels(from, call, mustJSON(t, map[string]any{"content": r})))
	assert.Check(t, is.Equal(te.OwnedChannels(caller.workerID), 1))
	_ = caller.c.CloseNow()
	pollUntil(t, "the caller's channel goes with it", func() bool { return te.channels.get(r.ChannelID) == nil })
	assert.Check(t, is.Equal(te.OwnedChannels(caller.workerID), 0))
	assert.Check(t, is.Equal(te.OwnedChannels(from), 0))
	pollUntil(t, "the writer sees its reader gone", func() bool {
		_, err := wr.Write([]byte("more"))
		return errors.Is(err, ErrChannelClosed)
	})
	wr.Abort()
}

// TestTransferToClosingConnection: a connection that teardown has marked
// closing, but whose channels it has not removed yet, gets none: they are
// removed here, since the teardown's removal may already have run.
func TestTransferToClosingConnection(t *testing.T) {
	const from = "adapter:default/a"
	te := startEngine(t, Options{})
	_, r, err := te.CreateOwnedChannel(from, 4)
	assert.NilError(t, err)
	w := &worker{id: "closing-conn"}
	w.closing.Store(true)
	err = te.channels.transfer(from, w.id, w, false, replyRefs{refs: []protocol.StreamChannelRef{r}, inline: -1})
	assert.ErrorContains(t, err, "is gone")
	assert.Check(t, te.channels.get(r.ChannelID) == nil)
	assert.Check(t, is.Equal(te.OwnedChannels(w.id), 0))
	assert.Check(t, is.Equal(te.OwnedChannels(from), 0))
}

// FuzzReplyChannelRefs holds the scan that finds a reply's channels to
// encoding/json: for every valid JSON object the refs found are the ones
// a decoder finds among its top-level fields, in order, and the inline
// one is the last "content" field's when that is a ref and the last
// "body" field is a string; anything else only must not panic.
func FuzzReplyChannelRefs(f *testing.F) {
	ref := `{"channel_id":"c1","access_key":"k1","direction":"read"}`
	for _, s := range []string{
		`{"content":` + ref + `,"body":"x","size":1}`,
		`{"body":"a \"channel_id\" \\\" {[","content":` + ref + `}`,
		` { "a" : ` + ref + ` , "b" : [ ` + ref + ` ] , "c" : {"d":` + ref + `} } `,
		`{"a":` + ref + `,"a":{"channel_id":"c2","access_key":"k2"}}`,
		`{"n":null,"t":true,"f":-1.5e3,"s":"\\","content":` + ref + `}`,
		`{"content":{"CHANNEL_ID":"c","access_key":"k"}}`,
		`{"content":{"channel_id":"c","access_key":""}}`,
		`{"content":{"channel_id":1,"access_key":"k"},"x":"channel_id"}`,
		`{"\u0062ody":"x","c\u006fntent":` + ref + `}`,
		`{"body":"x","content":` + ref + `,"body":null}`,
		`{"content":` + ref + `,"body":"x","content":{"channel_id":"c2","access_key":"k2"}}`,
		`{"content":` + ref + `,"body":"x","content":1}`,
		`{"body":1,"content":` + ref + `}`,
		`{"content":` + ref + `,"body":"x",}`,
		`{"content":` + ref + `,"body":"x"}0`,
		`["channel_id",` + ref + `]`,
		`{"content":` + ref,
		`{"body":"unterminated channel_id`,
		`{"channel_id"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := replyChannelRefs(b)
		if !json.Valid(b) || !bytes.Contains(b, []byte(`"channel_id"`)) {
			return
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		if tok, _ := dec.Token(); tok != json.Delim('{') {
			if len(got.refs) != 0 || got.inline != -1 {
				t.Fatalf("%q is not an object, found %+v", b, got)
			}
			return
		}
		want := replyRefs{inline: -1}
		content, body := -1, false
		for dec.More() {
			key, err := dec.Token()
			assert.NilError(t, err)
			var v json.RawMessage
			assert.NilError(t, dec.Decode(&v))
			var r protocol.StreamChannelRef
			isRef := v[0] == '{' && json.Unmarshal(v, &r) == nil && r.ChannelID != "" && r.AccessKey != ""
			if isRef {
				want.refs = append(want.refs, r)
			}
			switch key {
			case "content":
				content = -1
				if isRef {
					content = len(want.refs) - 1
				}
			case "body":
				body = v[0] == '"'
			}
		}
		if body {
			want.inline = content
		}
		assert.DeepEqual(t, got, want, cmpReplyRefs)
	})
}

var cmpReplyRefs = gocmp.AllowUnexported(replyRefs{})

// BenchmarkReplyChannelRefs is the scan of an fs::read reply that inlines
// a file of almost InlineBodyLimit (1 MiB): what ChargeReplyChannels adds
// to such a read. encoding/json took about 6 ms for it.
func BenchmarkReplyChannelRefs(b *testing.B) {
	body := strings.Repeat(`some text, "quoted" \ and more`+"\n", (1<<20-64)/33)
	reply := mustJSON(b, map[string]any{
		"content": protocol.StreamChannelRef{ChannelID: "c", AccessKey: "k", Direction: protocol.DirectionRead},
		"body":    body, "size": len(body), "mode": 420, "mtime": 1,
	})
	b.SetBytes(int64(len(reply)))
	for b.Loop() {
		if rr := replyChannelRefs(reply); len(rr.refs) != 1 || rr.inline != 0 {
			b.Fatalf("found %+v", rr)
		}
	}
}
