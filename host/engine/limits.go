package engine

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"sync/atomic"

	"golang.org/x/sync/semaphore"

	"github.com/iii-sandbox/iii/protocol"
)

// Limits are the caps a listener puts on its connections
// (docs/security.md, "Limits"). Zero fields take the defaults below. An
// offender gets a LIMIT_EXCEEDED error and, where the cap is on what it
// sends, its connection is closed; every other worker keeps working.
type Limits struct {
	// FrameBytes is the largest frame a worker or channel socket may send.
	FrameBytes int64
	// Connections caps the worker sockets open through the listener at
	// once; more are refused with 503 before the upgrade.
	Connections int64
	// RegistrationsPerConnection caps the functions, triggers, trigger
	// types and services one connection holds (registrations less
	// unregistrations, counting those still queued for its namespace).
	RegistrationsPerConnection int64
	// QueuedBytesPerConnection caps the frames waiting to be written to
	// one connection. A sender waits for room; a connection that does not
	// drain within the slow-consumer time is dropped.
	QueuedBytesPerConnection int64
	// IDBytes caps every id a connection sends: invocation and function
	// ids of a call, and the ids of what it registers.
	IDBytes int64
	// InflightPerConnection caps the calls one connection awaits at once
	// (sent, not yet answered); InflightBytesPerConnection caps what they
	// hold (ids, payloads, metadata). Past either a call is answered
	// LIMIT_EXCEEDED; the connection stays.
	InflightPerConnection      int64
	InflightBytesPerConnection int64
	// RegistrationBytes caps one registration frame (its description,
	// schemas, metadata, config); RegistrationBytesPerConnection caps what
	// one connection's registrations hold together (past it: an error frame
	// LIMIT_EXCEEDED and the socket closes).
	RegistrationBytes              int64
	RegistrationBytesPerConnection int64
}

// Defaults of Limits, and the engine-wide budgets.
const (
	DefaultFrameBytes                 = 64 << 20
	DefaultConnections                = 1024
	DefaultRegistrationsPerConnection = 10_000
	DefaultQueuedBytesPerConnection   = 128 << 20
	DefaultIDBytes                    = 1024
	DefaultInflightPerConnection      = 4096
	DefaultInflightBytesPerConnection = 64 << 20
	DefaultRegistrationBytes          = 1 << 20
	DefaultRegistrationBytesPerConn   = 16 << 20

	// MaxInflight caps the calls in flight from all connections together.
	MaxInflight = 65_536
	// RegistrationBytesTotal caps what the registrations of all
	// connections hold together.
	RegistrationBytesTotal = 64 << 20
	// ChannelBytesTotal caps what all streaming channels hold together
	// between their writers and readers, partial messages included.
	ChannelBytesTotal = 128 << 20

	// ChannelBufferBytes caps what one streaming channel holds between its
	// writer and its reader; a writer ahead of its reader waits.
	ChannelBufferBytes = 16 << 20
	// MaxChannels caps the channels alive at once.
	MaxChannels = 4096
	// LargeFrameLanes caps the large frames (over smallFrameBytes) being
	// read and handled at once across all connections: a sender of a large
	// frame waits for a lane before the engine reads past its first MiB,
	// so a flood of them cannot grow the engine by more than this many
	// frames. A connection holds one lane at most, so waiting never
	// deadlocks.
	LargeFrameLanes = 2
	// smallFrameBytes: frames up to this size never wait for a lane, so a
	// flood of large frames does not hold up ordinary calls.
	smallFrameBytes = 1 << 20
	// freeFrameBytes: what of a frame is read at once. Past it a frame
	// takes one of MediumFrameSlots until it is handled: partial frames of
	// many connections hold at most connections × freeFrameBytes plus
	// MediumFrameSlots × smallFrameBytes.
	freeFrameBytes = 64 << 10
	// MediumFrameSlots caps the frames over 64 KiB being read and handled
	// at once across all connections.
	MediumFrameSlots = 64
)

