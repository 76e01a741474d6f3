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
// A channel whose whole stream the reply also carries inline (fs::read's
// content beside a string body, contract.FsReadResponse) is
// inline-delivered: the caller has its content already, and most callers
// never open it. Such channels still count, but one the caller has not
// opened gives way, oldest first, to whatever the caller needs its share
// for (evictInline), so that a caller reading many small files is never
// refused for them.
//
// A caller without a connection (the engine itself, an in-process worker,
// a call config.yaml set up) leaves the channels with from. When the
// caller is at its share with nothing inline-delivered to give way, or
// its connection is gone, the channels are removed (the adapter's writer
// sees its reader gone) and the error says why: LIMIT_EXCEEDED, naming
// the caller's share, for the former.
func (e *Engine) ChargeReplyChannels(from string, call *Call, reply json.RawMessage) error {
	if call == nil || call.CallerWorkerID == "" || e.channels.owned(from) == 0 {
		return nil
	}
	rr := replyChannelRefs(reply)
	if len(rr.refs) == 0 {
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
	return e.channels.transfer(from, call.CallerWorkerID, w, call.CallerAdmin, rr)
}

// transfer moves the channels of rr that from holds to connection w (id;
// nil when gone), all or none, making room within its share by evicting
// its inline-delivered channels when it must.
func (t *channelTable) transfer(from, id string, w *worker, unbounded bool, rr replyRefs) error {
	t.mu.Lock()
	moving := make([]*channel, 0, len(rr.refs))
	var inline *channel
	for i, r := range rr.refs {
		c := t.m[r.ChannelID]
		if c == nil || c.owner != from || !c.keyMatches(r.AccessKey) {
			continue
		}
		if i == rr.inline {
			inline = c
		}
		if !slices.Contains(moving, c) {
			moving = append(moving, c)
		}
	}
	var err error
	var evicted []*channel
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
	case !unbounded:
		// Under the same hold of t.mu as the move: the count never passes
		// the share, not even between the eviction and the move.
		evicted = t.evictInline(id, t.byOwner[id]+len(moving)-MaxChannelsPerConnection)
		if t.byOwner[id]+len(moving) > MaxChannelsPerConnection {
			err = fmt.Errorf("%s: the calling connection holds %d channels; its share is %d (the count its own engine::channels::create uses too), and none of them is an unopened stream whose content came inline (fs::read's body), which would give way: this caller must read or drop (engine::channels::drop) the streams it asked for; other callers are not held up by it", CodeLimitExceeded, t.byOwner[id], MaxChannelsPerConnection)
		}
	}
	if err != nil {
		for _, c := range moving {
			t.forget(c)
		}
		t.mu.Unlock()
		killAll(evicted)
		killAll(moving)
		return err
	}
	for _, c := range moving {
		t.uncount(c.owner)
		c.owner = id
		t.byOwner[id]++
	}
	if inline != nil && !unbounded {
		t.queueInline(id, inline)
	}
	t.mu.Unlock()
	killAll(evicted)
	return nil
}

func killAll(cs []*channel) {
	for _, c := range cs {
		c.kill()
	}
}

// queueInline records c, just handed to connection owner, as
// inline-delivered: evictInline may drop it while no reader has opened
// it. t.mu is held.
//
// The queue is pruned lazily: channels that finish, are dropped or are
// opened stay in it until evictInline passes them or it grows to twice
// the share, when what is left of it is compacted (at most the share
// stays: the queue is the connection's own channels). So it holds at most
// 2*MaxChannelsPerConnection pointers a connection, however many files
// the caller reads and finishes without ever reaching its share.
func (t *channelTable) queueInline(owner string, c *channel) {
	q := append(t.inlineOf[owner], c)
	if len(q) >= 2*MaxChannelsPerConnection {
		q = slices.DeleteFunc(q, func(c *channel) bool { return !t.evictable(owner, c) })
	}
	t.inlineOf[owner] = q
}

// evictable reports whether c, from owner's inline queue, may still be
// evicted: it is owner's, in the table, and no reader has taken its read
// end. t.mu is held.
func (t *channelTable) evictable(owner string, c *channel) bool {
	return t.m[c.id] == c && c.owner == owner && !c.readerTaken.Load()
}

