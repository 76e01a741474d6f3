package engine

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sync/semaphore"

	"github.com/iii-sandbox/iii/protocol"
)

const (
	defaultChannelBuffer = 64
	maxChannelBuffer     = 1024
)

// Bounds of one engine::channels::create or drop call.
const (
	// MaxChannelBatch is the most channels one create call makes.
	MaxChannelBatch = 16
	// MaxChannelDropBatch is the most refs one drop call names (a
	// connection holds at most MaxChannelsPerConnection anyway).
	MaxChannelDropBatch = MaxChannelsPerConnection
	// MaxChannelPrefill is the most content a channel is created with: one
	// item, as large as the SDKs' channel writers' pieces. Larger payloads
	// go through the writer socket, piece by piece, with its back-pressure.
	MaxChannelPrefill = 64 << 10
)

// channelSpec is one channel of a create call with channels: [...].
type channelSpec struct {
	BufferSize *int `json:"buffer_size"`
	// Content, base64 (standard, padded), is the channel's whole stream;
	// absent: the writer end is the caller's to open as usual.
	Content *string `json:"content"`
}

// decodeContent is the spec's content, nil when it has none ("" is an
// empty stream: the reader gets its end at once).
func (sp channelSpec) decodeContent() ([]byte, *protocol.ErrorBody) {
	if sp.Content == nil {
		return nil, nil
	}
	if base64.StdEncoding.DecodedLen(len(*sp.Content)) > MaxChannelPrefill+2 {
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: fmt.Sprintf("a channel's content is at most %d bytes; write more through its writer end", MaxChannelPrefill)}
	}
	b, err := base64.StdEncoding.DecodeString(*sp.Content)
	if err != nil {
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "a channel's content must be base64: " + err.Error()}
	}
	if len(b) > MaxChannelPrefill {
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: fmt.Sprintf("a channel's content is at most %d bytes; write more through its writer end", MaxChannelPrefill)}
	}
	return b, nil
}

// chanItem is one relayed message, text or binary, kept as sent.
type chanItem struct {
	typ  websocket.MessageType
	data []byte
	cost int64 // what it holds of the channel's room; released when taken
	// charge is what it holds of the engine-wide ChannelBytesTotal;
	// released when taken or when the channel is removed.
	charge int64
}

// channel is a one-way stream between a writer socket and a reader socket
// (spec/engine-internals.md §1.9). Each end can be taken once.
//
// A channel is created small: its refs, owner, size and (when created with
// content) that content; its buffer, room and context are made when an end
// is first opened (open). Most channels the http worker creates are never
// opened (a function that answers with a value uses neither its request's
// request_body nor its response channel), and those then cost the engine a
// table entry until they are dropped, not a 64-item buffer, a semaphore and
// a context registered with the engine's.
type channel struct {
	id, key string
	// rkey is a minted channel's read-end key (channels_lease.go); key is
	// then its write end's. "": one key opens either end.
	rkey string
	// owner is the worker id whose disconnect removes it ("" = none), or
	// an adapter's (AdapterChannelOwner); read and changed (a reply's
	// channel handed to its caller, ChargeReplyChannels) under the
	// table's mu.
	owner   string
	created time.Time
	size    int // items the buffer holds once open
	// budget is the engine's ChannelBytesTotal, which every message
	// counts against from its first byte read until it is written out.
	budget *semaphore.Weighted

	mu      sync.Mutex // guards materialising against removal
	opened  bool       // under mu: items, room, ctx and cancel are set
	removed bool       // under mu
	// Content a channel was created with, held (and charged to budget)
	// until open puts it in the buffer; filled says there is one.
	filled  bool
	content []byte
	charge  int64

	// Set once by open (under mu) and never changed after: whoever opened
	// an end reads them freely.
	items     chan chanItem
	closeOnce sync.Once // closes items: the writer is done
	// room is the byte budget of items (ChannelBufferBytes): a writer
	// ahead of its reader waits for it.
	room   *semaphore.Weighted
	ctx    context.Context // ends when the channel is removed
	cancel context.CancelFunc

	writerTaken atomic.Bool
	readerTaken atomic.Bool
	writerDone  atomic.Bool
	readerDone  atomic.Bool
}

