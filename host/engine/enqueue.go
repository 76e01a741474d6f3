package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/iii-sandbox/iii/protocol"
)

// An invoke with action {type: enqueue, queue} is not a queue of the
// engine's own: as in iii 0.26, the engine gives the call a receipt id and
// hands it to the queue provider, the function engine::queue::enqueue that
// the standalone queue worker registers (a Compose worker, `iii worker add
// queue`), which stores it and later invokes the target. Without a
// provider the caller gets enqueue_error saying how to install one
// (docs/queues.md). engine:: ids are reserved to the engine token's holder
// (and this one to a queue provider credential's, which Compose gives the
// queue package), so only a trusted worker can be the provider, and the caller's own right
// to invoke the target is checked before anything is handed over (the
// provider invokes with its rights, not the caller's).

// EnqueueProviderFunctionID is the queue provider's function.
const EnqueueProviderFunctionID = "engine::queue::enqueue"

// CodeEnqueueError is the code of every failed enqueue, as iii's.
const CodeEnqueueError = "enqueue_error"

// enqueueTimeout bounds the hand-over to the provider.
const enqueueTimeout = 30 * time.Second

// maxEnqueuesInFlight caps the hand-overs waiting on the provider at once,
// across all callers: a flood of enqueues to a slow provider gets
// enqueue_error at once rather than a goroutine each.
const maxEnqueuesInFlight = 1024

// maxEnqueuesPerConnection caps the hand-overs one connection has waiting
// at once, so a caller alone cannot take every one of maxEnqueuesInFlight.
const maxEnqueuesPerConnection = maxEnqueuesInFlight / 4

// enqueue hands r to the queue provider and answers the caller with
// {"messageReceiptId": id} once the provider took it.
func (e *Engine) enqueue(a *worker, ns string, r *invokeRequest) {
	receipt := newID()
	in := map[string]any{
		"queue":            r.action.Queue,
		"function_id":      r.functionID,
		"data":             json.RawMessage(orNull(r.data)),
		"messageReceiptId": receipt,
		"traceparent":      nilIfEmpty(r.traceparent),
		"baggage":          nilIfEmpty(r.baggage),
	}
	if ns != DefaultNamespace {
		// Providers that predate namespaces refuse unknown fields.
		in["namespace"] = ns
	}
	send := resultSender(a, r.invocationID, r.functionID, r.traceparent, r.baggage)
	void, fid, queue := r.invocationID == "", r.functionID, r.action.Queue
	if !a.principal.admin && !e.enqueued.add(fnKey{ns, fid}, Caller{p: a.principal, workerID: a.id, via: "enqueue"}) {
		// The provider delivers later from its own connection; without a
		// record of who enqueued, the delivery could not be checked as them.
		send(nil, &protocol.ErrorBody{Code: CodeEnqueueError, Message: fmt.Sprintf(
			"the engine already remembers %d enqueuers of distinct targets; enqueue with the engine token or to a target already enqueued", maxEnqueueDelegations)})
		return
	}
	reply := func(res json.RawMessage, errb *protocol.ErrorBody) {
		if errb != nil && void {
			e.log.Warn("enqueue failed", "worker_id", a.id, "function_id", fid, "queue", queue, "code", errb.Code, "error", errb.Message)
		}
		send(res, errb)
	}
	payload, err := json.Marshal(in)
	if err != nil {
		reply(nil, &protocol.ErrorBody{Code: CodeEnqueueError, Message: "encode the enqueue request: " + err.Error()})
		return
	}
	// The hand-over holds the payload until the provider took it: charged
	// to the enqueuer like a call it awaits (void or not), so one caller
	// cannot park more than its in-flight budget here. Released when the
	// hand-over ends (within enqueueTimeout, the caller gone or not: its
	// enqueue is not lost because it left).
	cost := a.conn.heldCost(r, len(payload))
	if errb := a.conn.chargeEnqueue(cost); errb != nil {
		e.log.Debug("enqueue refused: over a limit", "worker_id", a.id, "function_id", fid, "reason", errb.Message)
		reply(nil, errb)
		return
	}
	select {
	case e.enqueues <- struct{}{}:
	default:
		a.conn.releaseEnqueue(cost)
		reply(nil, &protocol.ErrorBody{Code: CodeEnqueueError, Message: fmt.Sprintf(
			"%d enqueues are already waiting on the queue provider %s; try again later", maxEnqueuesInFlight, EnqueueProviderFunctionID)})
		return
	}
	started := e.tasks.Go(func() {
		defer func() { <-e.enqueues; a.conn.releaseEnqueue(cost) }()
		ctx, cancel := context.WithTimeout(e.ctx, enqueueTimeout)
		defer cancel()
		_, err := e.Invoke(ctx, DefaultNamespace, EnqueueProviderFunctionID, payload)
		if err == nil {
			out, _ := json.Marshal(map[string]string{"messageReceiptId": receipt})
			reply(out, nil)
			return
		}
		var eb *protocol.ErrorBody
		msg := err.Error()
		if asErrorBody(err, &eb) {
			if eb.Code == protocol.CodeFunctionNotFound {
				msg = "No queue provider is installed. An enqueue action routes through the " + EnqueueProviderFunctionID +
					" provider, which the standalone queue worker registers. Add it with `iii worker add queue`. This engine reserves engine::queue::enqueue to the engine token's holder and to the queue package Compose starts from its default registry (package://queue), which it gives a narrow provider credential (docs/queues.md). (underlying: " + eb.Message + ")"
			} else {
				msg = eb.Code + ": " + eb.Message
			}
		}
		reply(nil, &protocol.ErrorBody{Code: CodeEnqueueError, Message: msg})
	})
	if !started {
		<-e.enqueues
		a.conn.releaseEnqueue(cost)
		reply(nil, engineStopping())
	}
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
