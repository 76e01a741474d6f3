package engine

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"
	"sync/atomic"

	"github.com/iii-sandbox/iii/internal/rbac"
	"github.com/iii-sandbox/iii/protocol"
)

// Credential builtins: privileged, so only the engine token's holder (Compose,
// the local user) hands out narrow credentials. The names live in protocol,
// which Compose imports instead of the engine.
const (
	FnCredentialsIssue  = protocol.FnCredentialsIssue
	FnCredentialsRevoke = protocol.FnCredentialsRevoke
)

// maxCredentials bounds the credential table.
const maxCredentials = 10_000

// credential is a narrow identity the engine issued: a connection that
// presents its token gets exactly its session's grants, denied anything
// they do not name, and never a privileged function.
type credential struct {
	label   string
	session *rbac.Session
	// scope is what the registration guard made of the spec's scope
	// block (RegistrationGuard.CredentialScope), nil for none: the engine
	// keeps it and never looks into it.
	scope any
	// claims is the name its holder owns from its issue on (ReserveName),
	// "" for none.
	claims string
	// queue is set for a queue provider credential: its holder registers
	// only QueueProviderFunctions, in default, and its calls of enqueued
	// targets are checked as their enqueuers (docs/queues.md).
	queue bool
	// persisted: the credential is in the credentials file too.
	persisted bool
	// revoked is set as revocation starts, before its connections are
	// closed, so nothing trusts them meanwhile.
	revoked atomic.Bool
}

// credentialTable maps the sha256 of each issued token to its credential;
// the tokens themselves are never kept.
type credentialTable struct {
	mu sync.RWMutex
	m  map[[32]byte]*credential

	// file is the credentials file persisted credentials are kept in
	// ("" = none: persist is refused); fileMu orders its rewrites.
	fileMu sync.Mutex
	file   atomic.Pointer[string]
}

func (t *credentialTable) lookup(token string) *credential {
	k := sha256.Sum256([]byte(token))
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.m[k]
}

// CredentialSpec is what a scoped credential allows; its wire shape is
// protocol's, so Compose builds one without importing the engine.
type CredentialSpec = protocol.CredentialSpec

// newCredential checks spec and builds the credential it describes; g
// judges its scope block.
func newCredential(spec CredentialSpec, g RegistrationGuard) (*credential, *protocol.ErrorBody) {
	if errb := validNamespace(spec.Namespace); errb != nil {
		return nil, errb
	}
	grants := map[string][]string{spec.Namespace: {"*"}}
	for ns, ids := range spec.Allow {
		if errb := validNamespace(ns); errb != nil {
			return nil, errb
		}
		if ns == spec.Namespace {
			continue
		}
		grants[ns] = append([]string(nil), ids...)
	}
	// The guard's refusals of a scope come before the queue provider's
	// namespace rule (a scope on a queue provider is its to refuse).
	scope, claims, errb := g.CredentialScope(spec)
	if errb != nil {
		return nil, errb
	}
	c := &credential{label: sanitizeText(spec.Label), queue: spec.QueueProvider, scope: scope, claims: claims}
	if spec.QueueProvider && spec.Namespace != DefaultNamespace {
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "a queue provider credential's namespace is default (where " +
			EnqueueProviderFunctionID + " lives), not " + quote(spec.Namespace) + "; grant the namespaces its deliveries reach in allow"}
	}
	s := rbac.Open()
	s.AllowTriggerTypeRegistration = false
	s.Namespaces = grants
	s.Declarable = []string{spec.Namespace}
	if spec.QueueProvider {
		none := []string{}
		s.AllowedTriggerTypes = &none
	}
	c.session = s
	return c, nil
}

