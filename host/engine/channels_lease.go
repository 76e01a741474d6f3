package engine

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/protocol"
)

// Leased channels. The http worker gives every request two channels
// (request_body, response) and most functions open neither: creating and
// dropping them through engine::channels::create / drop cost each request
// its share of two calls, two table entries and a round trip before the
// function could be called. A connection instead leases an id prefix and a
// secret once (engine::channels::lease) and mints refs itself
// (protocol.AppendMintedID, protocol.MintKeyer). The engine learns of a
// minted channel when one of its ends is first opened: the ref is checked
// against the lease, and only then does the channel get its table entry,
// owned by the lease's connection and counted against its
// MaxChannelsPerConnection like a created one.
//
// What keeps minted refs as safe as created ones:
//   - a key is HMAC(secret, direction, id): unguessable, and a reader's ref
//     cannot open the writer end; a ref under another connection's lease id
//     fails that lease's check;
//   - the lease dies with its connection (channelTable.removeOwned), and
//     with it every ref minted under it and every channel made from one;
//   - each minted id makes a channel at most once: the counters of those
//     made are kept (used) until the holder retires them, so a finished
//     channel's ref opens nothing; the holder retires the counters of
//     requests that ended (engine::channels::watch: every counter under
//     retire_below but those of requests still in flight, listed in
//     except), which also removes what is left of their channels, as a
//     drop would. A retired counter stays retired;
//   - a channel is made only within the connection's channel bound and the
//     engine's, and a lease keeps at most maxLeaseUsed counters unretired.
//
// A channel minted "served" (the id's "s") is one whose writer end the
// holder serves on demand (the http worker's request_body): when its reader
// opens it, the holder is told through engine::channels::watch, a call it
// keeps waiting while it has requests in flight, and writes the content
// then. Nothing is sent for a channel nobody opens.

// Builtin ids of leased channels.
const (
	FnChannelsLease = "engine::channels::lease"
	FnChannelsWatch = "engine::channels::watch"
)

const (
	// maxLeaseUsed bounds the counters a lease keeps (made, not retired):
	// past it, first opens are refused until the holder retires some.
	maxLeaseUsed = 16 * MaxChannelsPerConnection
	// maxLeaseEvents bounds the served channels waiting to be reported:
	// each is a counter made (used), so as many as those may wait.
	maxLeaseEvents = maxLeaseUsed
	// maxWatchExcept bounds the counters one watch call keeps live under
	// retire_below (the http worker's requests in flight).
	maxWatchExcept = 4096
	// maxWatchWait bounds one engine::channels::watch call's wait.
	maxWatchWait   = 30 * time.Second
	leaseSecretLen = 32
)

type channelLease struct {
	id     string // protocol.MintLeaseIDLen hex digits
	owner  string // the worker id of the connection holding it
	secret []byte
	keys   *protocol.MintKeyer

	mu   sync.Mutex
	gone bool // its connection ended
	// A counter is live (its refs may make a channel) when it is at or
	// above below, or in except: retired ones are neither.
	below  uint64
	except map[uint64]struct{}
	// used is every live counter whose channel was made, with that
	// channel's id.
	used   map[uint64]string
	events []string      // served channels whose reader opened, not yet reported
	wake   chan struct{} // cap 1: an event was added
}

// lease returns owner's lease, making it on first use.
func (t *channelTable) lease(owner string) *channelLease {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.leaseOf[owner]; l != nil {
		return l
	}
	var raw [protocol.MintLeaseIDLen / 2]byte
	_, _ = rand.Read(raw[:])
	secret := make([]byte, leaseSecretLen)
	_, _ = rand.Read(secret)
	l := &channelLease{id: hex.EncodeToString(raw[:]), owner: owner, secret: secret,
		keys: protocol.NewMintKeyer(secret), used: map[uint64]string{}, wake: make(chan struct{}, 1)}
	t.leases[l.id] = l
	t.leaseOf[owner] = l
	return l
}

// dropLease forgets owner's lease: its refs open nothing from now on. The
// channels made from them are owner's and go with its other channels, which
// the caller removes after this (a first open that got in before the lease
// was marked gone made its entry already, so that removal sees it).
func (t *channelTable) dropLease(owner string) {
	t.mu.Lock()
	l := t.leaseOf[owner]
	if l != nil {
		delete(t.leaseOf, owner)
		delete(t.leases, l.id)
	}
	t.mu.Unlock()
	if l == nil {
		return
	}
	// Not under t.mu: materialise takes l.mu, then t.mu.
	l.mu.Lock()
	l.gone = true
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}: // a watch waiting ends
	default:
	}
}

