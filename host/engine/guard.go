package engine

import (
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/protocol"
)

// RegistrationGuard is the policy on names and scoped credentials that the
// engine consults but does not define: who besides the engine token's
// holder may register which function ids, which worker takes a contested
// worker name, which connections are heartbeated, and what an issued
// credential's scope means. The sandbox router installs its own
// (host/router, "trust.go"), so the rules about adapters and sandbox hosts
// live with the router and the engine keeps the mechanisms: admission, the
// sweep and the eviction, the lease, the ping, the credential table.
//
// Without one installed (SetGuard) the engine uses a closed default: no
// credential carries a scope (issuing or loading one that would is
// refused), nothing is heartbeated, no name is taken over, and ids of the
// forms <name>::worker::* and <name>::host::* stay reserved to the engine
// token's holder, since they boot VMs and receive callers' data wherever
// something serves them. Refusing what it cannot judge is the safe side:
// an embedded engine never grants a scope nobody interprets.
type RegistrationGuard interface {
	// CredentialScope checks spec's scope block when a credential is
	// issued or read from the credentials file, after its namespaces.
	// scope is kept with the credential and shown back through
	// Principal.Scope, never looked into; claims is a name the
	// credential's holder is to own from its issue on (ReserveName), ""
	// for none. A refusal is the issuer's error.
	CredentialScope(spec CredentialSpec) (scope any, claims string, refusal *protocol.ErrorBody)
	// Reserve is told that name is now claimed (ReserveName); a guard
	// that reserves it judges again, with Engine.Reexamine, what others
	// registered under it.
	Reserve(name string)
	// AdmitFunction judges the registration of id in ns by p before it
	// enters the registry, and again after its insert and on Reexamine: a
	// refusal is sent to the worker (its code in a registrationrejected
	// frame), and privileged marks the function privileged whatever its
	// metadata says. p never holds the engine token at admission; on
	// Reexamine it may, and is then to be admitted.
	AdmitFunction(p Principal, ns, id string) (privileged bool, refusal *protocol.ErrorBody)
	// Evicted is told that r, admitted before, was refused on a later
	// look and removed (its worker is told FORBIDDEN next).
	Evicted(r Registration)
	// TakesName reports whether claimant takes the worker name name in ns
	// from holder (holderID), which keeps its connection and functions
	// without the name. The engine's name lock is held: it must not call
	// the engine.
	TakesName(claimant, holder Principal, ns, name, holderID string) bool
	// Heartbeat reports whether a socket worker that registers id gets
	// its connection pinged, and cut when a pong does not come back.
	Heartbeat(id string) bool
	// Unresponsive is told that a pinged connection did not answer within
	// window and is being cut.
	Unresponsive(workerID string, window time.Duration, err error)
}

// Principal is a read-only view of who a worker connection speaks for,
// for a RegistrationGuard to judge.
type Principal struct{ p *principal }

// Admin reports whether it holds the engine token or is in-process.
func (v Principal) Admin() bool { return v.p != nil && v.p.admin }

// Label is its issued credential's label ("" for other principals).
func (v Principal) Label() string {
	if v.p == nil {
		return ""
	}
	return v.p.label
}

// Scope is what the guard's CredentialScope made of its issued
// credential's spec; nil without a credential or a scope.
func (v Principal) Scope() any {
	if v.p == nil || v.p.cred == nil {
		return nil
	}
	return v.p.cred.scope
}

// Revoked reports whether its issued credential has been revoked: set as
// revocation starts, before its connections are closed.
func (v Principal) Revoked() bool { return v.p != nil && v.p.cred != nil && v.p.cred.revoked.Load() }

// Registration names one function in the registry and its worker.
type Registration struct {
	Namespace, FunctionID, WorkerID string
}

// Owner is who registered a function.
type Owner struct {
	WorkerID  string
	Principal Principal
}

// FunctionOwner reports who registered id in ns, false when nobody did.
func (e *Engine) FunctionOwner(ns, id string) (Owner, bool) {
	f := e.reg.get(ns, id)
	if f == nil {
		return Owner{}, false
	}
	return Owner{WorkerID: f.owner.id, Principal: Principal{f.owner.principal}}, true
}

// errGuardInstalled refuses a second SetGuard.
var errGuardInstalled = errors.New("engine: a registration guard is installed already")

// guardSlot holds the installed guard; the zero value is the default.
type guardSlot struct {
	g atomic.Pointer[RegistrationGuard]
}

// SetGuard installs g; once only, and before workers connect: what was
// admitted before is not judged again until a ReserveName asks.
func (e *Engine) SetGuard(g RegistrationGuard) error {
	if g == nil {
		return errors.New("engine: SetGuard needs a guard")
	}
	if !e.guardSlot.g.CompareAndSwap(nil, &g) {
		return errGuardInstalled
	}
	return nil
}

