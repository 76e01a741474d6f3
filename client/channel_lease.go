package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/iii-sandbox/iii/protocol"
)

// Builtins of leased channels (host/engine/channels_lease.go).
const (
	fnLeaseChannels = "engine::channels::lease"
	fnWatchChannels = "engine::channels::watch"
)

// ChannelLease mints channel refs without a call per channel: ids under
// the connection's lease, keys derived from its secret. The engine makes a
// minted channel when one of its ends is first opened, owned by this
// connection; a channel nobody opens costs the engine nothing. The refs
// die with the connection the lease was made on (Current says whether that
// is still the client's), and with engine::channels::watch's retire_below.
type ChannelLease struct {
	c        *Client
	workerID string // the connection it belongs to
	id       string
	keys     *protocol.MintKeyer
}

// LeaseChannels fetches the current connection's channel lease (the same
// one on every call while the connection lasts). An engine without leases
// answers function_not_found.
func (c *Client) LeaseChannels(ctx context.Context) (*ChannelLease, error) {
	before := c.WorkerID()
	raw, err := c.Call(ctx, fnLeaseChannels, json.RawMessage(`{}`))
	if err != nil {
		return nil, err
	}
	var out struct {
		LeaseID string `json:"lease_id"`
		Secret  string `json:"secret"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, &Error{Code: CodeHandshakeFailed, Message: "the engine's lease reply is not {lease_id, secret}: " + err.Error(), Err: err}
	}
	secret, err := base64.StdEncoding.DecodeString(out.Secret)
	if err != nil || len(secret) == 0 || len(out.LeaseID) != protocol.MintLeaseIDLen {
		return nil, &Error{Code: CodeHandshakeFailed, Message: fmt.Sprintf("the engine's lease reply has a malformed lease_id (%q) or secret", out.LeaseID)}
	}
	if after := c.WorkerID(); after != before {
		// Reconnected meanwhile: the lease may be the old connection's.
		return nil, &Error{Code: CodeConnectionLost, Message: "the connection changed while the channel lease was fetched"}
	}
	return &ChannelLease{c: c, workerID: before, id: out.LeaseID, keys: protocol.NewMintKeyer(secret)}, nil
}

// Current reports whether the lease belongs to the client's connection of
// now: after a reconnect its refs open nothing, and a new lease is needed.
func (l *ChannelLease) Current() bool { return l.c.WorkerID() == l.workerID }

// ID is the channel id of counter. served marks a channel whose writer end
// the holder writes when its reader opens (the engine says so through
// WatchChannels). Each counter names one channel: use it once.
func (l *ChannelLease) ID(counter uint64, served bool) string {
	var b [1 + protocol.MintLeaseIDLen + 1 + 16 + 1]byte
	return string(protocol.AppendMintedID(b[:0], l.id, counter, served))
}

// MintEnd names one end of a minted channel for RefPair.
type MintEnd struct {
	Counter   uint64
	Served    bool
	Direction string
}

// RefPair mints the refs of two ends (of two channels, or of one) with one
// allocation for their four strings: a caller that gives every request a
// pair of refs pays for one.
func (l *ChannelLease) RefPair(a, b MintEnd) (protocol.StreamChannelRef, protocol.StreamChannelRef) {
	const idMax = 1 + protocol.MintLeaseIDLen + 1 + 16 + 1
	var arr [2 * (idMax + protocol.MintKeyLen)]byte
	buf := protocol.AppendMintedID(arr[:0], l.id, a.Counter, a.Served)
	ia := len(buf)
	buf = protocol.AppendMintedID(buf, l.id, b.Counter, b.Served)
	ib := len(buf)
	buf = l.keys.AppendKeyOf(buf, buf[:ia], a.Direction)
	buf = l.keys.AppendKeyOf(buf, buf[ia:ib], b.Direction)
	s := string(buf)
	ka, kb := ib+protocol.MintKeyLen, ib+2*protocol.MintKeyLen
	return protocol.StreamChannelRef{ChannelID: s[:ia], AccessKey: s[ib:ka], Direction: a.Direction},
		protocol.StreamChannelRef{ChannelID: s[ia:ib], AccessKey: s[ka:kb], Direction: b.Direction}
}

// Ref is one end of a minted channel.
func (l *ChannelLease) Ref(id, direction string) protocol.StreamChannelRef {
	return protocol.StreamChannelRef{ChannelID: id, AccessKey: l.keys.Key(id, direction), Direction: direction}
}

// MaxWatchExcept is the most counters one WatchChannels call keeps live
// (the engine's bound).
const MaxWatchExcept = 4096

// WatchChannels retires the current lease's counters under retireBelow but
// those in except (at most MaxWatchExcept): their refs open nothing from
// then on (a retired counter stays retired), and what is left of their
// channels is removed. Then it returns the ids of served channels whose
// reader opened since the last call, waiting up to wait for one. ctx must
// allow for the wait.
func (c *Client) WatchChannels(ctx context.Context, retireBelow uint64, except []uint64, wait time.Duration) ([]string, error) {
	if len(except) > MaxWatchExcept {
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("at most %d counters stay live in one watch call, not %d", MaxWatchExcept, len(except))}
	}
	in := make([]byte, 0, 64+len(except)*8)
	in = fmt.Appendf(in, `{"retire_below":%d,"wait_ms":%d,"except":[`, retireBelow, wait.Milliseconds())
	for i, n := range except {
		if i > 0 {
			in = append(in, ',')
		}
		in = strconv.AppendUint(in, n, 10)
	}
	in = append(in, "]}"...)
	raw, err := c.Call(ctx, fnWatchChannels, json.RawMessage(in))
	if err != nil {
		return nil, err
	}
	var out struct {
		Opened []string `json:"opened"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, &Error{Code: CodeHandshakeFailed, Message: "the engine's watch reply is not {opened: [...]}: " + err.Error(), Err: err}
	}
	return out.Opened, nil
}
