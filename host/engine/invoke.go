package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/iii-sandbox/iii/protocol"
)

// codeInvocationError is upstream's code for an invocation the engine could
// not start (here: an invocation id that is already in flight).
const codeInvocationError = "invocation_error"

// callResult is the outcome of one invocation.
type callResult struct {
	result json.RawMessage
	err    *protocol.ErrorBody
}

// pendingCall is an invocation forwarded to a socket worker and not yet
// answered. The caller is a socket worker (answered with a frame) or an
// in-process caller (answered on waiter).
type pendingCall struct {
	id         string
	functionID string
	target     *worker
	caller     *worker
	waiter     chan callResult
	// charged is the caller's connection, which the call's cost is
	// reserved on until it is answered or dropped (budget.go).
	charged *wsConn
	cost    int64
}

const pendingShards = 64

// pendingTable is the engine-wide map of in-flight invocations by id,
// sharded so concurrent calls do not contend on one lock.
type pendingTable struct {
	seed   maphash.Seed
	shards [pendingShards]pendingShard
}

type pendingShard struct {
	mu sync.Mutex
	m  map[string]*pendingCall
	_  [40]byte // keep shards on separate cache lines
}

func (t *pendingTable) init(seed maphash.Seed) {
	t.seed = seed
	for i := range t.shards {
		t.shards[i].m = make(map[string]*pendingCall)
	}
}

func (t *pendingTable) shard(id string) *pendingShard {
	return &t.shards[maphash.String(t.seed, id)%pendingShards]
}

