package adapter

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// Network activity, for the reaper. The contract counts relayed network
// payload (TCP data, UDP, DNS; not keepalives or bare ACKs) as activity.
// The adapter sees no packets (the VM's runner relays them), so the guest's
// kernel counters are sampled through the agent (net_stats) and compared
// with the previous sample: the sandbox was active when the payload
// counters (agentproto.NetStats.Payload) moved and so did eth0's packet
// counters. The second condition keeps traffic that never left the guest
// (a client and a server both inside, on loopback) from counting; the
// kernel's protocol counters alone cannot tell interfaces apart.

// Bounds of one sample's round trip into the guest: the reaper waits for
// it, so it must be short, but a VM under TCG on a loaded host answers
// slowly.
const (
	minSampleTimeout = 200 * time.Millisecond
	maxSampleTimeout = 2 * time.Second
	// defaultSampleEvery paces sampling when the kit did not say how often
	// its reaper ticks.
	defaultSampleEvery = 10 * time.Second
)

// netActivity tracks one sandbox's network payload. LastActivity samples
// at most once per interval (the reaper's tick), and reports the time of
// the last sample at which the counters had moved.
type netActivity struct {
	sample  func(ctx context.Context) (*agentproto.NetStats, error)
	every   time.Duration
	timeout time.Duration
	now     func() time.Time

	mu        sync.Mutex
	sampledAt time.Time
	have      bool
	last      agentproto.NetStats
	moved     time.Time
	// off: the agent cannot report counters (an older agent); nothing is
	// asked again.
	off bool
}

func newNetActivity(sample func(context.Context) (*agentproto.NetStats, error), every time.Duration) *netActivity {
	if every <= 0 {
		every = defaultSampleEvery
	}
	return &netActivity{
		sample:  sample,
		every:   every,
		timeout: min(max(every/2, minSampleTimeout), maxSampleTimeout),
		now:     time.Now,
	}
}

// LastActivity samples the counters if the last sample is older than half
// the interval (ticks jitter), and returns when they last moved; zero if
// never. A failed sample leaves the answer as it was: a VM too busy to
// answer in time is not reaped for it, nor kept alive.
func (a *netActivity) LastActivity() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if a.off || (a.have && now.Sub(a.sampledAt) < a.every/2) {
		return a.moved
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	st, err := a.sample(ctx)
	if err != nil {
		var ae *agentproto.Error
		if errors.As(err, &ae) && ae.Code == agentproto.CodeUnsupported {
			a.off = true
		}
		return a.moved
	}
	a.observe(now, *st)
	return a.moved
}

// observe takes one sample: the first is the baseline, every later one
// that moved marks now as active.
func (a *netActivity) observe(now time.Time, st agentproto.NetStats) {
	if a.have && payloadMoved(a.last, st) {
		a.moved = now
	}
	a.last, a.have, a.sampledAt = st, true, now
}

// payloadMoved reports whether relayed payload went through between two
// samples: the payload counters changed, and so did the interface's
// packet counters (the payload went over the wire, not over loopback).
// Counters that went down (they never should) count as a change.
func payloadMoved(prev, cur agentproto.NetStats) bool {
	return cur.Payload() != prev.Payload() &&
		(cur.IfRxPackets != prev.IfRxPackets || cur.IfTxPackets != prev.IfTxPackets)
}
