package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"

	"github.com/iii-sandbox/iii/protocol"
)

// MaxHTTPCalls bounds the HTTP-invocation calls in flight across the
// engine; one more is answered LIMIT_EXCEEDED (docs/http-functions.md).
const MaxHTTPCalls = 1024

// HTTPInvoker is the iii-http-functions worker's invoker as the engine
// calls it: what makes the requests (the URL rules, a dialer that checks
// the address it connects to, auth, capped answers) is host/httpfn, and
// the layer above the engine hands it in with SetHTTPFunctions
// (httpfn.EngineHook). It is an interface because the engine may import
// only protocol and internal/ (docs/architecture.md, "Layers"). The
// engine compares invokers with ==, so an implementation must be
// comparable (a pointer, or a struct of pointers).
type HTTPInvoker interface {
	// Prepare checks a registration's invocation reference: an error
	// body refuses the registration; otherwise endpoint is what to call,
	// which the engine keeps with the function without looking into it.
	Prepare(ref *protocol.HTTPInvocationRef) (endpoint any, errb *protocol.ErrorBody)
	// Invoke calls an endpoint Prepare returned, possibly a previous
	// invoker's (a new security: block applies to functions registered
	// before it), for function functionID with data as the body; the
	// request ends when ctx does.
	Invoke(ctx context.Context, endpoint any, functionID string, data json.RawMessage) (json.RawMessage, *protocol.ErrorBody)
	// Close drops its idle connections: the engine no longer calls it.
	Close()
}

// httpFunctions is the engine's side of the iii-http-functions worker:
// the invoker in force (nil while config.yaml does not run the worker) and
// the calls in flight.
type httpFunctions struct {
	inv      atomic.Pointer[HTTPInvoker]
	inflight atomic.Int64
}

// invoker is the invoker in force; nil while the worker is off.
func (h *httpFunctions) invoker() HTTPInvoker {
	if p := h.inv.Load(); p != nil {
		return *p
	}
	return nil
}

// SetHTTPFunctions runs the iii-http-functions worker with inv, or stops it
// (nil). While it runs, registrations with an HTTP invocation are checked
// and admitted, and the engine calls their endpoints; a new inv (a changed
// security: block) applies to the next call of every such function.
// Stopping it drops every HTTP-invocation function, as upstream never
// registers one without the worker: callers then get function_not_found,
// and new registrations are refused.
func (e *Engine) SetHTTPFunctions(inv HTTPInvoker) {
	var next *HTTPInvoker
	if inv != nil {
		next = &inv
	}
	if old := e.httpFns.inv.Swap(next); old != nil && *old != inv {
		(*old).Close()
	}
	if inv != nil {
		return
	}
	for _, f := range e.reg.snapshot() {
		if f.http != nil && e.reg.unregister(f.owner, f.ns, f.id) {
			e.log.Info("HTTP-invocation function dropped: iii-http-functions stopped", "namespace", f.ns, "function_id", f.id, "worker_id", f.owner.id)
		}
	}
}

// HTTPFunctions is the invoker in force; nil while the worker is off.
func (e *Engine) HTTPFunctions() HTTPInvoker { return e.httpFns.invoker() }

// admitHTTPFunction decides a registration that carries an HTTP
// invocation (docs/http-functions.md, "Who may register one"): the worker
// must run, an issued credential may not register one, only the engine
// token's holder may name engine environment variables in auth, and the
// reference must pass the invoker's checks. It keeps the checked endpoint
// in f.
func (e *Engine) admitHTTPFunction(w *worker, f *function) *protocol.ErrorBody {
	inv := e.httpFns.invoker()
	if inv == nil {
		return &protocol.ErrorBody{Code: protocol.CodeFunctionNotInvokable,
			Message: "function " + f.id + " has an HTTP invocation, and this engine does not run iii-http-functions: add `- name: iii-http-functions` to the workers of config.yaml (docs/http-functions.md)"}
	}
	if p := w.principal; p != nil && !p.admin {
		if p.cred != nil {
			return &protocol.ErrorBody{Code: CodeForbidden,
				Message: "function " + f.id + ": a connection with an issued credential may not register HTTP-invocation functions (the engine would make requests on its behalf from the host's network)"}
		}
		if a := f.http.Auth; len(a) > 0 && string(a) != "null" {
			return &protocol.ErrorBody{Code: CodeForbidden,
				Message: "function " + f.id + ": invocation.auth names environment variables of the engine; only a connection holding the engine token may register it"}
		}
	}
	ep, errb := inv.Prepare(f.http)
	if errb != nil {
		return errb
	}
	f.httpEP = ep
	return nil
}

