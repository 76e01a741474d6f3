package engine

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/protocol"
)

// testLease is a connection's lease as its holder sees it.
type testLease struct {
	id   string
	keys *protocol.MintKeyer
}

func leaseOf(t *testing.T, w *rawClient) testLease {
	t.Helper()
	res := w.call("lease-"+w.workerID, FnChannelsLease, nil, `{}`)
	var out struct {
		LeaseID string `json:"lease_id"`
		Secret  string `json:"secret"`
	}
	assert.NilError(t, json.Unmarshal(mustJSON(t, res["result"]), &out), "%v", res)
	secret, err := base64.StdEncoding.DecodeString(out.Secret)
	assert.NilError(t, err)
	assert.Check(t, is.Len(secret, leaseSecretLen))
	assert.Check(t, is.Len(out.LeaseID, protocol.MintLeaseIDLen))
	return testLease{id: out.LeaseID, keys: protocol.NewMintKeyer(secret)}
}

func (l testLease) ref(counter uint64, served bool, dir string) protocol.StreamChannelRef {
	id := string(protocol.AppendMintedID(nil, l.id, counter, served))
	return protocol.StreamChannelRef{ChannelID: id, AccessKey: l.keys.Key(id, dir), Direction: dir}
}

// watch calls engine::channels::watch and returns the opened ids.
func watch(t *testing.T, w *rawClient, retireBelow uint64, waitMS int) []string {
	t.Helper()
	res := w.call(fmt.Sprintf("watch-%d-%d", retireBelow, time.Now().UnixNano()), FnChannelsWatch, nil,
		fmt.Sprintf(`{"retire_below":%d,"wait_ms":%d}`, retireBelow, waitMS))
	var out struct {
		Opened []string `json:"opened"`
	}
	assert.NilError(t, json.Unmarshal(mustJSON(t, res["result"]), &out), "%v", res)
	return out.Opened
}

// A minted ref opens its channel on first use, with no call before: the
// reader of a served channel is announced to the holder through watch, and
// the holder's writer end (minted too) streams to it. Both ends of one
// channel meet in one table entry, owned by the holder.
func TestChannelLeaseMintedRelay(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	l := leaseOf(t, w)
	assert.Check(t, is.Equal(leaseOf(t, w).id, l.id), "one lease per connection")
	assert.Check(t, is.Equal(te.channels.len(), 0))

	rc := dialChannel(t, te, l.ref(7, true, protocol.DirectionRead))
	assert.Check(t, is.DeepEqual(watch(t, w, 0, 5000), []string{l.ref(7, true, "read").ChannelID}))
	assert.Check(t, is.Equal(te.channels.owned(w.workerID), 1))
	wc := dialChannel(t, te, l.ref(7, true, protocol.DirectionWrite))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	assert.NilError(t, wc.Write(ctx, websocket.MessageBinary, []byte("body")))
	assert.NilError(t, wc.Close(websocket.StatusNormalClosure, ""))
	typ, data, err := rc.Read(ctx)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(typ, websocket.MessageBinary))
	assert.Check(t, is.Equal(string(data), "body"))
	_, _, err = rc.Read(ctx)
	assert.Check(t, is.Equal(websocket.CloseStatus(err), websocket.StatusNormalClosure), "%v", err)
	pollUntil(t, "the finished channel is forgotten", func() bool { return te.channels.len() == 0 })

	// Finished: its refs open nothing again.
	assert.Check(t, is.Equal(httpStatus(t, channelURL(te, l.ref(7, true, "read"))), http.StatusNotFound))
	// A channel that is not served is announced to nobody.
	_ = dialChannel(t, te, l.ref(8, false, protocol.DirectionWrite))
	_ = dialChannel(t, te, l.ref(9, true, protocol.DirectionWrite))
	assert.Check(t, is.Len(watch(t, w, 0, 0), 0))
}

