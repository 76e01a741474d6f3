package engine

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/rbac"
	"github.com/iii-sandbox/iii/protocol"
)

// Error codes of the front door (docs/security.md).
const (
	// CodeUnauthorized: the function is privileged and the caller did not
	// present the engine token.
	CodeUnauthorized = "UNAUTHORIZED"
	// CodeForbidden: the caller's session (RBAC, or a scoped credential)
	// does not allow this call or registration.
	CodeForbidden = "FORBIDDEN"
	// CodeAuthError: the connection could not be authenticated; sent in an
	// error frame just before the engine closes the socket.
	CodeAuthError = "AUTH_ERROR"
	// CodeLimitExceeded: a documented cap was reached (docs/security.md).
	CodeLimitExceeded = "LIMIT_EXCEEDED"
)

// MetadataPrivileged is the function metadata key that marks a function
// privileged when a socket worker registers it: only callers holding the
// engine token may invoke it.
const MetadataPrivileged = "privileged"

// reservedPrefixes are the function id prefixes only the engine token's
// holder may register: the engine's own, Compose's, the configuration
// worker's and the sandbox router's. Anyone else registering one could
// stand in for the real function while it is down and receive what callers
// send it.
var reservedPrefixes = []string{"engine::", "compose::", "configuration::", "sandbox::"}

// streamIDs are the iii-stream worker's functions: only the engine token's
// holder may register them (so no worker stands in for them while the
// worker is stopped), while custom streams' stream::<op>(<name>) stay
// open to every worker (docs/stream.md).
var streamIDs = []string{"stream::set", "stream::get", "stream::delete", "stream::list", "stream::list_groups",
	"stream::list_all", "stream::send", "stream::update"}

// privilegedByName reports ids that name privileged functions by their
// form alone, whoever registers them: the reserved prefixes, the stream
// worker's functions and sandbox adapters' worker::* operations (they boot
// VMs from host directories). Where a function is not registered yet,
// this is all there is to judge a call of it by.
func privilegedByName(id string) bool {
	return reservedID(id) || slices.Contains(streamIDs, id) || strings.Contains(id, "::worker::")
}

func reservedID(id string) bool {
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(id, p) {
			return true
		}
	}
	return false
}

// authTimeout bounds the call to a listener's auth function.
const authTimeout = 10 * time.Second

// ListenerPolicy is what one iii-worker-manager instance asks of the
// connections it accepts.
type ListenerPolicy struct {
	// Name labels the listener in logs and engine::workers::info.
	Name string
	// RBAC is the listener's rbac block; nil when it has none.
	RBAC *rbac.Config
	// MiddlewareFunctionID, when set, sees every invoke of a non-admin
	// connection whose target is not an engine builtin, in place of it.
	MiddlewareFunctionID string
	// LoopbackHostOnly refuses requests whose Host header is not
	// 127.0.0.1, localhost or [::1] (any port) with 403 before the
	// upgrade: a page in a browser cannot reach a loopback listener through
	// a rebound DNS name.
	LoopbackHostOnly bool
	// RequireToken refuses connections that present neither the engine
	// token nor an issued credential (AUTH_ERROR), unless the RBAC block's
	// auth function decides.
	RequireToken bool
	// Limits are the listener's caps; zero fields take the defaults.
	Limits Limits
}

// principal is who a connection speaks for, fixed at its handshake.
type principal struct {
	// admin: the connection presented the engine token (or is in-process).
	// It may call and register anything, and skips RBAC and middleware.
	admin bool
	// kind names how it was authenticated, for logs and introspection:
	// "engine-token", "credential", "auth-function" or "anonymous".
	kind string
	// label is a scoped credential's label.
	label string
	// session holds the grants of a non-admin connection.
	session *rbac.Session
	// rules is the rbac block decisions use: the listener's, or an empty
	// one (deny what is not granted) for a scoped credential; nil = allow
	// what the session does not deny.
	rules      *rbac.Config
	policy     *ListenerPolicy
	middleware string
	// cred is the issued credential the connection presented, nil for
	// other principals.
	cred *credential
}