// errChannelLimit refuses a first open past a bound.
type errChannelLimit struct{ msg string }

func (e *errChannelLimit) Error() string { return e.msg }

// materialise makes the channel of a minted ref on the first open of one of
// its ends: nil (and no error) when the ref is not a valid, live minted ref
// for dir, or when its channel was made before and is gone; an
// *errChannelLimit when a bound refuses it.
func (t *channelTable) materialise(e *Engine, id, key, dir string) (*channel, error) {
	m, ok := protocol.ParseMintedID(id)
	if !ok {
		return nil, nil
	}
	t.mu.Lock()
	l := t.leases[m.Lease]
	t.mu.Unlock()
	if l == nil || len(key) != protocol.MintKeyLen {
		return nil, nil
	}
	wkey, rkey := l.keys.Key(id, protocol.DirectionWrite), l.keys.Key(id, protocol.DirectionRead)
	want := wkey
	if dir == protocol.DirectionRead {
		want = rkey
	}
	if subtle.ConstantTimeCompare([]byte(key), []byte(want)) != 1 {
		return nil, nil
	}
	// Under l.mu from the check of used to the table entry: the other end
	// opening at once finds the one channel, and a retire or the lease's
	// end cannot pass between.
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gone || !l.live(m.Counter) {
		return nil, nil
	}
	if _, made := l.used[m.Counter]; made {
		// The other end made it meanwhile (nil once it finished or was
		// removed); the key was checked above.
		return t.get(id), nil
	}
	if len(l.used) >= maxLeaseUsed {
		return nil, &errChannelLimit{fmt.Sprintf("the channel lease of connection %s holds %d unretired channels, its limit", l.owner, maxLeaseUsed)}
	}
	t.mu.Lock()
	if len(t.m) >= MaxChannels {
		t.mu.Unlock()
		return nil, &errChannelLimit{fmt.Sprintf("the engine holds %d channels, its limit", MaxChannels)}
	}
	// Streams whose content the connection had inline (fs::read's body)
	// and never opened give way first.
	evicted := t.evictInline(l.owner, t.byOwner[l.owner]+1-MaxChannelsPerConnection)
	if t.byOwner[l.owner] >= MaxChannelsPerConnection {
		t.mu.Unlock()
		return nil, &errChannelLimit{fmt.Sprintf("connection %s holds %d channels, its limit", l.owner, MaxChannelsPerConnection)}
	}
	c := &channel{id: id, key: wkey, rkey: rkey, owner: l.owner, created: time.Now(),
		size: defaultChannelBuffer, budget: e.inbound.chanBytes}
	t.m[id] = c
	t.byOwner[l.owner]++
	t.mu.Unlock()
	killAll(evicted) // nil when refused: an eviction happens only when it makes room
	l.used[m.Counter] = id
	if m.Served && dir == protocol.DirectionRead && len(l.events) < maxLeaseEvents {
		l.events = append(l.events, id)
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	return c, nil
}

// live reports whether counter n is not retired; l.mu is held.
func (l *channelLease) live(n uint64) bool {
	if n >= l.below {
		return true
	}
	_, ok := l.except[n]
	return ok
}

// retire ends every counter under below but those in except (and those
// retired already stay so): their refs open nothing from now on, and what
// is left of the channels made from them is removed, as
// engine::channels::drop would.
func (t *channelTable) retire(l *channelLease, below uint64, except []uint64) {
	declared := make(map[uint64]struct{}, len(except))
	for _, n := range except {
		declared[n] = struct{}{}
	}
	// Live from now on: live before, and declared live now.
	declaredLive := func(n uint64) bool {
		_, ok := declared[n]
		return ok || n >= below
	}
	l.mu.Lock()
	mark := max(l.below, below)
	keep := make(map[uint64]struct{}, len(except))
	for n := range declared {
		if n < mark && l.live(n) {
			keep[n] = struct{}{}
		}
	}
	for n := range l.except {
		if n < mark && declaredLive(n) {
			keep[n] = struct{}{}
		}
	}
	l.below, l.except = mark, keep
	var gone []string
	for n, id := range l.used {
		if !l.live(n) {
			gone = append(gone, id)
			delete(l.used, n)
		}
	}
	l.mu.Unlock()
	for _, id := range gone {
		if c := t.get(id); c != nil {
			t.remove(c)
		}
	}
}

// takeEvents waits up to wait for served channels opened by their readers
// and returns them (none when the wait ran out, ctx ended or the lease did).
func (l *channelLease) takeEvents(ctx context.Context, wait time.Duration) []string {
	var timer *time.Timer
	for {
		l.mu.Lock()
		ev, gone := l.events, l.gone
		l.events = nil
		l.mu.Unlock()
		if len(ev) > 0 || gone || wait <= 0 {
			if timer != nil {
				timer.Stop()
			}
			return ev
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		}
		select {
		case <-l.wake:
		case <-timer.C:
			wait = 0
		case <-ctx.Done():
			timer.Stop()
			return nil
		}
	}
}

// ── engine::channels::lease ───────────────────────────────────────────────

// fnChannelsLease hands the calling connection its channel lease ({} →
// {lease_id, secret}; the same one on every call while the connection
// lasts). Only a connection has one: it is what bounds the lease's life.
func (e *Engine) fnChannelsLease(_ context.Context, call *Call) (any, *protocol.ErrorBody) {
	if call.CallerWorkerID == "" {
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "a channel lease belongs to a worker connection; in-process callers create channels (engine::channels::create)"}
	}
	l := e.channels.lease(call.CallerWorkerID)
	out := make([]byte, 0, 96)
	out = append(out, `{"lease_id":"`...)
	out = append(out, l.id...)
	out = append(out, `","secret":"`...)
	out = base64.StdEncoding.AppendEncode(out, l.secret)
	out = append(out, `"}`...)
	return json.RawMessage(out), nil
}