// What a minted ref must not open: forged or swapped keys, the other
// direction's key, a lease id that is not the key's, ids not in the
// canonical form.
func TestChannelLeaseRefusals(t *testing.T) {
	te := startEngine(t, Options{})
	a, b := te.dial(t), te.dial(t)
	la, lb := leaseOf(t, a), leaseOf(t, b)
	assert.Check(t, la.id != lb.id)
	good := la.ref(1, false, protocol.DirectionRead)
	for _, tc := range []struct {
		name string
		ref  protocol.StreamChannelRef
	}{
		{"forged key", protocol.StreamChannelRef{ChannelID: good.ChannelID, AccessKey: strings.Repeat("0", protocol.MintKeyLen), Direction: "read"}},
		{"short key", protocol.StreamChannelRef{ChannelID: good.ChannelID, AccessKey: good.AccessKey[:10], Direction: "read"}},
		{"the reader's key for the writer end", protocol.StreamChannelRef{ChannelID: good.ChannelID, AccessKey: good.AccessKey, Direction: "write"}},
		{"another channel's key", protocol.StreamChannelRef{ChannelID: good.ChannelID, AccessKey: la.ref(2, false, "read").AccessKey, Direction: "read"}},
		{"another lease's key under this lease id", func() protocol.StreamChannelRef {
			id := string(protocol.AppendMintedID(nil, la.id, 1, false))
			return protocol.StreamChannelRef{ChannelID: id, AccessKey: lb.keys.Key(id, "read"), Direction: "read"}
		}()},
		{"served flag added", protocol.StreamChannelRef{ChannelID: good.ChannelID + "s", AccessKey: good.AccessKey, Direction: "read"}},
		{"leading zero", protocol.StreamChannelRef{ChannelID: "m" + la.id + "-01", AccessKey: la.keys.Key("m"+la.id+"-01", "read"), Direction: "read"}},
		{"unknown lease", func() protocol.StreamChannelRef {
			l := testLease{id: strings.Repeat("ab", protocol.MintLeaseIDLen/2), keys: la.keys}
			return l.ref(1, false, "read")
		}()},
	} {
		assert.Check(t, is.Equal(httpStatus(t, channelURL(te, tc.ref)), http.StatusNotFound), tc.name)
	}
	assert.Check(t, is.Equal(te.channels.len(), 0), "nothing was made")
	// The genuine ref still opens: the refusals took nothing from it.
	_ = dialChannel(t, te, good)
	assert.Check(t, is.Equal(te.channels.owned(a.workerID), 1))
	assert.Check(t, is.Equal(te.channels.owned(b.workerID), 0))

	// watch needs a lease of the caller's own.
	c := te.dial(t)
	code, _ := errBody(t, c.call("w", FnChannelsWatch, nil, `{"wait_ms":0}`))
	assert.Check(t, is.Equal(code, CodeNotFound))
	code, _ = errBody(t, a.call("w2", FnChannelsWatch, nil, `{"wait_ms":-1}`))
	assert.Check(t, is.Equal(code, CodeInvalidArgument))
}

// Retiring a counter kills its refs and removes what is left of the
// channels made from them; the holder's disconnect kills its lease: every
// ref minted under it opens nothing, and its channels close as going away.
func TestChannelLeaseRetireAndDisconnect(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	l := leaseOf(t, w)
	open := dialChannel(t, te, l.ref(3, false, protocol.DirectionWrite)) // made, not finished
	_ = dialChannel(t, te, l.ref(10, false, protocol.DirectionRead))
	assert.Check(t, is.Equal(te.channels.owned(w.workerID), 2))

	watch(t, w, 5, 0)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, _, err := open.Read(ctx)
	assert.Check(t, is.Equal(websocket.CloseStatus(err), statusGoingAway), "%v", err)
	assert.Check(t, is.Equal(te.channels.owned(w.workerID), 1), "counter 10 is above the retire mark")
	for _, n := range []uint64{0, 3, 4} {
		assert.Check(t, is.Equal(httpStatus(t, channelURL(te, l.ref(n, false, "read"))), http.StatusNotFound), "counter %d", n)
	}
	watch(t, w, 2, 0) // the mark never goes back
	assert.Check(t, is.Equal(httpStatus(t, channelURL(te, l.ref(4, false, "read"))), http.StatusNotFound))

	// A watch waiting when the connection ends returns; then nothing of
	// the lease opens, and its channel is gone.
	fresh := l.ref(20, false, protocol.DirectionRead)
	_ = w.c.CloseNow()
	pollUntil(t, "the lease is dropped with its connection", func() bool {
		te.channels.mu.Lock()
		defer te.channels.mu.Unlock()
		return len(te.channels.leases) == 0 && te.channels.byOwner[w.workerID] == 0
	})
	assert.Check(t, is.Equal(httpStatus(t, channelURL(te, fresh)), http.StatusNotFound))
}

// A holder cannot mint its way past the connection's channel bound: a first
// open beyond it is refused (429), while unopened minted refs cost nothing.
// Retiring makes room again.
func TestChannelLeaseBound(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	l := leaseOf(t, w)
	for n := range uint64(MaxChannelsPerConnection) {
		r := l.ref(n, false, protocol.DirectionRead)
		c, err := te.channels.materialise(te.Engine, r.ChannelID, r.AccessKey, r.Direction)
		assert.NilError(t, err)
		assert.Assert(t, c != nil, "counter %d", n)
	}
	over := l.ref(MaxChannelsPerConnection, false, protocol.DirectionRead)
	assert.Check(t, is.Equal(httpStatus(t, channelURL(te, over)), http.StatusTooManyRequests))
	_, err := te.channels.materialise(te.Engine, over.ChannelID, over.AccessKey, over.Direction)
	assert.Check(t, is.ErrorContains(err, "holds 256 channels"))
	watch(t, w, 10, 0)
	assert.Check(t, is.Equal(te.channels.owned(w.workerID), MaxChannelsPerConnection-10))
	_ = dialChannel(t, te, over)

	// And the lease's record of made channels is bounded too: with the
	// channels finished (removed) but not retired, first opens stop at
	// maxLeaseUsed.
	te.channels.removeWhere(func(c *channel) bool { return c.owner == w.workerID })
	l2 := leaseOf(t, w)
	made := 0
	for n := uint64(1000); ; n++ {
		r := l2.ref(n, false, protocol.DirectionRead)
		c, err := te.channels.materialise(te.Engine, r.ChannelID, r.AccessKey, r.Direction)
		if err != nil {
			assert.Check(t, is.ErrorContains(err, "unretired"))
			break
		}
		assert.Assert(t, c != nil)
		te.channels.remove(c)
		made++
	}
	assert.Check(t, is.Equal(made, maxLeaseUsed-MaxChannelsPerConnection+10-1), "counters 10…256 are still unretired")
}

