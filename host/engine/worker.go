package engine

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/iii-sandbox/iii/protocol"
)

// nsPhase is the namespace-resolution state of a connection
// (spec/engine-internals.md §1.2 step 5). Registrations that arrive before
// the worker says which namespace it lives in are held, in order, until it
// does (or the grace time passes), so they land in the right namespace.
type nsPhase int

const (
	nsPending  nsPhase = iota // registrations are queued
	nsDraining                // namespace fixed; the queue is being applied
	nsResolved                // queue empty; registrations apply at once
	nsAborted                 // torn down; registrations are dropped
)

// workerMeta is what a worker reports about itself through
// engine::workers::register (or its LocalWorkerSpec).
type workerMeta struct {
	Name        string
	Description string
	Version     string
	Runtime     string
	OS          string
	PID         *int
	Isolation   string
	Telemetry   json.RawMessage
}

// worker is one participant in routing: a WebSocket connection or an
// in-process LocalWorker. Both hold leases the same way.
type worker struct {
	e           *Engine
	id          string
	conn        *wsConn // nil for in-process workers
	internal    bool
	connectedAt time.Time
	ip          string
	// principal is who the worker speaks for, fixed at its handshake.
	principal *principal

	// ctx ends at teardown; in-process handlers run under it.
	ctx    context.Context
	cancel context.CancelFunc
	// closing is set first thing in teardown: from then on the worker's
	// leases never block anyone else's claim.
	closing      atomic.Bool
	teardownOnce sync.Once
	done         chan struct{} // closed when teardown has finished

	active atomic.Int64 // in-flight invocations routed to this worker

	// warnedUnknownFrame: the worker sent a frame type this engine does
	// not speak and was told so in the log once (unknownFrame).
	warnedUnknownFrame atomic.Bool

	// delegated holds, under the trigger registry's lock, the bindings
	// of other principals whose function or condition this worker, as
	// their trigger type's provider, calls for them (authority.go);
	// delegations counts them for the invoke path's gate.
	delegated   map[fnKey][]*binding
	delegations atomic.Int64

	mu        sync.Mutex
	phase     nsPhase
	namespace string
	queue     []protocol.Message
	grace     *time.Timer
	meta      workerMeta
	lease     nameKey // the (namespace, name) lease this worker holds
	hasLease  bool
	functions map[string]struct{}
	services  map[string]protocol.RegisterService
}

func newWorker(e *Engine, id string) *worker {
	ctx, cancel := context.WithCancel(e.ctx)
	return &worker{
		e:           e,
		id:          id,
		connectedAt: time.Now(),
		ctx:         ctx,
		cancel:      cancel,
		done:        make(chan struct{}),
		functions:   make(map[string]struct{}),
		services:    make(map[string]protocol.RegisterService),
	}
}

// ns returns the worker's namespace as far as it is known: the pinned one,
// or DefaultNamespace while it is still pending.
func (w *worker) ns() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.namespace == "" {
		return DefaultNamespace
	}
	return w.namespace
}

func (w *worker) name() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.meta.Name
}

// submit queues a registration frame while the namespace is unknown, and
// applies it directly once it is resolved. Frames arriving while the queue
// drains go to its back, so the worker's order is kept.
func (w *worker) submit(m protocol.Message) {
	w.mu.Lock()
	switch w.phase {
	case nsResolved:
		ns := w.namespace
		w.mu.Unlock()
		w.e.applyRegistration(w, ns, m)
	case nsAborted:
		w.mu.Unlock()
	default:
		w.queue = append(w.queue, m)
		w.mu.Unlock()
	}
}

// pinNamespace fixes the worker's namespace if it is still pending, then
// applies the queued registrations in arrival order. It returns the
// namespace now in force: first writer wins, so a later, different request
// is forced to the one already fixed.
func (w *worker) pinNamespace(ns string) string {
	w.mu.Lock()
	if w.phase != nsPending {
		fixed := w.namespace
		w.mu.Unlock()
		return fixed
	}
	w.phase = nsDraining
	w.namespace = ns
	if w.grace != nil {
		w.grace.Stop()
		w.grace = nil
	}
	for {
		if w.phase == nsAborted {
			w.mu.Unlock()
			return ns
		}
		if len(w.queue) == 0 {
			w.phase = nsResolved
			w.queue = nil
			w.mu.Unlock()
			return ns
		}
		m := w.queue[0]
		w.queue[0] = nil
		w.queue = w.queue[1:]
		w.mu.Unlock()
		w.e.applyRegistration(w, ns, m)
		w.mu.Lock()
	}
}