// ── engine::channels::watch ───────────────────────────────────────────────

// fnChannelsWatch serves the holder of a lease ({retire_below, except,
// wait_ms} → {opened: [channel_id, …]}): it first retires the counters
// under retire_below but those in except, then answers the served channels whose reader opened since
// the last call, waiting up to wait_ms (at most maxWatchWait) for one. The
// http worker keeps one such call waiting while it has requests in flight.
func (e *Engine) fnChannelsWatch(ctx context.Context, call *Call) (any, *protocol.ErrorBody) {
	var in struct {
		RetireBelow *uint64  `json:"retire_below"`
		Except      []uint64 `json:"except"`
		WaitMS      int64    `json:"wait_ms"`
	}
	if errb := decodeInput(call.Data, &in); errb != nil {
		return nil, errb
	}
	if in.WaitMS < 0 {
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "wait_ms must be 0 or more"}
	}
	if len(in.Except) > maxWatchExcept {
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: fmt.Sprintf("except names at most %d counters", maxWatchExcept)}
	}
	if in.Except != nil && in.RetireBelow == nil {
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "except needs retire_below"}
	}
	e.channels.mu.Lock()
	l := e.channels.leaseOf[call.CallerWorkerID]
	e.channels.mu.Unlock()
	if l == nil || call.CallerWorkerID == "" {
		return nil, &protocol.ErrorBody{Code: CodeNotFound, Message: "this connection holds no channel lease (engine::channels::lease)"}
	}
	if in.RetireBelow != nil {
		e.channels.retire(l, *in.RetireBelow, in.Except)
	}
	wait := min(time.Duration(in.WaitMS)*time.Millisecond, maxWatchWait)
	ev := l.takeEvents(ctx, wait)
	out := make([]byte, 0, 16+len(ev)*(protocol.MintLeaseIDLen+24))
	out = append(out, `{"opened":[`...)
	for i, id := range ev {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendQuote(out, id)
	}
	out = append(out, "]}"...)
	return json.RawMessage(out), nil
}

const schemaChannelsLeaseIn = `{"type":"object"}`

const schemaChannelsLeaseOut = `{"type":"object","required":["lease_id","secret"],"properties":{` +
	`"lease_id":{"type":"string","description":"24 hex digits: a minted channel id is m<lease_id>-<counter in hex>, with s appended when the holder serves its writer end on demand."},` +
	`"secret":{"type":"string","description":"32 bytes, base64: an end's access key is the first 16 bytes of HMAC-SHA256(secret, direction NUL channel_id), in hex."}}}`

const schemaChannelsWatchIn = `{"type":"object","properties":{` +
	`"retire_below":{"type":"integer","minimum":0,"description":"Counters under it are retired (but those in except): their refs open nothing, and what is left of their channels is removed. A retired counter stays retired."},` +
	`"except":{"type":"array","maxItems":4096,"items":{"type":"integer","minimum":0},"description":"Counters under retire_below that stay live (requests still in flight)."},` +
	`"wait_ms":{"type":"integer","minimum":0,"description":"How long to wait for an opened served channel (at most 30000)."}}}`

const schemaChannelsWatchOut = `{"type":"object","required":["opened"],"properties":{` +
	`"opened":{"type":"array","items":{"type":"string"},"description":"Ids of served channels whose reader opened since the last call: the holder writes their content through the writer end."}}}`