// insert adds p; false means the id is already in flight.
func (t *pendingTable) insert(p *pendingCall) bool {
	s := t.shard(p.id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.m[p.id]; dup {
		return false
	}
	s.m[p.id] = p
	return true
}

// take removes and returns the call id if from is the worker it was routed
// to: only the target may answer a call.
func (t *pendingTable) take(id string, from *worker) *pendingCall {
	s := t.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.m[id]
	if p == nil || p.target != from {
		return nil
	}
	delete(s.m, id)
	return p
}

// remove deletes exactly p; whoever removes an entry owns answering it.
func (t *pendingTable) remove(p *pendingCall) bool {
	s := t.shard(p.id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[p.id] != p {
		return false
	}
	delete(s.m, p.id)
	return true
}

func (t *pendingTable) collect(match func(*pendingCall) bool) []*pendingCall {
	var out []*pendingCall
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for id, p := range s.m {
			if match(p) {
				delete(s.m, id)
				out = append(out, p)
			}
		}
		s.mu.Unlock()
	}
	return out
}

// stopTarget ends every call routed to w with invocation_stopped: w is gone
// and will never answer them.
func (t *pendingTable) stopTarget(w *worker) {
	calls := t.collect(func(p *pendingCall) bool { return p.target == w })
	for _, p := range calls {
		w.active.Add(-1)
		w.e.deliver(p, nil, &protocol.ErrorBody{Code: protocol.CodeInvocationStopped,
			Message: "worker " + w.id + " disconnected before answering " + p.functionID}, "", "")
	}
}

// dropCaller forgets every call socket worker w made that is still
// unanswered: w is gone, nobody will read the answers, and what the calls
// hold is released now rather than when (if ever) their targets answer.
func (t *pendingTable) dropCaller(w *worker) {
	for _, p := range t.collect(func(p *pendingCall) bool { return p.caller == w }) {
		p.target.active.Add(-1)
		p.settle()
	}
}

// settle releases what the call was charged to its caller; once.
func (p *pendingCall) settle() {
	if c := p.charged; c != nil {
		p.charged = nil
		c.releaseCall(p.cost)
	}
}

func (t *pendingTable) failAll(body *protocol.ErrorBody) {
	for _, p := range t.collect(func(*pendingCall) bool { return true }) {
		p.target.active.Add(-1)
		p.target.e.deliver(p, nil, body, "", "")
	}
}

// deliver hands a result to whoever made the call. A caller that has gone
// away is simply not answered.
func (e *Engine) deliver(p *pendingCall, result json.RawMessage, errb *protocol.ErrorBody, traceparent, baggage string) {
	p.settle()
	if p.waiter != nil {
		// result may point into the answering connection's read buffer.
		p.waiter <- callResult{result: clone(result), err: errb}
		return
	}
	if p.caller != nil && !p.caller.closing.Load() {
		p.caller.conn.send(appendResultFrame(nil, p.id, p.functionID, result, errb, traceparent, baggage))
	}
}

// handleResult routes an invocationresult from worker b to the caller.
func (e *Engine) handleResult(b *worker, id string, result json.RawMessage, errb *protocol.ErrorBody, traceparent, baggage string) {
	p := e.pending.take(id, b)
	if p == nil {
		// Late (the call was stopped) or unknown: nobody is waiting.
		e.log.Debug("dropping invocationresult nobody waits for", "worker_id", b.id, "invocation_id", id)
		return
	}
	b.active.Add(-1)
	e.deliver(p, result, errb, traceparent, baggage)
}

// invokeRequest is an invokefunction as the router needs it; the hot path
// fills it without a full decode.
type invokeRequest struct {
	invocationID string
	functionID   string
	data         json.RawMessage
	metadata     json.RawMessage
	traceparent  string
	baggage      string
	namespace    *string
	action       *protocol.TriggerAction
	// inPlace, when set, runs the call's in-process handler on the
	// calling read loop's goroutine (see runLocal).
	inPlace inPlaceRunner
}

// inPlaceRunner runs an in-process handler on the goroutine of the read
// loop that read its frame; handedOff reports that another goroutine now
// reads the connection, so the caller must stop reading.
type inPlaceRunner func(run func()) (handedOff bool)

func (e *Engine) handleInvoke(a *worker, m *protocol.InvokeFunction, inPlace inPlaceRunner) (handedOff bool) {
	return e.routeInvoke(a, &invokeRequest{
		invocationID: m.InvocationID, functionID: m.FunctionID, data: m.Data, metadata: m.Metadata,
		traceparent: m.Traceparent, baggage: m.Baggage, namespace: m.Namespace, action: m.Action,
		inPlace: inPlace,
	})
}

// routeInvoke serves an invokefunction from socket worker a
// (spec/engine-internals.md §1.5). handedOff reports that the calling read
// loop ran an in-process handler and another goroutine now reads the
// connection: the caller must stop reading.
func (e *Engine) routeInvoke(a *worker, r *invokeRequest) (handedOff bool) {
	answer := func(errb *protocol.ErrorBody) {
		if r.invocationID != "" {
			a.conn.send(appendResultFrame(nil, r.invocationID, r.functionID, nil, errb, "", ""))
		}
	}
	if r.action != nil {
		switch r.action.Type {
		case protocol.ActionVoid:
			r.invocationID = ""
		case protocol.ActionEnqueue:
			// Handed to the queue provider (enqueue.go) once the call
			// has passed the same checks as a direct one.
		default:
			answer(&protocol.ErrorBody{Code: protocol.CodeInvalidFrame,
				Message: fmt.Sprintf("invalid frame: unknown action type %q (want void or enqueue, or no action)", r.action.Type)})
			return false
		}
	}
	if errb := a.conn.checkCallIDs(r); errb != nil {
		answer(errb)
		return false
	}
	ns := DefaultNamespace
	if r.namespace != nil {
		if errb := validNamespace(*r.namespace); errb != nil {
			answer(errb)
			return false
		}
		ns = *r.namespace
	}
	f := e.reg.get(ns, r.functionID)
	if a.delegations.Load() > 0 || e.enqueued.n.Load() > 0 {
		// a may be a provider calling for another principal.
		if errb := e.checkDelegated(a, ns, r.functionID, f); errb != nil {
			answer(errb)
			return false
		}
	}
	if p := a.principal; !p.admin {
		if errb := p.authorizeInvoke(ns, r.functionID, f); errb != nil {
			e.log.Debug("invoke refused", "worker_id", a.id, "function_id", r.functionID, "namespace", ns, "code", errb.Code)
			answer(errb)
			return false
		}
		if mw := e.middlewareFor(p, f); mw != "" {
			e.viaMiddleware(a, p, mw, ns, r)
			return false
		}
	}
	if r.action != nil && r.action.Type == protocol.ActionEnqueue {
		// As iii: the target need not exist yet; the queue resolves it
		// when it delivers, with the provider's rights. So a target that
		// is not there to check may not have a privileged function's name.
		if f == nil && !a.principal.admin && privilegedByName(r.functionID) {
			answer(&protocol.ErrorBody{Code: CodeForbidden, Message: "cannot enqueue " + r.functionID +
				": it is not registered, and a privileged function's id (under " + strings.Join(reservedPrefixes, ", ") +
				", stream::*, <adapter>::worker::*) may be enqueued without the engine token only once its function exists"})
			return false
		}
		e.enqueue(a, ns, r)
		return false
	}
	if f == nil {
		if r.invocationID == "" {
			e.log.Debug("void call to a missing function", "worker_id", a.id, "function_id", r.functionID, "namespace", ns)
		}
		answer(notFound(ns, r.functionID, e.reg.namespacesOf(r.functionID)))
		return false
	}
	// What the call holds until it is answered is charged to its caller
	// (a void call to a socket worker holds nothing here: its frame is the
	// target's outbound queue's).
	var cost int64
	var release func()
	if r.invocationID != "" || f.owner.conn == nil || f.http != nil {
		cost = a.conn.callCost(r)
		if errb := a.conn.chargeCall(cost); errb != nil {
			e.log.Debug("call refused: over a limit", "worker_id", a.id, "function_id", r.functionID, "reason", errb.Message)
			answer(errb)
			return false
		}
		if f.owner.conn == nil || f.http != nil {
			// A call to a socket worker is released with its pending
			// entry (settle): no closure on the hot path.
			var once sync.Once
			release = func() { once.Do(func() { a.conn.releaseCall(cost) }) }
		}
	}
	data := injectCaller(r.data, a.id)

	if f.owner.conn == nil {
		// The handler keeps its input beyond this frame, and the frame's
		// buffer is reused: copy.
		call := &Call{InvocationID: r.invocationID, FunctionID: r.functionID, Namespace: ns, CallerWorkerID: a.id,
			CallerAdmin: a.principal.admin, Caller: callerOf(a), Data: clone(data), Metadata: clone(r.metadata), Traceparent: r.traceparent, Baggage: r.baggage}
		var reply func(callResult)
		if r.invocationID != "" {
			send := resultSender(a, r.invocationID, r.functionID, "", "")
			reply = func(res callResult) { release(); send(res.result, res.err) }
		} else {
			reply = func(res callResult) {
				release()
				if res.err != nil {
					e.log.Debug("void call failed", "function_id", f.id, "code", res.err.Code, "message", res.err.Message)
				}
			}
		}
		return e.runLocal(f.owner.ctx, f, call, reply, r.inPlace)
	}
	if f.http != nil {
		e.invokeHTTPFor(a, f, r, data, release)
		return false
	}

	target := f.owner
	frame := appendInvokeFrame(nil, r.invocationID, f.workerID(), data, r.metadata, r.traceparent, r.baggage)
	if r.invocationID == "" {
		target.conn.send(frame)
		return false
	}
	p := &pendingCall{id: r.invocationID, functionID: r.functionID, target: target, caller: a, charged: a.conn, cost: cost}
	if !e.pending.insert(p) {
		p.settle()
		answer(&protocol.ErrorBody{Code: codeInvocationError, Message: "invocation id " + r.invocationID + " is already in flight"})
		return false
	}
	target.active.Add(1)
	if a.closing.Load() && e.pending.remove(p) {
		// The caller's teardown swept the table before this call was in it.
		target.active.Add(-1)
		p.settle()
		return false
	}
	// The target's teardown sets closing before it sweeps the pending table,
	// so either that sweep sees this call or this check sees closing.
	if target.closing.Load() || !target.conn.send(frame) {
		if e.pending.remove(p) {
			target.active.Add(-1)
			e.deliver(p, nil, &protocol.ErrorBody{Code: protocol.CodeInvocationStopped,
				Message: "worker " + target.id + " disconnected before answering " + r.functionID}, "", "")
		}
	}
	return false
}

func httpNotInvokable(f *function) *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: protocol.CodeFunctionNotInvokable,
		Message: "function " + f.id + " is registered as an HTTP-invoked function and iii-http-functions is not running"}
}

