package client

import (
	"context"
	"io"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/protocol"
)

// Minted refs through a real engine: a served channel's reader is
// announced by WatchChannels and gets what the holder writes; a retired
// counter opens nothing; after a reconnect the lease is not Current and
// its refs open nothing, and a new lease works.
func TestChannelLease(t *testing.T) {
	u := startEngine(t)
	proxy := newCutProxy(t, u)
	c := dialEngine(t, proxy.url(), Options{Name: "leaser", Reconnect: ReconnectPolicy{Initial: time.Millisecond, Max: 10 * time.Millisecond}})
	other := dialEngine(t, u, Options{Name: "other"})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	l, err := c.LeaseChannels(ctx)
	assert.NilError(t, err)
	assert.Check(t, l.Current())

	id := l.ID(1, true)
	reader := l.Ref(id, protocol.DirectionRead)
	assert.Check(t, is.Len(reader.AccessKey, protocol.MintKeyLen))
	assert.Check(t, l.Ref(id, protocol.DirectionWrite).AccessKey != reader.AccessKey)
	got := make(chan string, 1)
	go func() { // the function: opens the body, reads it
		r, err := other.OpenChannelReader(ctx, reader)
		if err != nil {
			got <- err.Error()
			return
		}
		defer r.Close()
		b, err := io.ReadAll(r)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(b)
	}()
	opened, err := c.WatchChannels(ctx, 0, nil, 5*time.Second)
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(opened, []string{id}))
	w, err := c.OpenChannelWriter(ctx, l.Ref(id, protocol.DirectionWrite))
	assert.NilError(t, err)
	_, err = w.Write([]byte("the body"))
	assert.NilError(t, err)
	assert.NilError(t, w.Close())
	assert.Check(t, is.Equal(<-got, "the body"))

	_, err = c.WatchChannels(ctx, 3, nil, 0)
	assert.NilError(t, err)
	_, err = other.OpenChannelWriter(ctx, l.Ref(l.ID(2, false), protocol.DirectionWrite))
	assert.Check(t, is.Equal(CodeOf(err), CodeChannelUnavailable), "retired: %v", err)

	before := c.WorkerID()
	proxy.cutClients()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if c.Connected() && c.WorkerID() != before {
			return poll.Success()
		}
		return poll.Continue("waiting for the reconnect")
	}, poll.WithTimeout(waitLimit))
	assert.Check(t, !l.Current())
	_, err = other.OpenChannelWriter(ctx, l.Ref(l.ID(10, false), protocol.DirectionWrite))
	assert.Check(t, is.Equal(CodeOf(err), CodeChannelUnavailable), "the old connection's lease: %v", err)
	_, err = c.WatchChannels(ctx, 0, nil, 0)
	assert.Check(t, is.Equal(CodeOf(err), "NOT_FOUND"), "no lease on the new connection yet: %v", err)
	l2, err := c.LeaseChannels(ctx)
	assert.NilError(t, err)
	assert.Check(t, l2.Current())
	wr, err := other.OpenChannelWriter(ctx, l2.Ref(l2.ID(10, false), protocol.DirectionWrite))
	assert.NilError(t, err)
	assert.NilError(t, wr.Close())
}

// RefPair mints what two Ref calls would, with one allocation.
func TestChannelLeaseRefPair(t *testing.T) {
	l := &ChannelLease{id: "0123456789abcdef01234567", keys: protocol.NewMintKeyer([]byte("secret"))}
	for _, tc := range []struct{ a, b MintEnd }{
		{MintEnd{Counter: 0, Served: true, Direction: protocol.DirectionRead}, MintEnd{Counter: 1, Direction: protocol.DirectionWrite}},
		{MintEnd{Counter: 1<<64 - 2, Served: true, Direction: protocol.DirectionWrite}, MintEnd{Counter: 1<<64 - 1, Served: true, Direction: protocol.DirectionRead}},
		{MintEnd{Counter: 7, Direction: protocol.DirectionRead}, MintEnd{Counter: 7, Direction: protocol.DirectionWrite}},
	} {
		ra, rb := l.RefPair(tc.a, tc.b)
		assert.Check(t, is.DeepEqual(ra, l.Ref(l.ID(tc.a.Counter, tc.a.Served), tc.a.Direction)))
		assert.Check(t, is.DeepEqual(rb, l.Ref(l.ID(tc.b.Counter, tc.b.Served), tc.b.Direction)))
	}
	a, b := MintEnd{Counter: 1 << 40, Served: true, Direction: protocol.DirectionRead}, MintEnd{Counter: 1<<40 + 1, Direction: protocol.DirectionWrite}
	n := testing.AllocsPerRun(100, func() { _, _ = l.RefPair(a, b) })
	assert.Check(t, n <= 1, "%v allocations", n)
}