// Only a connection gets a lease.
func TestChannelLeaseInProcess(t *testing.T) {
	te := startEngine(t, Options{})
	_, err := te.Invoke(context.Background(), "", FnChannelsLease, json.RawMessage(`{}`))
	assert.Check(t, is.ErrorContains(err, "belongs to a worker connection"))
}

// In-process ends (plugin hosts, adapters) open minted refs too, with the
// same checks.
func TestChannelLeaseInProcessEnds(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	l := leaseOf(t, w)
	bad := l.ref(1, false, protocol.DirectionRead)
	bad.AccessKey = l.ref(1, false, protocol.DirectionWrite).AccessKey
	_, err := te.OpenChannelReader(bad)
	assert.Check(t, is.ErrorIs(err, ErrChannelNotFound))

	r, err := te.OpenChannelReader(l.ref(1, false, protocol.DirectionRead))
	assert.NilError(t, err)
	wr := dialChannel(t, te, l.ref(1, false, protocol.DirectionWrite))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	assert.NilError(t, wr.Write(ctx, websocket.MessageBinary, []byte("in process")))
	assert.NilError(t, wr.Close(websocket.StatusNormalClosure, ""))
	b, err := io.ReadAll(r)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(string(b), "in process"))
	assert.NilError(t, r.Close())
}

// Retiring with except: every counter under the mark but the listed ones
// is retired, and a retired counter never comes back (a later call with a
// lower mark, or listing it again).
func TestChannelLeaseRetireExcept(t *testing.T) {
	te := startEngine(t, Options{})
	w := te.dial(t)
	l := leaseOf(t, w)
	te.channels.mu.Lock()
	lease := te.channels.leaseOf[w.workerID]
	te.channels.mu.Unlock()
	r4 := l.ref(4, false, protocol.DirectionRead)
	made, err := te.channels.materialise(te.Engine, r4.ChannelID, r4.AccessKey, r4.Direction)
	assert.NilError(t, err)
	assert.Assert(t, made != nil)
	r3 := l.ref(3, false, protocol.DirectionRead)
	made3, err := te.channels.materialise(te.Engine, r3.ChannelID, r3.AccessKey, r3.Direction)
	assert.NilError(t, err)
	assert.Assert(t, made3 != nil)

	for _, step := range []struct {
		below  uint64
		except []uint64
		live   []uint64 // of counters 0…13
	}{
		{below: 10, except: []uint64{3, 4}, live: []uint64{3, 4, 10, 11, 12, 13}},
		{below: 12, except: []uint64{4, 5}, live: []uint64{4, 12, 13}},
		{below: 8, except: []uint64{11, 13}, live: []uint64{12, 13}},
		{below: 13, except: []uint64{12}, live: []uint64{12, 13}},
	} {
		te.channels.retire(lease, step.below, step.except)
		var live []uint64
		lease.mu.Lock()
		for n := range uint64(14) {
			if lease.live(n) {
				live = append(live, n)
			}
		}
		lease.mu.Unlock()
		assert.Check(t, is.DeepEqual(live, step.live), "retire below %d except %v", step.below, step.except)
	}
	assert.Check(t, te.channels.get(r3.ChannelID) == nil, "counter 3's channel went when it was retired")
	assert.Check(t, te.channels.get(r4.ChannelID) == nil, "and counter 4's")
	assert.Check(t, is.Equal(httpStatus(t, channelURL(te, l.ref(5, false, "read"))), http.StatusNotFound))
	_ = dialChannel(t, te, l.ref(12, false, protocol.DirectionRead))

	// Through the builtin: except needs retire_below, and is bounded.
	code, _ := errBody(t, w.call("x1", FnChannelsWatch, nil, `{"except":[1]}`))
	assert.Check(t, is.Equal(code, CodeInvalidArgument))
	many := strings.Repeat("1,", maxWatchExcept) + "1"
	code, _ = errBody(t, w.call("x2", FnChannelsWatch, nil, `{"retire_below":1,"except":[`+many+`]}`))
	assert.Check(t, is.Equal(code, CodeInvalidArgument))
}