// keyFor is the key that opens the dir end.
func (c *channel) keyFor(dir string) string {
	if c.rkey != "" && dir == protocol.DirectionRead {
		return c.rkey
	}
	return c.key
}

// keyMatches reports whether key opens either end (what a drop needs).
func (c *channel) keyMatches(key string) bool {
	ok := subtle.ConstantTimeCompare([]byte(key), []byte(c.key)) == 1
	if c.rkey != "" {
		ok = subtle.ConstantTimeCompare([]byte(key), []byte(c.rkey)) == 1 || ok
	}
	return ok
}

func (c *channel) refs() (writer, reader protocol.StreamChannelRef) {
	return protocol.StreamChannelRef{ChannelID: c.id, AccessKey: c.key, Direction: protocol.DirectionWrite},
		protocol.StreamChannelRef{ChannelID: c.id, AccessKey: c.key, Direction: protocol.DirectionRead}
}

func (c *channel) endWriting() { c.closeOnce.Do(func() { close(c.items) }) }

// open makes the channel's buffer, room and context, once, when an end is
// first taken (after its key was checked): a channel created with content
// gets it as its one item and its end. A channel removed before its first
// open is opened already ended, so whoever took the end sees it removed.
func (c *channel) open(parent context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.opened {
		return
	}
	c.opened = true
	c.ctx, c.cancel = context.WithCancel(parent)
	c.items = make(chan chanItem, c.size)
	c.room = semaphore.NewWeighted(ChannelBufferBytes)
	if c.removed {
		c.cancel()
		return
	}
	if c.filled {
		if len(c.content) > 0 {
			cost := itemCost(c.content)
			c.room.TryAcquire(cost) // a new channel has its whole room
			c.items <- chanItem{typ: websocket.MessageBinary, data: c.content, cost: cost, charge: c.charge}
		}
		c.content, c.charge = nil, 0
		c.endWriting()
	}
}

// kill ends a channel being removed: an opened one's context (its ends
// close as going away) and buffer, or the content an unopened one holds.
func (c *channel) kill() {
	c.mu.Lock()
	c.removed = true
	opened, charge := c.opened, c.charge
	c.content, c.charge = nil, 0
	c.mu.Unlock()
	if !opened {
		c.budget.Release(charge)
		return
	}
	c.cancel()
	c.drain()
}

// prefill makes data the whole stream of a channel just created, before
// its refs leave the engine: its writer end is taken and done, as if a
// writer had sent data as one binary item and closed. The item is charged
// as a writer's would be (the engine's ChannelBytesTotal, waiting for it
// within ctx) and released when read or when the channel is removed; it
// enters the buffer when an end is first opened.
func (c *channel) prefill(ctx context.Context, data []byte) error {
	c.writerTaken.Store(true)
	var charge int64
	if len(data) > 0 {
		charge = int64(len(data))
		if !c.budget.TryAcquire(charge) {
			if err := c.budget.Acquire(ctx, charge); err != nil {
				return err
			}
		}
	}
	c.mu.Lock()
	if c.removed || c.opened {
		// Not reachable through the create call (the refs have not left
		// the engine yet); kept so that the charge can never leak.
		c.mu.Unlock()
		c.budget.Release(charge)
		return fmt.Errorf("channel %s: filled after it was opened or removed", c.id)
	}
	c.filled, c.content, c.charge = true, data, charge
	c.mu.Unlock()
	c.writerDone.Store(true)
	return nil
}

type channelTable struct {
	mu sync.Mutex
	m  map[string]*channel
	// byOwner counts each owner's channels in m: create calls check a
	// connection's count against MaxChannelsPerConnection, and the http
	// worker makes one for every few requests.
	byOwner map[string]int
	// inlineOf is, per connection, the channels handed to it whose whole
	// stream their reply carried inline, in the order they were handed
	// over: what evictInline may drop to make room in its share
	// (ownedchannel.go).
	inlineOf map[string][]*channel
	// Channel leases (channels_lease.go), by lease id and by holder.
	leases  map[string]*channelLease
	leaseOf map[string]*channelLease
}

func (t *channelTable) init() {
	t.m = make(map[string]*channel)
	t.byOwner = make(map[string]int)
	t.inlineOf = make(map[string][]*channel)
	t.leases = make(map[string]*channelLease)
	t.leaseOf = make(map[string]*channelLease)
}