var adminPrincipal = &principal{admin: true, kind: "engine-token"}

// bearer extracts the token of an "Authorization: Bearer <token>" header.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// tokenEqual compares two secrets in time independent of where they differ
// and of their lengths.
func tokenEqual(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	x, y := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(x[:], y[:]) == 1
}

// IsAdminToken reports whether token is the engine token in force.
func (e *Engine) IsAdminToken(token string) bool {
	if e.opts.AdminToken == nil {
		return false
	}
	return tokenEqual(token, e.opts.AdminToken())
}

// checkHost answers 403 for a request a loopback listener must not serve;
// true means it was refused.
func (p *ListenerPolicy) refuseHost(rw http.ResponseWriter, r *http.Request) bool {
	if p == nil || !p.LoopbackHostOnly || loopback.Host(r.Host) {
		return false
	}
	http.Error(rw, "forbidden: this listener is bound to loopback and answers only Host 127.0.0.1, localhost or [::1]", http.StatusForbidden)
	return true
}

// authenticate decides who a new connection speaks for. A presented token
// that is the engine token makes it admin; one that is a scoped credential
// gives it that credential's grants. Otherwise the listener's auth function
// (when it has one) is asked, with the request's headers, query parameters
// and address; without one the connection is anonymous. A token that is
// neither, on a listener without an auth function, is refused.
func (e *Engine) authenticate(ctx context.Context, r *http.Request, policy *ListenerPolicy, ip string) (*principal, *protocol.ErrorBody) {
	tok := bearer(r)
	if tok != "" {
		if e.IsAdminToken(tok) {
			return adminPrincipal, nil
		}
		if c := e.creds.lookup(tok); c != nil {
			return &principal{kind: "credential", label: c.label, session: c.session, rules: &rbac.Config{}, policy: policy, cred: c}, nil
		}
	}
	if policy.RBAC == nil || policy.RBAC.AuthFunctionID == "" {
		if tok == "" && policy.RequireToken {
			return nil, &protocol.ErrorBody{Code: CodeAuthError,
				Message: "listener " + policy.Name + " is not bound to loopback: present the engine token or a credential it issued (Authorization: Bearer), or give it rbac.auth_function_id (docs/security.md)"}
		}
		if tok != "" {
			return nil, &protocol.ErrorBody{Code: CodeAuthError,
				Message: "the bearer token is neither this engine's token nor a credential it issued (docs/security.md)"}
		}
		return &principal{kind: "anonymous", session: rbac.Open(), rules: policy.RBAC, policy: policy, middleware: policy.MiddlewareFunctionID}, nil
	}
	headers := map[string]string{}
	for k, v := range r.Header {
		headers[strings.ToLower(k)] = strings.Join(v, ", ")
	}
	query := map[string][]string(r.URL.Query())
	if query == nil {
		query = map[string][]string{}
	}
	in, err := json.Marshal(map[string]any{"headers": headers, "query_params": query, "ip_address": ip})
	if err != nil {
		return nil, &protocol.ErrorBody{Code: CodeAuthError, Message: "encode auth input: " + err.Error()}
	}
	actx, cancel := context.WithTimeout(ctx, authTimeout)
	defer cancel()
	out, err := e.Invoke(actx, DefaultNamespace, policy.RBAC.AuthFunctionID, in)
	if err != nil {
		msg := err.Error()
		var eb *protocol.ErrorBody
		if asErrorBody(err, &eb) {
			msg = eb.Message
		}
		return nil, &protocol.ErrorBody{Code: CodeAuthError, Message: msg}
	}
	s, err := rbac.DecodeAuthResult(out)
	if err != nil {
		return nil, &protocol.ErrorBody{Code: CodeAuthError, Message: err.Error()}
	}
	return &principal{kind: "auth-function", session: s, rules: policy.RBAC, policy: policy, middleware: policy.MiddlewareFunctionID}, nil
}

