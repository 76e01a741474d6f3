package engine

import (
	"errors"
	"strings"

	"github.com/iii-sandbox/iii/protocol"
)

// LocalWorker is an in-process worker attached to the engine. It holds its
// (namespace, name) lease and its function leases exactly like a socket
// worker, and shows in engine::workers::list unless it is Internal.
type LocalWorker struct {
	e *Engine
	w *worker
}

// AttachLocalWorker claims the (namespace, name) lease for an in-process
// worker. A live worker holding the name in that namespace refuses it with
// a *protocol.ErrorBody coded WORKER_NAMESPACE_CONFLICT; a bad namespace
// with INVALID_NAMESPACE.
func (e *Engine) AttachLocalWorker(spec LocalWorkerSpec) (*LocalWorker, error) {
	if e.closed.Load() {
		return nil, ErrClosed
	}
	ns := spec.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	if err := validNamespace(ns); err != nil {
		return nil, err
	}
	name := sanitizeText(spec.Name)
	if name == "" {
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "local worker name is empty"}
	}
	w := newWorker(e, newID())
	w.principal = adminPrincipal
	w.internal = spec.Internal
	w.phase = nsResolved
	w.namespace = ns
	pid := spec.PID
	w.meta = workerMeta{
		Name:        name,
		Description: sanitizeText(spec.Description),
		Version:     spec.Version,
		Runtime:     spec.Runtime,
		Isolation:   spec.Isolation,
	}
	if pid != 0 {
		w.meta.PID = &pid
	}
	if holder := e.claimName(w, ns, name); holder != nil {
		w.cancel()
		return nil, &protocol.ErrorBody{Code: protocol.CodeWorkerNamespaceConflict,
			Message: "worker " + quote(name) + " is already connected in namespace " + ns + " (worker id " + holder.id + "); stop it or pick another name"}
	}
	e.addWorker(w)
	if e.closed.Load() {
		// Close may have missed it; do not leave it behind.
		w.teardown()
		return nil, ErrClosed
	}
	return &LocalWorker{e: e, w: w}, nil
}

// SetProcess changes what engine::workers::list shows of the process
// behind the worker (pid 0: none). The plugin host hands an adapter's
// publication, and the calls waiting on it, over to a new process this
// way instead of detaching the worker.
func (l *LocalWorker) SetProcess(pid int, version, isolation string) {
	l.w.mu.Lock()
	defer l.w.mu.Unlock()
	l.w.meta.Version, l.w.meta.Isolation = sanitizeText(version), sanitizeText(isolation)
	l.w.meta.PID = nil
	if pid != 0 {
		l.w.meta.PID = &pid
	}
}

// ID is the worker id, as listed by engine::workers::list.
func (l *LocalWorker) ID() string { return l.w.id }

// RegisterFunction publishes a function in the worker's namespace. Another
// live worker owning the same id there refuses it with a *protocol.ErrorBody
// coded FUNCTION_NAMESPACE_CONFLICT. Registering an id again replaces the
// previous definition and handler.
func (l *LocalWorker) RegisterFunction(def FunctionDef, h Handler) error {
	if h == nil {
		return errors.New("register " + def.ID + ": nil handler")
	}
	return l.register(def, h, false)
}

func (l *LocalWorker) register(def FunctionDef, h Handler, inline bool) error {
	if l.w.closing.Load() {
		return &protocol.ErrorBody{Code: protocol.CodeInvocationStopped, Message: "worker " + l.w.id + " is detached"}
	}
	if strings.TrimSpace(def.ID) == "" {
		return &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "function id is empty"}
	}
	f := &function{
		ns: l.w.namespace, id: def.ID, description: def.Description,
		requestSchema: def.RequestSchema, responseSchema: def.ResponseSchema, metadata: def.Metadata,
		owner: l.w, handler: h, inline: inline, privileged: def.Privileged,
	}
	if errb := l.e.registerFunction(l.w, f); errb != nil {
		return errb
	}
	return nil
}

// UnregisterFunction withdraws a function this worker owns.
func (l *LocalWorker) UnregisterFunction(id string) {
	l.e.reg.unregister(l.w, l.w.namespace, id)
}

// Detach releases the worker's leases. Calls in flight to its functions end
// with invocation_stopped and their handlers' contexts are cancelled.
func (l *LocalWorker) Detach() {
	l.w.teardown()
}
