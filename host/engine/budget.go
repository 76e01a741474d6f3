package engine

import (
	"fmt"
	"sync"

	"github.com/iii-sandbox/iii/protocol"
)

// What a caller can make the engine hold is charged to the connection that
// sent it (docs/security.md, "Limits"): the calls it awaits (count and
// bytes) and what its registrations keep (bytes), each under a cap of the
// listener and under an engine-wide one, so many connections each just
// under their caps cannot add up past the engine's memory bound either.

// maxTelemetryBytes caps the telemetry a worker reports about itself
// (engine::workers::register), which the engine keeps for its life.
const maxTelemetryBytes = 64 << 10

// callBudget is what one connection's unanswered calls hold.
type callBudget struct {
	mu    sync.Mutex
	n     int64
	bytes int64
	// enqueues counts those of the n that are enqueues waiting on the
	// queue provider (maxEnqueuesPerConnection).
	enqueues int64
}

// callCost is what one call counts against InflightBytesPerConnection: its
// ids, payload and metadata. One call larger than the cap still passes
// alone (the frame cap bounds it).
func (c *wsConn) callCost(r *invokeRequest) int64 {
	n := int64(len(r.invocationID) + len(r.functionID) + len(r.data) + len(r.metadata) + len(r.traceparent) + len(r.baggage))
	return min(n, c.limits.InflightBytesPerConnection)
}

// heldCost is what a call the engine carries on its caller's behalf (an
// enqueue handed to the queue provider, a call waiting in the listener's
// middleware) counts against InflightBytesPerConnection: its ids and what
// the engine built of it to hand on (built bytes), which holds the payload.
func (c *wsConn) heldCost(r *invokeRequest, built int) int64 {
	n := int64(len(r.invocationID) + len(r.functionID) + built)
	return min(n, c.limits.InflightBytesPerConnection)
}

// chargeCall reserves a call's cost on the connection and the engine-wide
// count of calls in flight; a non-nil error body means the call is refused
// (and nothing is held). release must be called exactly once otherwise.
func (c *wsConn) chargeCall(cost int64) *protocol.ErrorBody {
	b := &c.calls
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n >= c.limits.InflightPerConnection {
		return limitBody(fmt.Sprintf("this connection awaits %d calls, its limit (limits.inflight_per_connection); wait for answers first", b.n))
	}
	if b.n > 0 && b.bytes+cost > c.limits.InflightBytesPerConnection {
		return limitBody(fmt.Sprintf("this connection's unanswered calls hold %d bytes, its limit is %d (limits.inflight_bytes_per_connection); wait for answers first",
			b.bytes, c.limits.InflightBytesPerConnection))
	}
	if c.e.inbound.inflight.Add(1) > MaxInflight {
		c.e.inbound.inflight.Add(-1)
		return limitBody(fmt.Sprintf("the engine has %d calls in flight, its limit; try again later", MaxInflight))
	}
	b.n++
	b.bytes += cost
	return nil
}

// chargeEnqueue is chargeCall for an enqueue handed to the queue provider,
// which also takes one of the engine's maxEnqueuesInFlight hand-overs: one
// connection holds at most maxEnqueuesPerConnection of them, so it cannot
// take them all from the others. release with releaseEnqueue.
func (c *wsConn) chargeEnqueue(cost int64) *protocol.ErrorBody {
	b := &c.calls
	b.mu.Lock()
	over := b.enqueues >= maxEnqueuesPerConnection
	if !over {
		b.enqueues++
	}
	b.mu.Unlock()
	if over {
		return limitBody(fmt.Sprintf("this connection has %d enqueues waiting on the queue provider, its limit; wait for their receipts first", maxEnqueuesPerConnection))
	}
	if errb := c.chargeCall(cost); errb != nil {
		b.mu.Lock()
		b.enqueues--
		b.mu.Unlock()
		return errb
	}
	return nil
}

// releaseEnqueue gives back what chargeEnqueue reserved.
func (c *wsConn) releaseEnqueue(cost int64) {
	b := &c.calls
	b.mu.Lock()
	b.enqueues--
	b.mu.Unlock()
	c.releaseCall(cost)
}

// releaseCall gives back what chargeCall reserved.
func (c *wsConn) releaseCall(cost int64) {
	b := &c.calls
	b.mu.Lock()
	b.n--
	b.bytes -= cost
	b.mu.Unlock()
	c.e.inbound.inflight.Add(-1)
}

func limitBody(msg string) *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: CodeLimitExceeded, Message: msg}
}