// authorizeInvoke is the gate every invoke from a socket worker passes:
// RBAC (FORBIDDEN), then privilege (UNAUTHORIZED). f is the function the
// call resolves to, nil when it resolves to nothing (a denied id answers
// FORBIDDEN whether or not it exists, so denials reveal nothing).
func (p *principal) authorizeInvoke(ns, id string, f *function) *protocol.ErrorBody {
	if p.admin {
		return nil
	}
	if p.session != nil {
		var meta json.RawMessage
		if f != nil {
			meta = f.metadata
		}
		if !rbac.Allowed(id, ns, p.rules, p.session, meta) {
			hint := "add it to rbac.expose_functions or grant it from the auth function"
			if p.session.Forbids(id) {
				hint = "it is in the session's forbidden_functions"
			} else if p.kind == "credential" {
				hint = "the credential " + quote(p.label) + " does not grant it"
			}
			return &protocol.ErrorBody{Code: CodeForbidden, Message: "function '" + id + "' not allowed in namespace '" + ns + "' (" + hint + ")"}
		}
	}
	if f != nil && f.privileged {
		return unauthorized(id)
	}
	return nil
}

func unauthorized(id string) *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: CodeUnauthorized,
		Message: id + " is privileged: it needs the engine token (the same user's iii call, iii compose and Go client send it by themselves; docs/security.md)"}
}

// authorizeRegistration is the gate for a function registration from a
// non-admin socket worker.
func (p *principal) authorizeRegistration(id string) *protocol.ErrorBody {
	if p.admin {
		return nil
	}
	if reservedID(id) && !(p.cred != nil && p.cred.queue && slices.Contains(QueueProviderFunctions, id)) {
		return &protocol.ErrorBody{Code: CodeForbidden, Message: "function ids under " + strings.Join(reservedPrefixes, ", ") + " are reserved to the engine token's holder; " + id + " cannot be registered"}
	}
	if slices.Contains(streamIDs, id) {
		return &protocol.ErrorBody{Code: CodeForbidden, Message: id + " is the iii-stream worker's and reserved to the engine token's holder; a custom stream registers " + id + "(<stream_name>)"}
	}
	if p.session != nil && !p.session.AllowFunctionRegistration {
		return &protocol.ErrorBody{Code: CodeForbidden, Message: "this session may not register functions (allow_function_registration is false)"}
	}
	return nil
}

// middlewareFor returns the middleware an invoke of id in ns goes through,
// or "" when it goes straight to the function: admin connections, listeners
// without middleware and the engine's own builtins skip it.
func (e *Engine) middlewareFor(p *principal, f *function) string {
	if p.admin || p.middleware == "" {
		return ""
	}
	if f != nil && e.builtins != nil && f.owner == e.builtins.w {
		return ""
	}
	return p.middleware
}

func asErrorBody(err error, out **protocol.ErrorBody) bool {
	return errors.As(err, out)
}