// startGrace arms the namespace grace timer: a worker that never calls
// engine::workers::register still gets its registrations, in default.
func (w *worker) startGrace(d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.phase != nsPending {
		return
	}
	w.grace = time.AfterFunc(d, func() {
		if !w.e.tasks.Add() {
			return
		}
		defer w.e.tasks.Done()
		w.mu.Lock()
		pending := w.phase == nsPending
		w.mu.Unlock()
		if !pending {
			return
		}
		ns, ok := w.graceNamespace()
		if !ok {
			w.e.log.Warn("namespace grace elapsed and this session may not use default; dropping its registrations", "worker_id", w.id)
			w.abortRegistrations()
			return
		}
		w.e.log.Debug("namespace grace elapsed", "worker_id", w.id, "namespace", ns)
		w.pinNamespace(ns)
	})
}

// teardown releases everything the worker holds (spec §1.2 step 7). It is
// idempotent; concurrent callers wait for the first to finish.
func (w *worker) teardown() {
	w.teardownOnce.Do(func() {
		e := w.e
		w.closing.Store(true)
		w.cancel()

		w.mu.Lock()
		w.phase = nsAborted
		w.queue = nil
		if w.grace != nil {
			w.grace.Stop()
			w.grace = nil
		}
		ns := w.namespace
		if ns == "" {
			ns = DefaultNamespace
		}
		fns := make([]string, 0, len(w.functions))
		for id := range w.functions {
			fns = append(fns, id)
		}
		w.functions = map[string]struct{}{}
		w.services = map[string]protocol.RegisterService{}
		w.mu.Unlock()

		e.reg.removeOwned(w, ns, fns)
		e.pending.stopTarget(w)
		e.pending.dropCaller(w)
		e.triggers.workerGone(e, w)
		e.channels.removeOwned(w.id)
		e.releaseName(w)
		e.removeWorker(w)
		close(w.done)
		e.log.Debug("worker gone", "worker_id", w.id)
	})
	<-w.done
}

type nameKey struct{ ns, name string }

// claimName takes the (namespace, name) lease for w. A live holder other than
// w refuses the claim; a holder that is already tearing down never does, so a
// restarted worker is not locked out by its own previous connection.
func (e *Engine) claimName(w *worker, ns, name string) *worker {
	k := nameKey{ns, name}
	e.namesMu.Lock()
	defer e.namesMu.Unlock()
	if holder, ok := e.names[k]; ok && holder != w && !holder.closing.Load() {
		if !e.takeName(w, holder, ns, name) {
			return holder
		}
	}
	if w.closing.Load() {
		return nil
	}
	w.mu.Lock()
	prev, hadLease := w.lease, w.hasLease
	w.lease, w.hasLease = k, true
	w.mu.Unlock()
	if hadLease && prev != k && e.names[prev] == w {
		delete(e.names, prev)
	}
	e.names[k] = w
	return nil
}

func (e *Engine) releaseName(w *worker) {
	e.namesMu.Lock()
	defer e.namesMu.Unlock()
	w.mu.Lock()
	k, ok := w.lease, w.hasLease
	w.mu.Unlock()
	if ok && e.names[k] == w {
		delete(e.names, k)
	}
}

// validNamespace enforces the namespace alphabet. There is no coercion:
// "Orders" is refused, not lower-cased.
func validNamespace(ns string) *protocol.ErrorBody {
	if strings.TrimSpace(ns) == "" {
		return &protocol.ErrorBody{Code: protocol.CodeInvalidNamespace,
			Message: "namespace is blank; omit it for default or use [a-z0-9_-]"}
	}
	if !namespaceChars(ns) {
		return &protocol.ErrorBody{Code: protocol.CodeInvalidNamespace,
			Message: "namespace " + quote(ns) + " is invalid; use only lowercase letters, digits, '_' and '-'"}
	}
	return nil
}

func namespaceChars(ns string) bool {
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return ns != ""
}

// maxWorkerText caps self-reported names and descriptions: they are shown
// on consoles and must not carry control or bidi characters there.
const maxWorkerText = 280

func sanitizeText(s string) string {
	var b strings.Builder
	n := 0
	for _, r := range s {
		if n >= maxWorkerText {
			break
		}
		if unicode.IsControl(r) || (r >= 0x202A && r <= 0x202E) || (r >= 0x2066 && r <= 0x2069) || r == 0x2028 || r == 0x2029 {
			continue
		}
		b.WriteRune(r)
		n++
	}
	return strings.TrimSpace(b.String())
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// graceNamespace is where the registrations of a worker that never said its
// namespace land: default, or for a session scoped to namespaces that do
// not include default, its only namespace; ok false when it has several.
func (w *worker) graceNamespace() (string, bool) {
	p := w.principal
	if p == nil || p.admin || p.session == nil || p.session.MayDeclare(DefaultNamespace) {
		return DefaultNamespace, true
	}
	if nss := p.session.DeclarableNamespaces(); len(nss) == 1 {
		return nss[0], true
	}
	return "", false
}

// abortRegistrations drops the registrations queued while the namespace
// was pending; later ones are dropped too.
func (w *worker) abortRegistrations() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.phase == nsPending {
		w.phase = nsAborted
		w.queue = nil
	}
}
