package engine

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/protocol"
)

// TestEvictInline is the choice of what gives way in a connection's share:
// its inline-delivered channels (handed over with a reply whose body
// carried the whole stream), oldest handed over first, and only those no
// reader has opened; none at all when they cannot make the room asked
// for. An evicted channel is out of the table and its count, its writer
// sees ErrChannelClosed and what it buffered is let go; a kept one still
// carries its stream.
func TestEvictInline(t *testing.T) {
	const (
		from = "adapter:default/a"
		conn = "conn"
	)
	// Each channel is handed over as one of these: "inline" (with a body),
	// "stream" (without), "opened" (inline, then its reader opened),
	// "dropped" (inline, then dropped), "other" (inline, to another
	// connection).
	for _, tc := range []struct {
		name     string
		channels []string
		need     int
		want     []int // indices into channels, in eviction order
	}{
		{name: "oldest first", channels: []string{"inline", "inline", "inline"}, need: 2, want: []int{0, 1}},
		{name: "all of them", channels: []string{"inline", "inline"}, need: 2, want: []int{0, 1}},
		{name: "an opened one stays", channels: []string{"opened", "inline", "inline"}, need: 1, want: []int{1}},
		{name: "a stream without inline body stays", channels: []string{"stream", "inline"}, need: 1, want: []int{1}},
		{name: "a dropped one is passed", channels: []string{"dropped", "inline"}, need: 1, want: []int{1}},
		{name: "another connection's stays", channels: []string{"other", "inline"}, need: 1, want: []int{1}},
		{name: "too few: none", channels: []string{"inline", "opened", "stream"}, need: 2},
		{name: "nothing evictable", channels: []string{"opened", "stream", "other"}, need: 1},
		{name: "no need", channels: []string{"inline"}, need: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			te := startEngine(t, Options{})
			tab := &te.channels
			type handed struct {
				c     *channel
				wr    *ChannelWriter
				rd    *ChannelReader
				owner string
			}
			hs := make([]handed, len(tc.channels))
			for i, kind := range tc.channels {
				c := tab.create(te.Engine, 0, from)
				w, r := c.refs()
				wr, err := te.OpenChannelWriter(w)
				assert.NilError(t, err)
				_, err = wr.Write([]byte(fmt.Sprint("file ", i)))
				assert.NilError(t, err)
				rr := replyRefs{refs: []protocol.StreamChannelRef{r}, inline: 0}
				if kind == "stream" {
					rr.inline = -1
				}
				owner := conn
				if kind == "other" {
					owner = "other-conn"
				}
				assert.NilError(t, tab.transfer(from, owner, &worker{id: owner}, false, rr))
				hs[i] = handed{c: c, wr: wr, owner: owner}
				switch kind {
				case "opened":
					hs[i].rd, err = te.OpenChannelReader(r)
					assert.NilError(t, err)
				case "dropped":
					tab.remove(c)
				}
			}
			held := te.OwnedChannels(conn)

			tab.mu.Lock()
			gone := tab.evictInline(conn, tc.need)
			tab.mu.Unlock()
			killAll(gone)

			got := []int{}
			for _, c := range gone {
				for i, h := range hs {
					if h.c == c {
						got = append(got, i)
					}
				}
			}
			want := tc.want
			if want == nil {
				want = []int{}
			}
			assert.DeepEqual(t, got, want)
			assert.Check(t, is.Equal(te.OwnedChannels(conn), held-len(want)))
			for i, h := range hs {
				evicted := slices.Contains(want, i)
				_, err := h.wr.Write([]byte(" more"))
				switch {
				case evicted:
					assert.Check(t, is.ErrorIs(err, ErrChannelClosed), "channel %d's writer", i)
					assert.Check(t, tab.get(h.c.id) == nil, "channel %d is out of the table", i)
					assert.Check(t, is.Len(h.c.items, 0), "channel %d's buffer is let go", i)
				case tc.channels[i] == "dropped":
					assert.Check(t, is.ErrorIs(err, ErrChannelClosed))
				default:
					assert.Check(t, err, "channel %d's writer", i)
					assert.Check(t, tab.get(h.c.id) == h.c, "channel %d stays", i)
				}
				if evicted || tc.channels[i] == "dropped" {
					h.wr.Abort()
					continue
				}
				assert.Check(t, h.wr.Close())
				if h.rd != nil {
					// Opened before the eviction: its stream is whole.
					b, err := io.ReadAll(h.rd)
					assert.Check(t, err)
					assert.Check(t, is.Equal(string(b), fmt.Sprint("file ", i, " more")))
					assert.Check(t, h.rd.Close())
				}
			}
		})
	}
}