// checkCallIDs refuses ids longer than limits.id_bytes before anything is
// kept of them.
func (c *wsConn) checkCallIDs(r *invokeRequest) *protocol.ErrorBody {
	if max := c.limits.IDBytes; int64(len(r.invocationID)) > max || int64(len(r.functionID)) > max {
		return limitBody(fmt.Sprintf("an invocation_id or function_id is longer than %d bytes (limits.id_bytes)", max))
	}
	return nil
}

// regBudget is what one connection's registrations hold: the size of the
// frame that made each one, by what it registered (a re-registration
// replaces the cost of the one it replaces, an unregistration frees it).
type regBudget struct {
	mu    sync.Mutex
	total int64
	cost  map[string]int64
}

// registrationKey names what a registration frame registers (or an
// unregistration frees), and the id to check against limits.id_bytes.
func registrationKey(m protocol.Message) (key string, ids []string) {
	switch m := m.(type) {
	case *protocol.RegisterFunction:
		return "f\x00" + m.ID, []string{m.ID}
	case *protocol.UnregisterFunction:
		return "f\x00" + m.ID, nil
	case *protocol.RegisterTrigger:
		return "t\x00" + m.ID, []string{m.ID, m.TriggerType, m.FunctionID}
	case *protocol.UnregisterTrigger:
		return "t\x00" + m.ID, nil
	case *protocol.RegisterTriggerType:
		return "y\x00" + m.ID, []string{m.ID}
	case *protocol.UnregisterTriggerType:
		return "y\x00" + m.ID, nil
	case *protocol.RegisterService:
		return "s\x00" + m.ID, []string{m.ID, m.ParentServiceID}
	}
	return "", nil
}

// chargeRegistration charges a registration frame of size bytes. false
// means it must not be applied: the sender was told (an error frame coded
// LIMIT_EXCEEDED) and, past its connection's total, is closing.
func (c *wsConn) chargeRegistration(m protocol.Message, size int) bool {
	key, ids := registrationKey(m)
	for _, id := range ids {
		if int64(len(id)) > c.limits.IDBytes {
			c.refuseRegistration(fmt.Sprintf("%s: an id is longer than %d bytes (limits.id_bytes); not registered", m.MessageType(), c.limits.IDBytes), false)
			return false
		}
	}
	cost := int64(size)
	if cost > c.limits.RegistrationBytes {
		c.refuseRegistration(fmt.Sprintf("%s %s: the frame is %d bytes, over limits.registration_bytes (%d): keep descriptions, schemas, metadata and configs smaller; not registered",
			m.MessageType(), short(ids[0]), cost, c.limits.RegistrationBytes), false)
		return false
	}
	b := &c.regBytes
	b.mu.Lock()
	defer b.mu.Unlock()
	old := b.cost[key]
	if b.total-old+cost > c.limits.RegistrationBytesPerConnection {
		c.refuseRegistration(fmt.Sprintf("this connection's registrations hold more than %d bytes (limits.registration_bytes_per_connection); it is closed",
			c.limits.RegistrationBytesPerConnection), true)
		return false
	}
	if c.e.inbound.regBytes.Add(cost-old) > RegistrationBytesTotal {
		c.e.inbound.regBytes.Add(old - cost)
		c.refuseRegistration(fmt.Sprintf("%s %s: the engine's registrations hold %d bytes, its limit; not registered",
			m.MessageType(), short(ids[0]), RegistrationBytesTotal), false)
		return false
	}
	if b.cost == nil {
		b.cost = make(map[string]int64)
	}
	b.cost[key] = cost
	b.total += cost - old
	return true
}

// unchargeRegistration frees what the registration an unregistration
// frame names was charged.
func (c *wsConn) unchargeRegistration(m protocol.Message) {
	key, _ := registrationKey(m)
	b := &c.regBytes
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.cost[key]; ok {
		delete(b.cost, key)
		b.total -= old
		c.e.inbound.regBytes.Add(-old)
	}
}

// releaseRegistrations gives the engine-wide budget back what the closed
// connection's registrations held.
func (c *wsConn) releaseRegistrations() {
	b := &c.regBytes
	b.mu.Lock()
	defer b.mu.Unlock()
	c.e.inbound.regBytes.Add(-b.total)
	b.total, b.cost = 0, nil
}

func (c *wsConn) refuseRegistration(msg string, closing bool) {
	c.e.log.Warn("registration refused: over a limit", "worker_id", c.w.id, "reason", msg)
	c.send(limitFrame(msg))
	if closing {
		c.shutdown(statusPolicyViolation, CodeLimitExceeded)
	}
}

// short quotes at most the first 64 bytes of an id in a message.
func short(id string) string {
	if len(id) > 64 {
		return quote(id[:64] + "…")
	}
	return quote(id)
}