func (t *channelTable) create(e *Engine, bufferSize int, owner string) *channel {
	switch {
	case bufferSize <= 0:
		bufferSize = defaultChannelBuffer
	case bufferSize > maxChannelBuffer:
		bufferSize = maxChannelBuffer
	}
	id, key := newIDPair()
	c := &channel{
		id: id, key: key, owner: owner, created: time.Now(),
		size: bufferSize, budget: e.inbound.chanBytes,
	}
	t.mu.Lock()
	t.m[c.id] = c
	if owner != "" {
		t.byOwner[owner]++
	}
	t.mu.Unlock()
	return c
}

// find returns the channel whose dir end key opens: one in the table, or a
// minted one made now (channels_lease.go). nil when there is none (unknown,
// a wrong key, finished); an error when a bound refuses making it. An
// engine-made channel's one key opens either end (dir is checked later).
func (t *channelTable) find(e *Engine, id, key, dir string) (*channel, error) {
	c := t.get(id)
	if c == nil && (dir == protocol.DirectionRead || dir == protocol.DirectionWrite) {
		// A minted ref's channel is made on the first open of an end;
		// materialise checks the key.
		return t.materialise(e, id, key, dir)
	}
	if c == nil || subtle.ConstantTimeCompare([]byte(key), []byte(c.keyFor(dir))) != 1 {
		return nil, nil
	}
	return c, nil
}

func (t *channelTable) get(id string) *channel {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[id]
}

// forget deletes c from the table; t.mu is held.
func (t *channelTable) forget(c *channel) {
	delete(t.m, c.id)
	t.uncount(c.owner)
}

// uncount takes one channel off owner's count; t.mu is held.
func (t *channelTable) uncount(owner string) {
	if owner == "" {
		return
	}
	if n := t.byOwner[owner] - 1; n > 0 {
		t.byOwner[owner] = n
	} else {
		delete(t.byOwner, owner)
	}
}

func (t *channelTable) remove(c *channel) {
	t.mu.Lock()
	if t.m[c.id] == c {
		t.forget(c)
	}
	t.mu.Unlock()
	c.kill()
}

func (t *channelTable) removeWhere(match func(*channel) bool) int {
	t.mu.Lock()
	var gone []*channel
	for _, c := range t.m {
		if match(c) {
			gone = append(gone, c)
		}
	}
	for _, c := range gone {
		t.forget(c)
	}
	t.mu.Unlock()
	for _, c := range gone {
		c.kill()
	}
	return len(gone)
}

// removeOwned ends owner's lease, then removes its channels. Its queue of
// inline-delivered channels goes first: the connection is closing, so no
// hand-over adds to it again (transfer).
func (t *channelTable) removeOwned(owner string) {
	t.dropLease(owner)
	t.mu.Lock()
	delete(t.inlineOf, owner)
	t.mu.Unlock()
	t.removeWhere(func(c *channel) bool { return c.owner == owner })
}

func (t *channelTable) removeAll() {
	t.mu.Lock()
	owners := make([]string, 0, len(t.leaseOf))
	for o := range t.leaseOf {
		owners = append(owners, o)
	}
	t.mu.Unlock()
	for _, o := range owners {
		t.dropLease(o)
	}
	t.mu.Lock()
	clear(t.inlineOf)
	t.mu.Unlock()
	t.removeWhere(func(*channel) bool { return true })
}

func (t *channelTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// sweepChannels removes, every sweep interval, channels older than the TTL
// whose two ends were never both taken: their refs were lost.
func (e *Engine) sweepChannels() {
	tick := time.NewTicker(e.opts.ChannelSweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case now := <-tick.C:
			n := e.channels.removeWhere(func(c *channel) bool {
				return now.Sub(c.created) > e.opts.ChannelTTL && !(c.writerTaken.Load() && c.readerTaken.Load())
			})
			if n > 0 {
				e.log.Debug("swept stale channels", "count", n)
			}
		}
	}
}

