package httpworker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/protocol"
)

// Version is the http package this worker is published as: upstream's
// trigger-type generation (trigger type `http`, registerTrigger) ends at
// 0.22.7; 0.22.8 and the 0.23 line are the observer generation
// (docs/standard-workers.md).
const Version = "0.22.7"

// Name is the worker's (and the package's) name; its configuration entry
// and function prefix.
const Name = "http"

// Defaults (upstream's, except DefaultHost: see Config.Host).
const (
	DefaultPort             = 3111
	DefaultHost             = "127.0.0.1"
	DefaultTimeout          = 30 * time.Second
	DefaultConcurrencyLimit = 1024
	// MaxBodyBytes is the largest request body read (upstream's 16 MiB).
	MaxBodyBytes = 16 << 20
	// MaxHeaderBytes bounds the request line and headers.
	MaxHeaderBytes = 64 << 10
	// ReadHeaderTimeout bounds the wait for a request's headers (a
	// slowloris client holding connections open with a trickle).
	ReadHeaderTimeout = 10 * time.Second
	// BodyReadTimeout bounds reading a whole request (headers and body).
	BodyReadTimeout = 60 * time.Second
	// IdleTimeout closes keep-alive connections left idle.
	IdleTimeout = 120 * time.Second
	// PhaseUpstream is the only middleware phase upstream defines.
	PhasePreHandler = "preHandler"
)

// DefaultConfig is the registry seed, the package's default configuration.
const DefaultConfig = `{"cors":{"allowed_origins":["*"],"allowed_methods":["GET","POST","PUT","DELETE","OPTIONS"]}}`

// CodeInvalidConfig is a configuration the worker cannot run with.
const CodeInvalidConfig = "INVALID_CONFIG"

// Config is the worker's configuration (upstream's HttpConfig). Unknown
// keys are refused, as upstream's deny_unknown_fields.
type Config struct {
	Port *int `json:"port,omitempty"`
	// Host is the listen address. Upstream binds 0.0.0.0; here the
	// default is 127.0.0.1: every route a worker registers becomes
	// reachable by whoever can reach the port, without any credential, so
	// exposing it to a network is a decision to make in the compose file
	// (host: 0.0.0.0), not a default.
	Host                    *string            `json:"host,omitempty"`
	DefaultTimeoutMS        *int64             `json:"default_timeout,omitempty"`
	ConcurrencyRequestLimit *int               `json:"concurrency_request_limit,omitempty"`
	CORS                    *CORSConfig        `json:"cors,omitempty"`
	Middleware              []MiddlewareConfig `json:"middleware,omitempty"`
	// WebhookListener is upstream's restricted second listener; its shape
	// was never read, so only null (absent) is accepted.
	WebhookListener json.RawMessage `json:"webhook_listener,omitempty"`
	// Streaming (ours, default true): every request carries upstream's
	// request_body and response channels, so a function may stream its
	// response (stream.go). false drops them: two channels and two
	// channel sockets less per request, for routes that never stream.
	Streaming *bool `json:"streaming,omitempty"`
}

// StreamingOn reports whether requests carry their channels.
func (c Config) StreamingOn() bool { return c.Streaming == nil || *c.Streaming }

// CORSConfig: empty lists are permissive, "*" allows any.
type CORSConfig struct {
	AllowedOrigins []string `json:"allowed_origins,omitempty"`
	AllowedMethods []string `json:"allowed_methods,omitempty"`
}

// MiddlewareConfig is one global middleware.
type MiddlewareConfig struct {
	FunctionID string `json:"function_id"`
	Phase      string `json:"phase,omitempty"`
	Priority   int    `json:"priority,omitempty"`
}

func configErr(format string, args ...any) *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: CodeInvalidConfig, Message: CodeInvalidConfig + ": " + fmt.Sprintf(format, args...)}
}

// ParseConfig decodes and checks a configuration (null is the defaults).
func ParseConfig(raw json.RawMessage) (Config, error) {
	var c Config
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return c, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, configErr("http configuration: %v", err)
	}
	if dec.More() {
		return c, configErr("http configuration: trailing data")
	}
	if c.Port != nil && (*c.Port < 0 || *c.Port > 65535) {
		return c, configErr("port %d is not a TCP port (0 = any free port)", *c.Port)
	}
	if c.Host != nil && *c.Host != "" && net.ParseIP(strings.Trim(*c.Host, "[]")) == nil && *c.Host != "localhost" {
		return c, configErr("host %q is not an IP address (127.0.0.1, 0.0.0.0, ::)", *c.Host)
	}
	if c.DefaultTimeoutMS != nil && *c.DefaultTimeoutMS <= 0 {
		return c, configErr("default_timeout must be a positive number of milliseconds, not %d", *c.DefaultTimeoutMS)
	}
	if c.ConcurrencyRequestLimit != nil && *c.ConcurrencyRequestLimit < 0 {
		return c, configErr("concurrency_request_limit must be 0 or more, not %d", *c.ConcurrencyRequestLimit)
	}
	if len(c.WebhookListener) > 0 && !bytes.Equal(bytes.TrimSpace(c.WebhookListener), []byte("null")) {
		return c, configErr("webhook_listener is not supported by this http worker; leave it out")
	}
	for i, m := range c.Middleware {
		if m.FunctionID == "" {
			return c, configErr("middleware[%d]: function_id is required", i)
		}
		if m.Phase != "" && m.Phase != PhasePreHandler {
			return c, configErr("middleware[%d]: phase %q is unknown (only %q)", i, m.Phase, PhasePreHandler)
		}
	}
	if c.CORS != nil {
		for _, m := range c.CORS.AllowedMethods {
			if m != "*" && !validMethod(m) {
				return c, configErr("cors.allowed_methods: %q is not an HTTP method", m)
			}
		}
	}
	return c, nil
}

// Addr is the listen address.
func (c Config) Addr() string {
	host, port := DefaultHost, DefaultPort
	if c.Host != nil && *c.Host != "" {
		host = strings.Trim(*c.Host, "[]")
	}
	if c.Port != nil {
		port = *c.Port
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// Timeout is default_timeout.
func (c Config) Timeout() time.Duration {
	if c.DefaultTimeoutMS == nil {
		return DefaultTimeout
	}
	return time.Duration(*c.DefaultTimeoutMS) * time.Millisecond
}

// Concurrency is concurrency_request_limit (0 → 1, as upstream's).
func (c Config) Concurrency() int {
	if c.ConcurrencyRequestLimit == nil {
		return DefaultConcurrencyLimit
	}
	return max(1, *c.ConcurrencyRequestLimit)
}

// GlobalMiddleware is the middleware list by ascending priority (stable).
func (c Config) GlobalMiddleware() []MiddlewareConfig {
	out := slices.Clone(c.Middleware)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Priority < out[j].Priority })
	return out
}

// validMethod: an HTTP token (RFC 9110), upper-cased by the caller.
func validMethod(m string) bool {
	if m == "" || len(m) > 32 {
		return false
	}
	for _, r := range m {
		if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)) {
			return false
		}
	}
	return true
}