// viaMiddleware hands an invoke to the listener's middleware function in
// place of its target, as iii does: the middleware gets
// {function_id, payload, action, context, namespace}, resolved in the
// call's namespace, and its answer (or error) is the caller's answer. The
// middleware decides whether and how to call the target itself.
func (e *Engine) viaMiddleware(a *worker, p *principal, mw, ns string, r *invokeRequest) {
	in, err := json.Marshal(map[string]any{
		"function_id": r.functionID,
		"payload":     json.RawMessage(orNull(r.data)),
		"action":      r.action,
		"context":     p.session.Context,
		"namespace":   ns,
	})
	reply := resultSender(a, r.invocationID, r.functionID, "", "")
	if err != nil {
		reply(nil, &protocol.ErrorBody{Code: protocol.CodeInvocationFailed, Message: "encode middleware input: " + err.Error()})
		return
	}
	// The call waits in the middleware as long as the middleware takes:
	// charged to the caller like a call it awaits (count and bytes), so a
	// caller cannot park goroutines and payloads here past its budget.
	// Released when the middleware answers or the caller leaves (a.ctx).
	cost := a.conn.heldCost(r, len(in))
	if errb := a.conn.chargeCall(cost); errb != nil {
		e.log.Debug("call refused: over a limit", "worker_id", a.id, "function_id", r.functionID, "via", "middleware", "reason", errb.Message)
		reply(nil, errb)
		return
	}
	started := e.tasks.Go(func() {
		defer a.conn.releaseCall(cost)
		out, err := e.Invoke(a.ctx, ns, mw, in)
		if err != nil {
			var eb *protocol.ErrorBody
			if !asErrorBody(err, &eb) {
				eb = &protocol.ErrorBody{Code: protocol.CodeInvocationFailed, Message: "middleware " + mw + ": " + err.Error()}
			}
			reply(nil, eb)
			return
		}
		reply(out, nil)
	})
	if !started {
		a.conn.releaseCall(cost)
		reply(nil, engineStopping())
	}
}

func orNull(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return b
}

// markedPrivileged reports whether a registerfunction's metadata marks the
// function privileged ({"privileged": true}).
func markedPrivileged(meta json.RawMessage) bool {
	if len(meta) == 0 {
		return false
	}
	var m struct {
		Privileged bool `json:"privileged"`
	}
	return json.Unmarshal(meta, &m) == nil && m.Privileged
}

// admitRegistration applies a non-admin connection's registration rules to
// f before it enters the registry: reserved ids, the session's
// allow_function_registration, the listener's
// on_function_registration_function_id hook (which may rewrite the id,
// description and metadata, or deny), and the session's
// function_registration_prefix.
func (e *Engine) admitRegistration(w *worker, f *function) *protocol.ErrorBody {
	p := w.principal
	if p == nil || p.admin {
		return nil
	}
	if strings.HasPrefix(f.id, "engine::") && f.ns != DefaultNamespace {
		return nil // registerFunction refuses it as iii does (FUNCTION_NAMESPACE_CONFLICT)
	}
	if errb := p.authorizeRegistration(f.id); errb != nil {
		return errb
	}
	if errb := p.admitQueueProvider(f); errb != nil {
		return errb
	}
	if errb := e.admitGuarded(p, f); errb != nil {
		return errb
	}
	orig := f.id
	if hook := p.hook(func(c *rbac.Config) string { return c.OnFunctionRegistrationFunctionID }); hook != "" {
		rewrite, errb := e.callHook(w, hook, "registration of "+f.id, map[string]any{
			"function_id": f.id, "description": f.description, "metadata": json.RawMessage(orNull(f.metadata)),
			"namespace": f.ns, "context": p.session.Context,
		})
		if errb != nil {
			return errb
		}
		var s string
		if json.Unmarshal(rewrite["function_id"], &s) == nil && strings.TrimSpace(s) != "" {
			f.id = s
		}
		if json.Unmarshal(rewrite["description"], &s) == nil {
			f.description = s
		}
		if m, ok := rewrite["metadata"]; ok {
			f.metadata = m
			f.privileged = markedPrivileged(m)
		}
	}
	if p.session != nil && p.session.FunctionRegistrationPrefix != "" {
		f.id = p.session.FunctionRegistrationPrefix + "::" + f.id
	}
	if f.id != orig {
		f.wireID = orig
		// The rewritten id passes the same rules as the one asked for.
		if errb := p.authorizeRegistration(f.id); errb != nil {
			return errb
		}
		if errb := e.admitGuarded(p, f); errb != nil {
			return errb
		}
	}
	return nil
}

