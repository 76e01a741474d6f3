package engine

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/iii-sandbox/iii/internal/adaptername"
	"github.com/iii-sandbox/iii/internal/lazyre"
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
	// host is set for a sandbox host credential: its holder serves one
	// adapter's functions in one namespace (docs/security.md).
	host *sandboxHost
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

// sandboxHost is what a sandbox host credential lets its holder serve.
type sandboxHost struct {
	adapter   string
	hostName  string
	namespace string
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

// SandboxHostSpec names the adapter a remote sandbox host serves and the
// host itself.
type SandboxHostSpec = protocol.SandboxHostSpec

var (
	hostNameRE = lazyre.New(`^[a-z0-9-]{1,63}$`)
)

// validSandboxHost checks a sandbox_host block.
func validSandboxHost(h *SandboxHostSpec) *protocol.ErrorBody {
	if !adaptername.Valid(h.Adapter) {
		return &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "sandbox_host.adapter " + quote(h.Adapter) +
			" is not an adapter name: 1 to 64 of a-z 0-9 _ -, starting with a letter or digit"}
	}
	if reservedID(h.Adapter + "::") {
		return &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "sandbox_host.adapter " + quote(h.Adapter) +
			" is a reserved prefix (" + strings.Join(reservedPrefixes, ", ") + ")"}
	}
	if !hostNameRE.MatchString(h.HostName) {
		return &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "sandbox_host.host_name " + quote(h.HostName) +
			" is not a host name: 1 to 63 of a-z 0-9 -"}
	}
	return nil
}

// newCredential checks spec and builds the credential it describes.
func newCredential(spec CredentialSpec) (*credential, *protocol.ErrorBody) {
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
	c := &credential{label: sanitizeText(spec.Label), queue: spec.QueueProvider}
	if spec.QueueProvider {
		if spec.SandboxHost != nil {
			return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "a credential is a queue provider or a sandbox host, not both"}
		}
		if spec.Namespace != DefaultNamespace {
			return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "a queue provider credential's namespace is default (where " +
				EnqueueProviderFunctionID + " lives), not " + quote(spec.Namespace) + "; grant the namespaces its deliveries reach in allow"}
		}
	}
	if h := spec.SandboxHost; h != nil {
		if errb := validSandboxHost(h); errb != nil {
			return nil, errb
		}
		c.host = &sandboxHost{adapter: h.Adapter, hostName: h.HostName, namespace: spec.Namespace}
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
	c, errb := newCredential(spec)
	if errb != nil {
		return "", errb
	}
	if c.host != nil {
		// Its adapter's names are the adapter's from now on (runs after
		// the table's lock is released).
		defer e.ProtectAdapter(c.host.adapter)
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
