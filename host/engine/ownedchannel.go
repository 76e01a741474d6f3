package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/iii-sandbox/iii/protocol"
)

// MaxChannelsPerAdapter caps the channels one adapter process holds
// through its channel service: those it made for a reply still on its way
// (ChargeReplyChannels then hands each to the caller's connection), and
// those whose caller has no connection (the engine itself, an in-process
// worker), until read or swept at the channel's TTL. An adapter, or
// callers driving one, cannot grow the engine's channel table without
// bound. Four times a worker connection's share: it is shared by every
// call in flight and every in-process caller.
const MaxChannelsPerAdapter = 4 * MaxChannelsPerConnection

// AdapterChannelOwner is the owner the plugin host creates adapter's
// channels under in namespace, and the one the sandbox router names when
// it hands a reply's channels to its caller. Worker ids are UUIDs, so the
// form cannot name a worker connection.
func AdapterChannelOwner(namespace, adapter string) string {
	return "adapter:" + namespace + "/" + adapter
}

// CreateOwnedChannel makes a channel counted against owner, failing with
// a limit error once owner holds limit channels or the engine holds
// MaxChannels. owner names a holder that is not a worker connection (an
// adapter process: AdapterChannelOwner).
func (e *Engine) CreateOwnedChannel(owner string, limit int) (writer, reader protocol.StreamChannelRef, err error) {
	t := &e.channels
	t.mu.Lock()
	held, all := t.byOwner[owner], len(t.m)
	t.mu.Unlock()
	switch {
	case held >= limit:
		return writer, reader, fmt.Errorf("%s: %s holds %d channels, its limit; callers must read or drop the streams they asked for", CodeLimitExceeded, owner, limit)
	case all >= MaxChannels:
		return writer, reader, fmt.Errorf("%s: the engine holds %d channels, its limit", CodeLimitExceeded, MaxChannels)
	}
	// Checked, then made, not under one lock: concurrent creations can
	// pass the bound by as many as run at once, which the adapter's own
	// concurrency bounds.
	writer, reader = t.create(e, 0, owner).refs()
	return writer, reader, nil
}

// OwnedChannels is the number of live channels owner holds: a worker
// connection's (by its worker id) or an adapter's (AdapterChannelOwner).
func (e *Engine) OwnedChannels(owner string) int { return e.channels.owned(owner) }

// ChargeReplyChannels hands the channels that from holds and reply names
// to the caller of call, as if that caller had created them: counted
// against its connection's MaxChannelsPerConnection (unless it holds the
// engine token, whose own creations are not bounded either) and removed
// when it disconnects. Without it, an adapter's channels (one per
// fs::read) count against the adapter's share, which one caller who
// never reads its streams fills for every other caller of the adapter.
//
// Only channels still owned by from, and named with their access key,
// move: an adapter cannot make the engine give the caller a channel some
// connection made, nor one it only knows the id of. A reply names its
// channels as top-level fields (fs::read's content); refs nested deeper
// stay with from.
//
// A caller without a connection (the engine itself, an in-process worker,
// a call config.yaml set up) leaves the channels with from. When the
// caller is at its share, or its connection is gone, the channels are
// removed (the adapter's writer sees its reader gone) and the error says
// why: LIMIT_EXCEEDED, naming the caller's share, for the former.
func (e *Engine) ChargeReplyChannels(from string, call *Call, reply json.RawMessage) error {
	if call == nil || call.CallerWorkerID == "" || e.channels.owned(from) == 0 {
		return nil
	}
	refs := replyChannelRefs(reply)
	if len(refs) == 0 {
		return nil
	}
	w := e.lookupWorker(call.CallerWorkerID)
	switch {
	case w != nil && w.conn == nil:
		return nil // in-process
	case w == nil && call.CallerAdmin:
		// Not a worker id (a call config.yaml set up), or an admin
		// connection already gone: nobody to charge.
		return nil
	}
	return e.channels.transfer(from, call.CallerWorkerID, w, call.CallerAdmin, refs)
}