// runLocal runs an in-process handler. Inline handlers (builtins) run on
// the calling goroutine. Others run in place when the caller is a
// connection's read loop (inPlace; it moves the reading to a new goroutine
// if the handler runs long), and otherwise on a goroutine of their own.
// Running in place spares each call to the router or the plugin host a
// goroutine start and, more costly, the wake-up of an idle thread to run
// it. When the owning worker detaches first, the caller is answered with
// invocation_stopped at once and the handler's eventual result is dropped.
// handedOff is inPlace's.
func (e *Engine) runLocal(ctx context.Context, f *function, call *Call, reply func(callResult), inPlace inPlaceRunner) (handedOff bool) {
	if f.inline {
		reply(callHandler(ctx, f.handler, call))
		return false
	}
	owner := f.owner
	stopped := func() callResult {
		return callResult{err: &protocol.ErrorBody{Code: protocol.CodeInvocationStopped,
			Message: "worker " + owner.id + " detached before answering " + f.id}}
	}
	if !e.tasks.Add() {
		reply(stopped())
		return false
	}
	owner.active.Add(1)
	var answered atomic.Bool
	finish := func(res callResult) {
		if answered.CompareAndSwap(false, true) {
			owner.active.Add(-1)
			reply(res)
		}
	}
	stop := context.AfterFunc(owner.ctx, func() { finish(stopped()) })
	run := func() {
		defer e.tasks.Done()
		res := callHandler(ctx, f.handler, call)
		stop()
		if owner.ctx.Err() != nil {
			// The handler saw the detach too; its answer is moot.
			res = stopped()
		}
		finish(res)
	}
	if inPlace != nil {
		return inPlace(run)
	}
	go run()
	return false
}