// evictInline takes need of connection owner's inline-delivered channels
// that no reader has opened off the table, oldest handed over first, and
// returns them for the caller to kill once t.mu is released (the
// adapter's writer then sees ErrChannelClosed, and what it buffered is
// let go). It takes none when fewer than need are there: an eviction
// that cannot make room would only lose streams (only a reader opening
// one of them between the count and the eviction leaves it short).
// t.mu is held.
//
// The read end is taken here (readerTaken) before the channel leaves the
// table, so a reader that found the channel just before cannot take it
// after: it is either opened, and stays, or evicted, never both.
func (t *channelTable) evictInline(owner string, need int) []*channel {
	if need <= 0 {
		return nil
	}
	q := t.inlineOf[owner]
	avail := 0
	for _, c := range q {
		if t.evictable(owner, c) {
			if avail++; avail == need {
				break
			}
		}
	}
	if avail < need {
		return nil
	}
	var gone []*channel
	i := 0
	for ; i < len(q) && len(gone) < need; i++ {
		c := q[i]
		if !t.evictable(owner, c) || !c.readerTaken.CompareAndSwap(false, true) {
			continue // gone, or opened since: never evictable again
		}
		t.forget(c)
		gone = append(gone, c)
	}
	clear(q[:i]) // let go of the passed channels now
	if q = q[i:]; len(q) == 0 {
		delete(t.inlineOf, owner)
	} else {
		t.inlineOf[owner] = q
	}
	return gone
}

// roomFor reports whether connection owner may hold n more channels
// within its share, evicting its inline-delivered channels to make room
// when it must (as a reply's hand-over does): engine::channels::create
// and a minted channel's first open use it.
func (t *channelTable) roomFor(owner string, n int) bool {
	t.mu.Lock()
	gone := t.evictInline(owner, t.byOwner[owner]+n-MaxChannelsPerConnection)
	ok := t.byOwner[owner]+n <= MaxChannelsPerConnection
	t.mu.Unlock()
	killAll(gone)
	return ok
}

// replyRefs is what ChargeReplyChannels reads from a reply.
type replyRefs struct {
	refs []protocol.StreamChannelRef
	// inline is the index in refs of the channel whose whole stream the
	// reply also carries inline: the ref of top-level "content" when
	// top-level "body" is a string (contract.FsReadResponse); -1 when
	// none. A key named twice means its last value, as in encoding/json
	// and JSON.parse.
	inline int
}

// replyChannelRefs is the channel refs among the top-level fields of the
// JSON object reply (fields whose value is an object with a channel_id
// and an access_key), and which one the reply inlines. A reply can carry
// a file of up to a megabyte inline (fs::read's body); decoding it with
// encoding/json cost about 6 ms a megabyte, so the fields are found by a
// scan that skips strings with IndexByte, and only object values are
// decoded. (Not protocol.ObjectMembers: it validates every string and
// stops at every escape, and on a megabyte of source code it took 1.2 ms
// against this scan's 0.25 ms, measured 2026-12-03.) Malformed JSON
// yields the refs found before the fault and,
// where the scan sees the fault, no inline one (it does not validate the
// values it skips: the caller cannot decode such a reply anyway).
func replyChannelRefs(reply []byte) replyRefs {
	rr := replyRefs{inline: -1}
	if !bytes.Contains(reply, []byte(`"channel_id"`)) {
		return rr
	}
	i := skipSpace(reply, 0)
	if i >= len(reply) || reply[i] != '{' {
		return rr
	}
	content, body := -1, false
	i++
	for first := true; ; first = false {
		i = skipSpace(reply, i)
		if first && i < len(reply) && reply[i] == '}' {
			return rr
		}
		if i >= len(reply) || reply[i] != '"' {
			return rr // a fault
		}
		key := i
		if i = skipString(reply, i); i < 0 {
			return rr
		}
		q := reply[key:i]
		i = skipSpace(reply, i)
		if i >= len(reply) || reply[i] != ':' {
			return rr
		}
		start := skipSpace(reply, i+1)
		end := skipValue(reply, start)
		if end < 0 {
			return rr
		}
		isRef := false
		if reply[start] == '{' {
			var r protocol.StreamChannelRef
			if json.Unmarshal(reply[start:end], &r) == nil && r.ChannelID != "" && r.AccessKey != "" {
				rr.refs = append(rr.refs, r)
				isRef = true
			}
		}
		switch {
		case keyIs(q, "content"):
			content = -1
			if isRef {
				content = len(rr.refs) - 1
			}
		case keyIs(q, "body"):
			body = reply[start] == '"'
		}
		i = skipSpace(reply, end)
		switch {
		case i < len(reply) && reply[i] == ',':
			i++
		case i < len(reply) && reply[i] == '}':
			if body && skipSpace(reply, i+1) == len(reply) {
				rr.inline = content
			}
			return rr
		default:
			return rr // a fault
		}
	}
}

// keyIs reports whether the object key q (quoted, as in the reply) is
// name; it decodes q only when q has escapes, so the common case
// allocates nothing.
func keyIs(q []byte, name string) bool {
	if bytes.IndexByte(q, '\\') < 0 {
		return string(q[1:len(q)-1]) == name
	}
	var s string
	return json.Unmarshal(q, &s) == nil && s == name
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