// invokeHTTP calls f's endpoint with data. The call ends when ctx does or
// f's owner detaches (invocation_stopped).
func (e *Engine) invokeHTTP(ctx context.Context, f *function, data json.RawMessage) (json.RawMessage, error) {
	inv := e.httpFns.invoker()
	if inv == nil || f.httpEP == nil {
		return nil, httpNotInvokable(f)
	}
	if errb := e.httpRegistrantAllowed(f); errb != nil {
		e.refused(callerOf(f.owner), "HTTP invocation", f.ns, f.id, errb)
		return nil, errb
	}
	if n := e.httpFns.inflight.Add(1); n > MaxHTTPCalls {
		e.httpFns.inflight.Add(-1)
		return nil, &protocol.ErrorBody{Code: CodeLimitExceeded,
			Message: fmt.Sprintf("%d HTTP-invocation calls are in flight, the engine's limit; retry when some have finished", MaxHTTPCalls)}
	}
	defer e.httpFns.inflight.Add(-1)
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(f.owner.ctx, cancel)
	defer stop()
	res, errb := inv.Invoke(hctx, f.httpEP, f.id, data)
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case errb != nil && f.owner.ctx.Err() != nil:
		return nil, &protocol.ErrorBody{Code: protocol.CodeInvocationStopped,
			Message: "worker " + f.owner.id + " disconnected while the engine called " + f.id}
	case errb != nil:
		return nil, errb
	}
	if res == nil {
		res = json.RawMessage("null")
	}
	return res, nil
}

// invokeHTTPFor serves socket caller a's invocation of an HTTP-invocation
// function on a goroutine of its own: the request may take up to its
// timeout, and the caller's read loop must not wait for it. The call ends
// when the caller disconnects.
func (e *Engine) invokeHTTPFor(a *worker, f *function, r *invokeRequest, data json.RawMessage, done func()) {
	send := resultSender(a, r.invocationID, r.functionID, "", "")
	void := r.invocationID == ""
	// The frame's buffer is reused once this returns.
	data = clone(data)
	started := e.tasks.Go(func() {
		defer done()
		res, err := e.invokeHTTP(a.ctx, f, data)
		switch {
		case void && err != nil:
			e.log.Debug("void call failed", "function_id", f.id, "error", err)
		case err != nil:
			send(nil, toErrorBody(err))
		default:
			send(res, nil)
		}
	})
	if !started {
		done()
		send(nil, engineStopping())
	}
}

// httpRegistrantAllowed checks, when the engine is about to make an HTTP
// invocation's request, that the worker that registered the function
// could still register it: the request goes where the registrant chose
// and with what it was allowed to attach, so it runs on its authority
// (docs/security.md, "Authority when a call runs").
func (e *Engine) httpRegistrantAllowed(f *function) *protocol.ErrorBody {
	p := f.owner.principal
	if p == nil || p.admin {
		return nil
	}
	if p.cred != nil {
		return &protocol.ErrorBody{Code: CodeForbidden,
			Message: "function " + f.id + " was registered by a connection with an issued credential, which may not have the engine make HTTP requests"}
	}
	if a := f.http.Auth; len(a) > 0 && string(a) != "null" {
		return &protocol.ErrorBody{Code: CodeForbidden,
			Message: "function " + f.id + ": invocation.auth names environment variables of the engine, and its registrant does not hold the engine token"}
	}
	return nil
}