// IssueCredential creates a credential and returns its token (256 random
// bits, hex). Privileged functions stay out of reach whatever it grants.
// With spec.Persist the credential is written to the credentials file
// first (UseCredentialsFile); without one it is refused.
func (e *Engine) IssueCredential(spec CredentialSpec) (string, *protocol.ErrorBody) {
	c, errb := newCredential(spec, e.guard())
	if errb != nil {
		return "", errb
	}
	if c.claims != "" {
		// The name is its holder's from now on (runs after the table's
		// lock is released).
		defer e.ReserveName(c.claims)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", &protocol.ErrorBody{Code: protocol.CodeInvocationFailed, Message: "random: " + err.Error()}
	}
	token := hex.EncodeToString(raw[:])
	k := sha256.Sum256([]byte(token))
	full := func() *protocol.ErrorBody {
		if len(e.creds.m) >= maxCredentials {
			return &protocol.ErrorBody{Code: CodeLimitExceeded, Message: "the engine holds the most credentials it keeps; revoke some first"}
		}
		return nil
	}
	if spec.Persist {
		e.creds.mu.RLock()
		errb := full()
		e.creds.mu.RUnlock()
		if errb != nil {
			return "", errb
		}
		stored := spec
		stored.Persist = false
		if errb := e.persistCredential(k, stored); errb != nil {
			return "", errb
		}
		c.persisted = true
	}
	e.creds.mu.Lock()
	defer e.creds.mu.Unlock()
	if e.creds.m == nil {
		e.creds.m = map[[32]byte]*credential{}
	}
	if errb := full(); errb != nil && !c.persisted {
		return "", errb
	}
	e.creds.m[k] = c
	return token, nil
}

// RevokeCredential forgets a credential: new connections with it are
// refused, connections already made with it are closed, and a persisted
// one is removed from the credentials file.
func (e *Engine) RevokeCredential(token string) bool {
	k := sha256.Sum256([]byte(token))
	e.creds.mu.Lock()
	c, ok := e.creds.m[k]
	delete(e.creds.m, k)
	e.creds.mu.Unlock()
	// The file may hold it even when memory does not (another engine on
	// the same file issued it).
	inFile := false
	if !ok || c.persisted {
		inFile = e.unpersistCredential(k)
	}
	if !ok {
		return inFile
	}
	c.revoked.Store(true)
	for _, w := range e.snapshotWorkers() {
		if w.conn != nil && w.principal != nil && w.principal.session == c.session {
			w.conn.shutdown(statusPolicyViolation, "credential revoked")
		}
	}
	return true
}

func (e *Engine) fnCredentialsIssue(_ context.Context, call *Call) (any, *protocol.ErrorBody) {
	var in CredentialSpec
	if errb := decodeInput(call.Data, &in); errb != nil {
		return nil, errb
	}
	tok, errb := e.IssueCredential(in)
	if errb != nil {
		return nil, errb
	}
	return map[string]string{"token": tok}, nil
}

func (e *Engine) fnCredentialsRevoke(_ context.Context, call *Call) (any, *protocol.ErrorBody) {
	var in struct {
		Token string `json:"token"`
	}
	if errb := decodeInput(call.Data, &in); errb != nil {
		return nil, errb
	}
	return map[string]bool{"revoked": e.RevokeCredential(in.Token)}, nil
}

var schemaCredentialsIssueIn = json.RawMessage(`{"type":"object","required":["namespace"],"properties":{"label":{"type":"string"},"namespace":{"type":"string"},"allow":{"type":"object","additionalProperties":{"type":"array","items":{"type":"string"}}},"sandbox_host":{"type":"object","required":["adapter","host_name"],"properties":{"adapter":{"type":"string","pattern":"^[a-z0-9][a-z0-9_-]{0,63}$"},"host_name":{"type":"string","pattern":"^[a-z0-9-]{1,63}$"}},"additionalProperties":false},"queue_provider":{"type":"boolean","default":false},"persist":{"type":"boolean","default":false}}}`)
var schemaCredentialsRevokeIn = json.RawMessage(`{"type":"object","required":["token"],"properties":{"token":{"type":"string"}}}`)