// withDefaults fills zero fields.
func (l Limits) withDefaults() Limits {
	if l.FrameBytes <= 0 {
		l.FrameBytes = DefaultFrameBytes
	}
	if l.Connections <= 0 {
		l.Connections = DefaultConnections
	}
	if l.RegistrationsPerConnection <= 0 {
		l.RegistrationsPerConnection = DefaultRegistrationsPerConnection
	}
	if l.QueuedBytesPerConnection <= 0 {
		l.QueuedBytesPerConnection = DefaultQueuedBytesPerConnection
	}
	if l.IDBytes <= 0 {
		l.IDBytes = DefaultIDBytes
	}
	if l.InflightPerConnection <= 0 {
		l.InflightPerConnection = DefaultInflightPerConnection
	}
	if l.InflightBytesPerConnection <= 0 {
		l.InflightBytesPerConnection = DefaultInflightBytesPerConnection
	}
	if l.RegistrationBytes <= 0 {
		l.RegistrationBytes = DefaultRegistrationBytes
	}
	if l.RegistrationBytesPerConnection <= 0 {
		l.RegistrationBytesPerConnection = DefaultRegistrationBytesPerConn
	}
	return l
}

// listenerState is what one HandlerFor keeps across its connections.
type listenerState struct {
	policy ListenerPolicy
	limits Limits
	open   atomic.Int64 // worker and telemetry sockets open
}

// admitConnection counts a new socket against the listener's cap; false
// means it was refused (and answered).
func (l *listenerState) admitConnection(rw http.ResponseWriter) bool {
	if l.open.Add(1) > l.limits.Connections {
		l.open.Add(-1)
		http.Error(rw, fmt.Sprintf("%s: listener %s has %d connections open, its limit (limits.connections)",
			CodeLimitExceeded, l.policy.Name, l.limits.Connections), http.StatusServiceUnavailable)
		return false
	}
	return true
}

func (l *listenerState) release() { l.open.Add(-1) }

// limitFrame is the error frame sent to a connection closed for exceeding
// a cap.
func limitFrame(msg string) []byte {
	b, _ := protocol.Encode(&protocol.ErrorFrame{Error: protocol.ErrorBody{Code: CodeLimitExceeded, Message: msg}})
	return b
}

// countRegistration applies one registration frame (delta +1) or
// unregistration (delta -1) to the connection's count. false means the
// cap is exceeded: the connection has been told and is closing.
func (c *wsConn) countRegistration(delta int64) bool {
	n := c.regs.Add(delta)
	if n < 0 {
		c.regs.Store(0)
		return true
	}
	if n <= c.limits.RegistrationsPerConnection {
		return true
	}
	if c.regsExceeded.CompareAndSwap(false, true) {
		c.e.log.Warn("worker exceeded its registrations; closing it", "worker_id", c.w.id, "limit", c.limits.RegistrationsPerConnection)
		c.send(limitFrame(fmt.Sprintf("this connection holds more than %d registrations (limits.registrations_per_connection); it is closed", c.limits.RegistrationsPerConnection)))
		c.shutdown(statusPolicyViolation, CodeLimitExceeded)
	}
	return false
}

// inboundBudget is the engine-wide lanes for large frames in flight, and
// the engine-wide budgets every connection's charges also count against
// (budget.go, channels.go).
type inboundBudget struct {
	lanes     *semaphore.Weighted
	medium    *semaphore.Weighted // MediumFrameSlots
	outAll    *semaphore.Weighted // outbound queues, QueuedBytesTotal
	inflight  *atomic.Int64       // calls in flight, MaxInflight
	regBytes  *atomic.Int64       // registration bytes, RegistrationBytesTotal
	chanBytes *semaphore.Weighted // channel bytes, ChannelBytesTotal
}

func newInboundBudget() inboundBudget {
	return inboundBudget{lanes: semaphore.NewWeighted(LargeFrameLanes), medium: semaphore.NewWeighted(MediumFrameSlots),
		outAll: semaphore.NewWeighted(QueuedBytesTotal), inflight: new(atomic.Int64),
		regBytes: new(atomic.Int64), chanBytes: semaphore.NewWeighted(ChannelBytesTotal)}
}

// acquire waits for a lane.
func (b inboundBudget) acquire(ctx context.Context) (bool, error) {
	if err := b.lanes.Acquire(ctx, 1); err != nil {
		return false, err
	}
	return true, nil
}

// release gives a lane back. The frame it carried (and the pieces it was
// read in) are garbage now; collecting at once, rather than when the heap
// has doubled, is what keeps a flood of large frames within the engine's
// documented memory bound. A large frame is rare and costs far more than a
// collection.
func (b inboundBudget) release(held bool) {
	if held {
		runtime.GC()
		b.lanes.Release(1)
	}
}

// heldLanes is what a frame being read holds of the inbound budget.
type heldLanes struct{ medium, large bool }

// releaseHeld gives back what a frame held once it is handled.
func (b inboundBudget) releaseHeld(h heldLanes) {
	b.release(h.large)
	if h.medium {
		b.medium.Release(1)
	}
}