// admitGuarded applies the registration guard's rule to f (names it
// reserves, a credential's scope), and its privileged marking.
func (e *Engine) admitGuarded(p *principal, f *function) *protocol.ErrorBody {
	privileged, refusal := e.guard().AdmitFunction(Principal{p}, f.ns, f.id)
	if refusal != nil {
		return refusal
	}
	if privileged {
		f.privileged = true
	}
	return nil
}

// admitTrigger applies a non-admin connection's rules to a trigger
// registration: the trigger type must be one the session may use, and its
// target must be a function the connection could call itself. A trigger is
// fired by its provider's connection, which may hold more rights than the
// registering one; so a target that is privileged or under a reserved
// prefix is refused whatever the provider.
func (e *Engine) admitTrigger(o *worker, ns string, m *protocol.RegisterTrigger) *protocol.ErrorBody {
	p := o.principal
	if p == nil || p.admin {
		return nil
	}
	if p.session != nil && p.session.AllowedTriggerTypes != nil && !slices.Contains(*p.session.AllowedTriggerTypes, m.TriggerType) {
		return &protocol.ErrorBody{Code: CodeForbidden, Message: "trigger type '" + m.TriggerType + "' not allowed for this session"}
	}
	if errb := p.admitStreamTrigger(m.TriggerType); errb != nil {
		return errb
	}
	if hook := p.hook(func(c *rbac.Config) string { return c.OnTriggerRegistrationFunctionID }); hook != "" {
		rewrite, errb := e.callHook(o, hook, "trigger "+m.ID, map[string]any{
			"trigger_id": m.ID, "trigger_type": m.TriggerType, "function_id": m.FunctionID,
			"config": json.RawMessage(orNull(m.Config)), "metadata": json.RawMessage(orNull(m.Metadata)),
			"namespace": ns, "context": p.session.Context,
		})
		if errb != nil {
			return errb
		}
		var s string
		for key, dst := range map[string]*string{"trigger_id": &m.ID, "trigger_type": &m.TriggerType, "function_id": &m.FunctionID} {
			if json.Unmarshal(rewrite[key], &s) == nil && strings.TrimSpace(s) != "" {
				*dst = s
			}
		}
		if c, ok := rewrite["config"]; ok {
			m.Config = c
		}
	}
	if p.session != nil && p.session.FunctionRegistrationPrefix != "" {
		m.FunctionID = p.session.FunctionRegistrationPrefix + "::" + m.FunctionID
	}
	if reservedID(m.FunctionID) {
		return &protocol.ErrorBody{Code: CodeForbidden, Message: "function '" + m.FunctionID + "' cannot be a trigger target of this connection (reserved to the engine token's holder)"}
	}
	if errb := p.authorizeInvoke(ns, m.FunctionID, e.reg.get(ns, m.FunctionID)); errb != nil {
		return errb
	}
	// A trigger's condition function (config.condition_function_id, the
	// convention of iii's trigger types) is called by the provider too,
	// with the provider's rights: the same rule as the target.
	if cond := conditionFunctionID(m.Config); cond != "" {
		if reservedID(cond) {
			return &protocol.ErrorBody{Code: CodeForbidden, Message: "function '" + cond + "' cannot be a trigger condition of this connection (reserved to the engine token's holder)"}
		}
		return p.authorizeInvoke(ns, cond, e.reg.get(ns, cond))
	}
	return nil
}

// conditionFunctionID is a trigger config's condition_function_id, "" when
// it has none.
func conditionFunctionID(config json.RawMessage) string {
	var c struct {
		ConditionFunctionID string `json:"condition_function_id"`
	}
	_ = json.Unmarshal(config, &c) // a config of another shape has none
	return c.ConditionFunctionID
}