// transfer moves the channels of refs that from holds to connection w (id;
// nil when gone), all or none.
func (t *channelTable) transfer(from, id string, w *worker, unbounded bool, refs []protocol.StreamChannelRef) error {
	t.mu.Lock()
	moving := make([]*channel, 0, len(refs))
	for _, r := range refs {
		c := t.m[r.ChannelID]
		if c == nil || c.owner != from || !c.keyMatches(r.AccessKey) || slices.Contains(moving, c) {
			continue
		}
		moving = append(moving, c)
	}
	var err error
	switch {
	case len(moving) == 0:
		t.mu.Unlock()
		return nil
	case w == nil || w.closing.Load():
		// Checked under t.mu: teardown marks the worker closing before it
		// removes the connection's channels (under t.mu), so a channel
		// either moves before that removal, which then takes it, or is
		// dropped here.
		err = fmt.Errorf("connection %s, which asked for the channel, is gone", id)
	case !unbounded && t.byOwner[id]+len(moving) > MaxChannelsPerConnection:
		err = fmt.Errorf("%s: the calling connection holds %d channels; its share is %d (the count its own engine::channels::create uses too): this caller must read or drop (engine::channels::drop) the streams it asked for; other callers are not held up by it", CodeLimitExceeded, t.byOwner[id], MaxChannelsPerConnection)
	}
	if err != nil {
		for _, c := range moving {
			t.forget(c)
		}
		t.mu.Unlock()
		for _, c := range moving {
			c.kill()
		}
		return err
	}
	for _, c := range moving {
		t.uncount(c.owner)
		c.owner = id
		t.byOwner[id]++
	}
	t.mu.Unlock()
	return nil
}

// replyChannelRefs is the channel refs among the top-level fields of the
// JSON object reply: fields whose value is an object with a channel_id
// and an access_key. A reply can carry a file of up to a megabyte inline
// (fs::read's body); decoding it with encoding/json cost about 6 ms a
// megabyte, so the fields are found by a scan that skips strings with
// IndexByte, and only object values are decoded. Malformed JSON yields
// what was found before the fault.
func replyChannelRefs(reply []byte) []protocol.StreamChannelRef {
	if !bytes.Contains(reply, []byte(`"channel_id"`)) {
		return nil
	}
	var refs []protocol.StreamChannelRef
	i := skipSpace(reply, 0)
	if i >= len(reply) || reply[i] != '{' {
		return nil
	}
	i++
	for {
		i = skipSpace(reply, i)
		if i >= len(reply) || reply[i] != '"' {
			return refs // '}' or a fault
		}
		if i = skipString(reply, i); i < 0 {
			return refs
		}
		i = skipSpace(reply, i)
		if i >= len(reply) || reply[i] != ':' {
			return refs
		}
		start := skipSpace(reply, i+1)
		end := skipValue(reply, start)
		if end < 0 {
			return refs
		}
		if reply[start] == '{' {
			var r protocol.StreamChannelRef
			if json.Unmarshal(reply[start:end], &r) == nil && r.ChannelID != "" && r.AccessKey != "" {
				refs = append(refs, r)
			}
		}
		i = skipSpace(reply, end)
		if i >= len(reply) || reply[i] != ',' {
			return refs
		}
		i++
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] ('"'),
// or -1 when it does not end.
func skipString(b []byte, i int) int {
	for j := i + 1; j < len(b); {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		q := j + k
		bs := 0
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			bs++
		}
		if bs%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
	return -1
}

// skipValue returns the index after the value starting at b[i], or -1 when
// it does not end (or b has none there). It finds the value's end, it does
// not validate it: what is decoded is checked by encoding/json.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				if j = skipString(b, j); j < 0 {
					return -1
				}
				j-- // the loop's j++ steps past the quote
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	if j == i {
		return -1
	}
	return j
}