// TestInlineChannelsGiveWay: a connection that is handed far more
// inline-delivered channels than its share, reading none, is never
// refused and never holds more than its share; they give way to its own
// engine::channels::create too. Streams handed over without an inline
// body do not give way: at the share, the next hand-over, inline or not,
// is refused with LIMIT_EXCEEDED and its channel removed.
func TestInlineChannelsGiveWay(t *testing.T) {
	const from = "adapter:default/a"
	te := startEngine(t, Options{})
	caller := te.dial(t)
	call := &Call{CallerWorkerID: caller.workerID}
	hand := func(inline bool) (protocol.StreamChannelRef, error) {
		t.Helper()
		_, r, err := te.CreateOwnedChannel(from, MaxChannelsPerAdapter)
		assert.NilError(t, err)
		reply := map[string]any{"content": r, "size": 2}
		if inline {
			reply["body"] = "x\n"
		}
		return r, te.ChargeReplyChannels(from, call, mustJSON(t, reply))
	}

	for i := range 3*MaxChannelsPerConnection + 7 {
		_, err := hand(true)
		assert.NilError(t, err, "inline hand-over %d", i+1)
		if n := te.OwnedChannels(caller.workerID); n > MaxChannelsPerConnection {
			t.Fatalf("after hand-over %d the connection holds %d channels", i+1, n)
		}
	}
	assert.Check(t, is.Equal(te.OwnedChannels(caller.workerID), MaxChannelsPerConnection))
	te.channels.mu.Lock()
	queued := len(te.channels.inlineOf[caller.workerID])
	te.channels.mu.Unlock()
	assert.Check(t, queued <= 2*MaxChannelsPerConnection, "the inline queue holds %d", queued)

	// The connection's own channels, created or minted: inline-delivered
	// ones give way.
	createBatch(t, caller, `{"channels":[{},{},{}]}`)
	assert.Check(t, is.Equal(te.OwnedChannels(caller.workerID), MaxChannelsPerConnection))
	l := leaseOf(t, caller)
	rd, err := te.OpenChannelReader(l.ref(1, false, protocol.DirectionRead))
	assert.NilError(t, err, "a minted channel's first open")
	defer rd.Close()
	assert.Check(t, is.Equal(te.OwnedChannels(caller.workerID), MaxChannelsPerConnection))

	// Fill the share with streams that came without a body (four are the
	// connection's own).
	for range MaxChannelsPerConnection - 4 {
		_, err := hand(false)
		assert.NilError(t, err)
	}
	assert.Check(t, is.Equal(te.OwnedChannels(caller.workerID), MaxChannelsPerConnection))
	for _, inline := range []bool{false, true} {
		r, err := hand(inline)
		assert.ErrorContains(t, err, CodeLimitExceeded+": the calling connection holds 256 channels; its share is 256")
		assert.Check(t, strings.Contains(err.Error(), "none of them is an unopened stream whose content came inline"))
		assert.Check(t, te.channels.get(r.ChannelID) == nil, "the refused channel is removed")
		assert.Check(t, is.Equal(te.OwnedChannels(caller.workerID), MaxChannelsPerConnection))
		assert.Check(t, is.Equal(te.OwnedChannels(from), 0))
	}
	res := caller.call("one-more", FnChannelsCreate, nil, `{}`)
	code, _ := errBody(t, res)
	assert.Check(t, is.Equal(code, CodeLimitExceeded))
	_, err = te.OpenChannelReader(l.ref(2, false, protocol.DirectionRead))
	assert.Check(t, is.ErrorContains(err, "holds 256 channels, its limit"))
}

// TestEvictRacesReaders: readers opening a connection's inline-delivered
// channels while hand-overs at its share evict them either open one and
// read its whole stream, or are told it is gone or taken: an eviction
// never cuts a stream a reader has opened, and the connection never holds
// more than its share.
func TestEvictRacesReaders(t *testing.T) {
	const (
		from  = "adapter:default/a"
		extra = 300
	)
	te := startEngine(t, Options{})
	caller := te.dial(t)
	call := &Call{CallerWorkerID: caller.workerID}
	hand := func(i int) protocol.StreamChannelRef {
		w, r, err := te.CreateOwnedChannel(from, MaxChannelsPerAdapter)
		assert.NilError(t, err)
		wr, err := te.OpenChannelWriter(w)
		assert.NilError(t, err)
		body := fmt.Sprint("file ", i)
		_, err = wr.Write([]byte(body))
		assert.NilError(t, err)
		assert.NilError(t, wr.Close())
		assert.NilError(t, te.ChargeReplyChannels(from, call, mustJSON(t, map[string]any{"content": r, "body": body})))
		return r
	}
	refs := make([]protocol.StreamChannelRef, MaxChannelsPerConnection)
	for i := range refs {
		refs[i] = hand(i)
	}

	type outcome struct {
		opened, refused int
		bad             []string
	}
	done := make(chan outcome)
	go func() {
		var o outcome
		for i, r := range refs {
			rd, err := te.OpenChannelReader(r)
			if err != nil {
				if errors.Is(err, ErrChannelNotFound) || errors.Is(err, ErrChannelEndTaken) {
					o.refused++
				} else {
					o.bad = append(o.bad, fmt.Sprintf("open %d: %v", i, err))
				}
				continue
			}
			o.opened++
			b, err := io.ReadAll(rd)
			if err != nil || string(b) != fmt.Sprint("file ", i) {
				o.bad = append(o.bad, fmt.Sprintf("read %d: %q, %v", i, b, err))
			}
			_ = rd.Close()
		}
		done <- o
	}()
	for i := range extra {
		hand(MaxChannelsPerConnection + i)
		if n := te.OwnedChannels(caller.workerID); n > MaxChannelsPerConnection {
			t.Fatalf("after hand-over %d the connection holds %d channels", i+1, n)
		}
	}
	o := <-done
	assert.Check(t, is.Len(o.bad, 0), "%v", o.bad)
	assert.Check(t, is.Equal(o.opened+o.refused, MaxChannelsPerConnection))
	t.Logf("readers opened %d, found %d evicted", o.opened, o.refused)
}