// admitTriggerType applies a non-admin connection's rules to a trigger
// type registration: allow_trigger_type_registration and the listener's
// on_trigger_type_registration_function_id hook (which may rewrite the id
// and description, or deny). false means refused (and logged).
func (e *Engine) admitTriggerType(w *worker, m *protocol.RegisterTriggerType) bool {
	p := w.principal
	if p == nil || p.admin {
		return true
	}
	if p.session != nil && !p.session.AllowTriggerTypeRegistration {
		e.log.Warn("registertriggertype refused: this session may not register trigger types", "worker_id", w.id, "id", m.ID)
		return false
	}
	if hook := p.hook(func(c *rbac.Config) string { return c.OnTriggerTypeRegistrationFunctionID }); hook != "" {
		rewrite, errb := e.callHook(w, hook, "trigger type "+m.ID, map[string]any{
			"trigger_type_id": m.ID, "description": m.Description, "context": p.session.Context,
		})
		if errb != nil {
			e.log.Warn("registertriggertype refused", "worker_id", w.id, "id", m.ID, "error", errb.Message)
			return false
		}
		var s string
		if json.Unmarshal(rewrite["trigger_type_id"], &s) == nil && strings.TrimSpace(s) != "" {
			m.ID = s
		}
		if json.Unmarshal(rewrite["description"], &s) == nil {
			m.Description = s
		}
	}
	return true
}

// hook returns the registration hook pick names on the listener's rbac
// block, or "" (none, or the principal is not an RBAC session).
func (p *principal) hook(pick func(*rbac.Config) string) string {
	if p.session == nil || p.rules == nil || p.policy == nil || p.rules != p.policy.RBAC {
		return ""
	}
	return pick(p.rules)
}

// callHook calls a registration hook as iii does: an object answer may
// rewrite the registration; an error or any other answer denies it.
func (e *Engine) callHook(w *worker, hook, what string, input map[string]any) (map[string]json.RawMessage, *protocol.ErrorBody) {
	denied := &protocol.ErrorBody{Code: CodeForbidden, Message: what + " denied by " + hook}
	in, err := json.Marshal(input)
	if err != nil {
		return nil, denied
	}
	ctx, cancel := context.WithTimeout(w.ctx, authTimeout)
	defer cancel()
	out, err := e.Invoke(ctx, DefaultNamespace, hook, in)
	var rewrite map[string]json.RawMessage
	if err != nil || json.Unmarshal(out, &rewrite) != nil || rewrite == nil {
		return nil, denied
	}
	return rewrite, nil
}

// QueueProviderFunctions are what a queue provider credential's holder
// may register (in default, and nothing else): the enqueue provider and
// the queue worker's read-only views.
var QueueProviderFunctions = []string{EnqueueProviderFunctionID, "engine::queue::list_topics",
	"engine::queue::dlq_topics", "engine::queue::topic_stats", "engine::queue::dlq_messages"}

// admitQueueProvider applies a queue provider credential's rule to a
// registration: only QueueProviderFunctions, in default.
func (p *principal) admitQueueProvider(f *function) *protocol.ErrorBody {
	if p.cred == nil || !p.cred.queue {
		return nil
	}
	if f.ns != DefaultNamespace || !slices.Contains(QueueProviderFunctions, f.id) {
		return &protocol.ErrorBody{Code: CodeForbidden, Message: "the queue provider credential " + quote(p.label) + " registers only " +
			strings.Join(QueueProviderFunctions, ", ") + " in namespace \"default\"; " + f.id + " in namespace " + quote(f.ns) + " is refused"}
	}
	return nil
}

// queueProvider reports whether p may own the enqueue provider: the
// engine token's holder, or a queue provider credential's.
func (p *principal) queueProvider() bool {
	return p != nil && (p.admin || p.cred != nil && p.cred.queue)
}

// FunctionIDs lists the function ids registered in ns that start with
// prefix, in no particular order (the sandbox router finds the hosts of a
// fleet by their <adapter>::host::<name>:: functions).
func (e *Engine) FunctionIDs(ns, prefix string) []string { return e.reg.idsWithPrefix(ns, prefix) }
