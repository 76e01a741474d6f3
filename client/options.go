package client

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/internal/lazyre"
	"github.com/iii-sandbox/iii/internal/version"
)

// Defaults of Options. They follow the published SDKs (engine-internals §1.7)
// so a Go worker behaves like a Node or Rust one on a flaky link.
const (
	DefaultDialTimeout  = 10 * time.Second
	DefaultPingInterval = 20 * time.Second
	DefaultIdleTimeout  = 60 * time.Second
	DefaultCallTimeout  = 30 * time.Second

	DefaultReconnectInitial    = time.Second
	DefaultReconnectMultiplier = 2.0
	DefaultReconnectMax        = 30 * time.Second
	DefaultReconnectJitter     = 0.3
)

// Environment variables the client reads its defaults from, as the other
// SDKs do; Compose sets them for the workers it starts.
const (
	EnvWorkerName = "III_WORKER_NAME"
	EnvNamespace  = "III_NAMESPACE"
	EnvIsolation  = "III_ISOLATION"
)

// maxMessageSize bounds one incoming frame. Payloads travel inline in frames,
// so this is generous; it matches the engine's own limit.
const maxMessageSize = 64 << 20

// ReconnectPolicy says how the client reconnects after it loses the engine.
// The zero value is the SDK default: 1 s, doubling, at most 30 s, ±30 %
// jitter, forever.
type ReconnectPolicy struct {
	// Disable makes a lost connection final: the client stops and every
	// call fails (the CLI uses this).
	Disable bool
	// Initial is the first delay (default 1 s).
	Initial time.Duration
	// Multiplier grows the delay after each failed attempt (default 2).
	Multiplier float64
	// Max caps the delay before jitter (default 30 s).
	Max time.Duration
	// Jitter spreads each delay by ±Jitter of itself (default 0.3) so a
	// restarted engine is not hit by every worker in the same millisecond.
	// A negative value turns jitter off.
	Jitter float64
	// MaxAttempts bounds consecutive failed attempts; 0 means unlimited.
	MaxAttempts int
}

// Options configure Dial. Every field is optional.
type Options struct {
	// Name is the worker name the engine leases in its namespace.
	// Default: $III_WORKER_NAME, else "<hostname>:<pid>".
	Name string
	// Namespace is the worker's namespace. Default: $III_NAMESPACE; blank
	// means none (the engine then uses "default").
	Namespace string
	// Description is shown by engine::workers::list.
	Description string
	// Runtime is reported to the engine (default "go").
	Runtime string
	// Version is reported to the engine (default: this build's version).
	Version string
	// Isolation is reported to the engine (default $III_ISOLATION).
	Isolation string
	// IgnoreEnv stops the III_* environment variables from filling Name,
	// Namespace and Isolation. The CLI sets it: a CLI call has no namespace
	// of its own, whatever the shell exports.
	IgnoreEnv bool
	// Header is sent with every WebSocket upgrade (for engines that
	// authenticate workers).
	Header http.Header
	// Token, when set, is sent as "Authorization: Bearer <token>" on the
	// worker socket's upgrade: the engine token makes the connection admin
	// (it may call privileged functions), a credential the engine issued
	// gives it that credential's grants. A token the engine does not know
	// makes it refuse the connection (AUTH_ERROR). DiscoverToken finds the
	// same user's engine token. docs/security.md.
	Token string
	// TokenSource, when set, is asked for the token before every
	// reconnect (Token is the first connection's): a client that outlives
	// its engine finds the token the restarted engine uses, say a
	// rewritten ~/.iii/engine-token. Empty keeps the last one.
	TokenSource func() string
	// Logger receives the client's diagnostics (default: none).
	Logger hclog.Logger
	// Reconnect is the reconnect policy.
	Reconnect ReconnectPolicy
	// DialTimeout bounds one connection attempt, up to and including the
	// engine's greeting (default 10 s).
	DialTimeout time.Duration
	// PingInterval is how often the client pings the engine (default 20 s).
	PingInterval time.Duration
	// IdleTimeout is how long the client waits without any frame from the
	// engine before it drops the connection and reconnects (default 60 s).
	IdleTimeout time.Duration
	// CallTimeout is the default timeout of Call (default 30 s).
	CallTimeout time.Duration
	// ConfirmRegistration sends engine::workers::register as a synchronous
	// call and makes Dial (and each reconnect) wait for the engine to accept
	// the worker name. Without it the registration is fire-and-forget, as in
	// the other SDKs, and a refused name shows up later through Done/Err.
	ConfirmRegistration bool
	// OnRegistrationError is told about registrations the engine refused
	// (a *RejectionError or a *TriggerError). It runs on its own goroutine.
	OnRegistrationError func(error)
}

// namespacePattern is the engine's rule for namespace values (spec §4).
var namespacePattern = lazyre.New(`^[a-z0-9_-]+$`)

// ValidNamespace reports whether ns is acceptable to the engine as an
// explicit namespace.
func ValidNamespace(ns string) bool { return namespacePattern.MatchString(ns) }

// withDefaults fills the zero fields; getenv is os.Getenv outside tests.
func (o Options) withDefaults(getenv func(string) string) (Options, error) {
	if o.IgnoreEnv {
		getenv = func(string) string { return "" }
	}
	if o.Name == "" {
		o.Name = getenv(EnvWorkerName)
	}
	if o.Name == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "localhost"
		}
		o.Name = host + ":" + strconv.Itoa(os.Getpid())
	}
	if o.Namespace == "" {
		o.Namespace = strings.TrimSpace(getenv(EnvNamespace))
	}
	if o.Namespace != "" && !ValidNamespace(o.Namespace) {
		return o, &Error{Code: CodeInvalidNamespace, Message: fmt.Sprintf(
			"namespace %q is invalid: use only lowercase letters, digits, '-' and '_'", o.Namespace)}
	}
	if o.Isolation == "" {
		o.Isolation = getenv(EnvIsolation)
	}
	if o.Runtime == "" {
		o.Runtime = "go"
	}
	if o.Version == "" {
		o.Version = version.Version
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.PingInterval <= 0 {
		o.PingInterval = DefaultPingInterval
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	r := &o.Reconnect
	if r.Initial <= 0 {
		r.Initial = DefaultReconnectInitial
	}
	if r.Multiplier < 1 {
		r.Multiplier = DefaultReconnectMultiplier
	}
	if r.Max <= 0 {
		r.Max = DefaultReconnectMax
	}
	if r.Max < r.Initial {
		r.Max = r.Initial
	}
	switch {
	case r.Jitter == 0:
		r.Jitter = DefaultReconnectJitter
	case r.Jitter < 0:
		r.Jitter = 0
	case r.Jitter > 1:
		r.Jitter = 1
	}
	return o, nil
}