// guard is the installed guard, or the closed default.
func (e *Engine) guard() RegistrationGuard {
	if g := e.guardSlot.g.Load(); g != nil {
		return *g
	}
	return closedGuard{log: e.log}
}

// Logger is the engine's logger: a guard logs its decisions in the
// engine's name, as the engine's own.
func (e *Engine) Logger() hclog.Logger { return e.log }

// ReserveName tells the guard that name is claimed by a part the engine
// token's holder runs (the plugin host, a binding): the guard decides what
// of it is reserved, and judges again what others registered under it.
func (e *Engine) ReserveName(name string) { e.guard().Reserve(name) }

// Reexamine asks the guard again about every function whose id starts
// with prefix, and evicts those it now refuses: their workers are told
// with registrationrejected FORBIDDEN, so what callers send such an id
// reaches none of them.
func (e *Engine) Reexamine(prefix string) {
	g := e.guard()
	for _, f := range e.reg.snapshot() {
		if !strings.HasPrefix(f.id, prefix) {
			continue
		}
		if _, refusal := g.AdmitFunction(Principal{f.owner.principal}, f.ns, f.id); refusal != nil {
			e.evict(g, f)
		}
	}
}

// recheck drops f, just registered by w, when the guard refuses it now (a
// name became reserved between its admission and its insert).
func (e *Engine) recheck(w *worker, f *function) bool {
	if w.principal == nil || w.principal.admin {
		return false
	}
	g := e.guard()
	if _, refusal := g.AdmitFunction(Principal{w.principal}, f.ns, f.id); refusal == nil {
		return false
	}
	e.evict(g, f)
	return true
}

func (e *Engine) evict(g RegistrationGuard, f *function) {
	if !e.reg.unregister(f.owner, f.ns, f.id) {
		return
	}
	g.Evicted(Registration{Namespace: f.ns, FunctionID: f.id, WorkerID: f.owner.id})
	e.reject(f.owner, &protocol.RegistrationRejected{Code: CodeForbidden, Namespace: f.ns, FunctionID: f.workerID()})
}

// takeName reports whether w takes name in ns from holder; e.namesMu is
// held.
func (e *Engine) takeName(w, holder *worker, ns, name string) bool {
	if !e.guard().TakesName(Principal{w.principal}, Principal{holder.principal}, ns, name, holder.id) {
		return false
	}
	holder.mu.Lock()
	holder.hasLease = false
	holder.mu.Unlock()
	return true
}

// closedGuard is the engine's policy when no guard is installed (see
// RegistrationGuard).
type closedGuard struct{ log hclog.Logger }

func (closedGuard) CredentialScope(spec CredentialSpec) (any, string, *protocol.ErrorBody) {
	// SandboxHost is the one scope block of the public spec.
	if spec.SandboxHost != nil {
		return nil, "", &protocol.ErrorBody{Code: CodeInvalidArgument,
			Message: "this engine has no registration guard installed, so it issues no credential with a scope block; issue it from an engine that runs the router"}
	}
	return nil, "", nil
}

func (closedGuard) Reserve(string) {}

func (closedGuard) AdmitFunction(p Principal, ns, id string) (bool, *protocol.ErrorBody) {
	if p.Admin() {
		return false, nil
	}
	a, rest, ok := strings.Cut(id, "::")
	if !ok || a == "" || reservedID(a+"::") || !strings.HasPrefix(rest, "worker::") && !strings.HasPrefix(rest, "host::") {
		return false, nil
	}
	return false, &protocol.ErrorBody{Code: CodeForbidden, Message: "function ids of the forms <name>::worker::* and <name>::host::* are reserved to the engine token's holder on an engine without a registration guard; " +
		id + " in namespace " + quote(ns) + " cannot be registered (docs/security.md)"}
}

func (g closedGuard) Evicted(r Registration) {
	g.log.Warn("function evicted: its registration is no longer admitted",
		"namespace", r.Namespace, "function_id", r.FunctionID, "worker_id", r.WorkerID)
}

func (closedGuard) TakesName(_, _ Principal, _, _, _ string) bool { return false }

func (closedGuard) Heartbeat(string) bool { return false }

func (g closedGuard) Unresponsive(workerID string, window time.Duration, err error) {
	g.log.Warn("worker did not answer a ping in time; dropping its connection", "worker_id", workerID, "window", window.String(), "error", err)
}

// Reserved reports whether id is under one of ReservedPrefixes.
func Reserved(id string) bool { return reservedID(id) }

// ReservedPrefixes are the function id prefixes only the engine token's
// holder may register.
func ReservedPrefixes() []string { return append([]string(nil), reservedPrefixes...) }