func (e *Engine) serveChannel(rw http.ResponseWriter, r *http.Request, ls *listenerState) {
	q := r.URL.Query()
	dir := q.Get("dir")
	c, err := e.channels.find(e, r.PathValue("id"), q.Get("key"), dir)
	if err != nil {
		http.Error(rw, err.Error(), http.StatusTooManyRequests)
		return
	}
	if c == nil {
		http.Error(rw, "channel not found", http.StatusNotFound)
		return
	}
	if dir != protocol.DirectionRead && dir != protocol.DirectionWrite {
		http.Error(rw, "dir must be read or write", http.StatusBadRequest)
		return
	}
	if !e.tasks.Add() {
		http.Error(rw, "engine stopping", http.StatusServiceUnavailable)
		return
	}
	defer e.tasks.Done()
	c.open(e.ctx)

	ws, err := websocket.Accept(rw, r, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(ls.limits.FrameBytes)
	taken := &c.readerTaken
	if dir == protocol.DirectionWrite {
		taken = &c.writerTaken
	}
	if !taken.CompareAndSwap(false, true) {
		_ = ws.Close(statusPolicyViolation, "channel "+dir+" end already taken")
		return
	}
	// Closing the socket is how a removed channel stops a blocked reader
	// or writer. It closes with "going away", so the peer can tell a broken
	// stream from a complete one (which ends with a normal close).
	closed := make(chan struct{})
	stop := context.AfterFunc(c.ctx, func() {
		defer close(closed)
		_ = ws.Close(statusGoingAway, "channel removed")
	})
	defer func() {
		if !stop() {
			<-closed
		}
	}()
	if dir == protocol.DirectionWrite {
		e.channelWriter(c, ws)
	} else {
		e.channelReader(c, ws)
	}
}

// channelWriter relays the writer socket's messages into the buffer until
// the writer closes; a full buffer holds the writer back.
func (e *Engine) channelWriter(c *channel, ws *websocket.Conn) {
	defer func() {
		c.endWriting()
		c.writerDone.Store(true)
		e.finishChannel(c)
	}()
	prev := 0 // the size of the writer's previous message
	for {
		typ, r, err := ws.Reader(context.Background())
		var data []byte
		var charge int64
		if err == nil {
			data, charge, err = e.readChannelMessage(c, ws, r, prev)
			prev = len(data)
		}
		if err != nil {
			if websocket.CloseStatus(err) == -1 {
				_ = ws.CloseNow()
			}
			return
		}
		cost := itemCost(data)
		if err := c.room.Acquire(c.ctx, cost); err != nil {
			c.budget.Release(charge)
			return
		}
		select {
		case c.items <- chanItem{typ: typ, data: data, cost: cost, charge: charge}:
			if c.ctx.Err() != nil {
				c.drain() // removed meanwhile: nobody else will
			}
		case <-c.ctx.Done():
			c.budget.Release(charge)
			return
		}
	}
}

// itemCost is what one message counts against ChannelBufferBytes; a message
// larger than the budget still passes alone.
func itemCost(data []byte) int64 { return min(int64(len(data)), ChannelBufferBytes) }

// channelReader relays buffered items to the reader socket in order, and
// closes it normally once the writer has finished and the buffer is empty.
func (e *Engine) channelReader(c *channel, ws *websocket.Conn) {
	defer func() {
		c.readerDone.Store(true)
		e.finishChannel(c)
	}()
	// The reader never sends data; CloseRead answers its pings and notices
	// when it goes away.
	gone := ws.CloseRead(context.Background())
	for {
		select {
		case it, ok := <-c.items:
			if !ok {
				if c.ctx.Err() != nil {
					// Removed (dropped, swept, engine stopping): the writer's
					// socket ended because of it, so the stream is broken,
					// not complete; the AfterFunc closes as going away.
					return
				}
				_ = ws.Close(websocket.StatusNormalClosure, "stream complete")
				return
			}
			err := ws.Write(context.Background(), it.typ, it.data)
			c.room.Release(it.cost)
			c.budget.Release(it.charge)
			if err != nil {
				c.cancel() // nobody will read the rest; release the writer
				return
			}
		case <-gone.Done():
			c.cancel()
			return
		case <-c.ctx.Done():
			return
		}
	}
}

// finishChannel forgets a channel once both ends are done.
func (e *Engine) finishChannel(c *channel) {
	if c.writerDone.Load() && c.readerDone.Load() {
		e.channels.remove(c)
	}
}
