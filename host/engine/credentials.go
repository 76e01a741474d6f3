package engine

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"

	"github.com/iii-sandbox/iii/host/rbac"
	"github.com/iii-sandbox/iii/protocol"
)

// Credential builtins: privileged, so only the engine token's holder (Compose,
// the local user) hands out narrow credentials.
const (
	FnCredentialsIssue  = "engine::credentials::issue"
	FnCredentialsRevoke = "engine::credentials::revoke"
)

// maxCredentials bounds the credential table.
const maxCredentials = 10_000

// credential is a narrow identity the engine issued: a connection that
// presents its token gets exactly its session's grants, denied anything
// they do not name, and never a privileged function.
type credential struct {
	label   string
	session *rbac.Session
}

// credentialTable maps the sha256 of each issued token to its credential;
// the tokens themselves are never kept.
type credentialTable struct {
	mu sync.RWMutex
	m  map[[32]byte]*credential
}

func (t *credentialTable) lookup(token string) *credential {
	k := sha256.Sum256([]byte(token))
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.m[k]
}

// CredentialSpec is what a scoped credential allows.
type CredentialSpec struct {
	// Label names the credential in logs and engine::workers::info, e.g.
	// "compose/orders/worker-a".
	Label string `json:"label"`
	// Namespace is the only namespace the holder may declare and register
	// in; every function there is callable.
	Namespace string `json:"namespace"`
	// Allow lists further grants, as auth functions return them:
	// namespace → exact ids or wildcards.
	Allow map[string][]string `json:"allow,omitempty"`
}

// IssueCredential creates a credential and returns its token (256 random
// bits, hex). Privileged functions stay out of reach whatever it grants.
func (e *Engine) IssueCredential(spec CredentialSpec) (string, *protocol.ErrorBody) {
	if errb := validNamespace(spec.Namespace); errb != nil {
		return "", errb
	}
	grants := map[string][]string{spec.Namespace: {"*"}}
	for ns, ids := range spec.Allow {
		if errb := validNamespace(ns); errb != nil {
			return "", errb
		}
		if ns == spec.Namespace {
			continue
		}
		grants[ns] = append([]string(nil), ids...)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", &protocol.ErrorBody{Code: protocol.CodeInvocationFailed, Message: "random: " + err.Error()}
	}
	token := hex.EncodeToString(raw[:])
	s := rbac.Open()
	s.AllowTriggerTypeRegistration = false
	s.Namespaces = grants
	s.Declarable = []string{spec.Namespace}
	e.creds.mu.Lock()
	defer e.creds.mu.Unlock()
	if e.creds.m == nil {
		e.creds.m = map[[32]byte]*credential{}
	}
	if len(e.creds.m) >= maxCredentials {
		return "", &protocol.ErrorBody{Code: CodeLimitExceeded, Message: "the engine holds the most credentials it keeps; revoke some first"}
	}
	e.creds.m[sha256.Sum256([]byte(token))] = &credential{label: sanitizeText(spec.Label), session: s}
	return token, nil
}

// RevokeCredential forgets a credential: new connections with it are
// refused, and connections already made with it are closed.
func (e *Engine) RevokeCredential(token string) bool {
	k := sha256.Sum256([]byte(token))
	e.creds.mu.Lock()
	c, ok := e.creds.m[k]
	delete(e.creds.m, k)
	e.creds.mu.Unlock()
	if !ok {
		return false
	}
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

var schemaCredentialsIssueIn = json.RawMessage(`{"type":"object","required":["namespace"],"properties":{"label":{"type":"string"},"namespace":{"type":"string"},"allow":{"type":"object","additionalProperties":{"type":"array","items":{"type":"string"}}}}}`)
var schemaCredentialsRevokeIn = json.RawMessage(`{"type":"object","required":["token"],"properties":{"token":{"type":"string"}}}`)
