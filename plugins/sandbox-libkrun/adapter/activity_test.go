package adapter

import (
	"context"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

func TestPayloadMoved(t *testing.T) {
	base := agentproto.NetStats{TCPInSegs: 100, TCPPureAcks: 40, TCPHPAcks: 20, TCPOrigDataSent: 30,
		UDPInDatagrams: 5, UDPOutDatagrams: 5, Interface: "eth0", IfRxPackets: 200, IfTxPackets: 150}
	with := func(f func(*agentproto.NetStats)) agentproto.NetStats {
		n := base
		f(&n)
		return n
	}
	for _, tc := range []struct {
		name string
		cur  agentproto.NetStats
		want bool
	}{
		{"nothing changed", base, false},
		{"data received over eth0", with(func(n *agentproto.NetStats) { n.TCPInSegs += 3; n.IfRxPackets += 3 }), true},
		{"data sent over eth0", with(func(n *agentproto.NetStats) { n.TCPOrigDataSent++; n.IfTxPackets++ }), true},
		{"a DNS query", with(func(n *agentproto.NetStats) {
			n.UDPOutDatagrams++
			n.UDPInDatagrams++
			n.IfTxPackets++
			n.IfRxPackets++
		}), true},
		{"bare ACKs (slow path)", with(func(n *agentproto.NetStats) { n.TCPInSegs += 2; n.TCPPureAcks += 2; n.IfRxPackets += 2 }), false},
		{"bare ACKs (fast path)", with(func(n *agentproto.NetStats) { n.TCPInSegs += 2; n.TCPHPAcks += 2; n.IfRxPackets += 2 }), false},
		{"our keepalive probe and its ACK", with(func(n *agentproto.NetStats) { n.TCPInSegs++; n.TCPPureAcks++; n.IfRxPackets++; n.IfTxPackets++ }), false},
		{"ARP or ICMP on eth0 only", with(func(n *agentproto.NetStats) { n.IfRxPackets++; n.IfTxPackets++ }), false},
		{"payload on loopback only", with(func(n *agentproto.NetStats) { n.TCPOrigDataSent += 4; n.TCPInSegs += 4 }), false},
		{"counters went down", with(func(n *agentproto.NetStats) { n.TCPOrigDataSent = 0; n.IfTxPackets = 0 }), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, payloadMoved(base, tc.cur), tc.want)
		})
	}
}

// fakeCounters is a guest whose counters the test moves.
type fakeCounters struct {
	st    agentproto.NetStats
	err   error
	calls int
}

func (f *fakeCounters) sample(ctx context.Context) (*agentproto.NetStats, error) {
	f.calls++
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if f.err != nil {
		return nil, f.err
	}
	st := f.st
	return &st, nil
}

func TestNetActivity(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0
	g := &fakeCounters{st: agentproto.NetStats{IfRxPackets: 1}}
	a := newNetActivity(g.sample, 10*time.Second)
	a.now = func() time.Time { return now }
	traffic := func() { g.st.TCPOrigDataSent++; g.st.IfTxPackets++ }

	assert.Check(t, a.LastActivity().IsZero(), "the first sample is the baseline")
	assert.Equal(t, g.calls, 1)

	// Within half a tick of the last sample: no round trip.
	now = t0.Add(2 * time.Second)
	traffic()
	assert.Check(t, a.LastActivity().IsZero())
	assert.Equal(t, g.calls, 1)

	now = t0.Add(10 * time.Second)
	assert.Equal(t, a.LastActivity(), now, "the counters moved since the baseline")
	assert.Equal(t, g.calls, 2)

	// Quiet: the last movement stays the answer.
	now = t0.Add(20 * time.Second)
	assert.Equal(t, a.LastActivity(), t0.Add(10*time.Second))

	// A sample that fails (the VM too busy to answer in time) changes
	// nothing, and the next one compares with the last good sample.
	now = t0.Add(30 * time.Second)
	traffic()
	g.err = context.DeadlineExceeded
	assert.Equal(t, a.LastActivity(), t0.Add(10*time.Second))
	g.err = nil
	now = t0.Add(40 * time.Second)
	assert.Equal(t, a.LastActivity(), t0.Add(40*time.Second))

	// An agent that cannot report is not asked again.
	g.err = agentproto.Errorf(agentproto.CodeUnsupported, "no")
	now = t0.Add(50 * time.Second)
	assert.Equal(t, a.LastActivity(), t0.Add(40*time.Second))
	calls := g.calls
	now = t0.Add(60 * time.Second)
	a.LastActivity()
	assert.Equal(t, g.calls, calls)
}

func TestNetActivityTimeout(t *testing.T) {
	for _, tc := range []struct {
		every, want time.Duration
	}{
		{0, maxSampleTimeout}, // the default tick, 10 s
		{100 * time.Millisecond, minSampleTimeout},
		{time.Second, 500 * time.Millisecond},
		{time.Minute, maxSampleTimeout},
	} {
		assert.Equal(t, newNetActivity(nil, tc.every).timeout, tc.want, "tick %s", tc.every)
	}
}
