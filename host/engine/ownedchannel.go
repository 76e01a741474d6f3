package engine

import (
	"fmt"

	"github.com/iii-sandbox/iii/protocol"
)

// MaxChannelsPerAdapter caps the channels one adapter process holds
// through its channel service (one per fs::read it answers, until the
// caller has read it or the channel's TTL sweeps it): an adapter, or
// callers driving one, cannot grow the engine's channel table without
// bound. Four times a worker connection's share: an adapter serves every
// caller of its sandboxes.
const MaxChannelsPerAdapter = 4 * MaxChannelsPerConnection

// CreateOwnedChannel makes a channel counted against owner, failing with
// a limit error once owner holds limit channels or the engine holds
// MaxChannels. owner names a holder that is not a worker connection (an
// adapter process: "adapter:<name>"); worker ids never take that form.
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