// callLocalInPlace runs a non-inline in-process handler on the calling
// goroutine, with the same bookkeeping as runLocal.
func (e *Engine) callLocalInPlace(ctx context.Context, f *function, call *Call) callResult {
	owner := f.owner
	stopped := callResult{err: &protocol.ErrorBody{Code: protocol.CodeInvocationStopped,
		Message: "worker " + owner.id + " detached before answering " + f.id}}
	if !e.tasks.Add() {
		return stopped
	}
	defer e.tasks.Done()
	owner.active.Add(1)
	defer owner.active.Add(-1)
	res := callHandler(ctx, f.handler, call)
	if owner.ctx.Err() != nil {
		return stopped
	}
	return res
}

// callHandler runs h, turning its error into the wire error body and a
// panic into invocation_failed rather than a crashed engine.
func callHandler(ctx context.Context, h Handler, call *Call) (res callResult) {
	defer func() {
		if r := recover(); r != nil {
			res = callResult{err: &protocol.ErrorBody{Code: protocol.CodeInvocationFailed,
				Message: fmt.Sprintf("handler for %s panicked: %v", call.FunctionID, r), Stacktrace: string(debug.Stack())}}
		}
	}()
	out, err := h(ctx, call)
	if err != nil {
		return callResult{err: toErrorBody(err)}
	}
	return callResult{result: out}
}

func toErrorBody(err error) *protocol.ErrorBody {
	var eb *protocol.ErrorBody
	if errors.As(err, &eb) && eb != nil {
		return eb
	}
	return &protocol.ErrorBody{Code: protocol.CodeInvocationFailed, Message: err.Error()}
}

// invokeResolved is Engine.Invoke after resolution.
func (e *Engine) invokeResolved(ctx context.Context, f *function, call *Call) (json.RawMessage, error) {
	if f.owner.conn == nil {
		hctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(f.owner.ctx, cancel)
		defer stop()
		if f.inline {
			r := callHandler(hctx, f.handler, call)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return unwrap(r)
		}
		// The caller waits anyway, so the handler runs on its goroutine:
		// no handoff on the in-process hop (the router's forward to an
		// adapter). The owner detaching cancels hctx; handlers honour their
		// context, and the answer is then invocation_stopped.
		r := e.callLocalInPlace(hctx, f, call)
		if ctx.Err() != nil {
			// The handler gave up because the caller did.
			return nil, ctx.Err()
		}
		return unwrap(r)
	}
	if f.http != nil {
		return e.invokeHTTP(ctx, f, call.Data)
	}
	target := f.owner
	p := &pendingCall{id: newID(), functionID: f.id, target: target, waiter: make(chan callResult, 1)}
	if !e.pending.insert(p) {
		return nil, &protocol.ErrorBody{Code: codeInvocationError, Message: "invocation id collision"}
	}
	target.active.Add(1)
	frame := appendInvokeFrame(nil, p.id, f.workerID(), call.Data, call.Metadata, call.Traceparent, call.Baggage)
	if target.closing.Load() || !target.conn.send(frame) {
		if e.pending.remove(p) {
			target.active.Add(-1)
			return nil, &protocol.ErrorBody{Code: protocol.CodeInvocationStopped,
				Message: "worker " + target.id + " disconnected before answering " + f.id}
		}
	}
	select {
	case r := <-p.waiter:
		return unwrap(r)
	case <-ctx.Done():
		if e.pending.remove(p) {
			target.active.Add(-1)
		}
		return nil, ctx.Err()
	}
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

func unwrap(r callResult) (json.RawMessage, error) {
	if r.err != nil {
		return nil, r.err
	}
	return r.result, nil
}
