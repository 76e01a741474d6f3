// Package httpfn is the engine side of iii's HTTP-invocation functions
// (the iii-http-functions worker, docs/http-functions.md): a worker may
// register a function whose body is an HTTP endpoint, and the engine
// itself then calls that endpoint for every invocation.
//
// It is a package of its own because it is the one place where a caller's
// input makes the engine open connections: whoever may register a function
// could otherwise point the engine at its own loopback services, the
// machine's private network or a cloud metadata address. Everything that
// keeps that from happening sits here, together, where it can be read and
// tested on its own: the URL rules (Validator), a dialer that checks the
// address it actually connects to (so neither DNS rebinding nor a proxy
// nor a redirect gets around the rules), no redirects, capped response
// bodies and a timeout on every request.
package httpfn

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"golang.org/x/net/http/httpguts"

	"github.com/iii-sandbox/iii/protocol"
)

// Error codes of a call (upstream's).
const (
	// CodeInvalidResponse: a 2xx answer whose body is not JSON.
	CodeInvalidResponse = "invalid_response"
	// CodeHTTPRequestFailed: the request could not be made or timed out.
	CodeHTTPRequestFailed = "http_request_failed"
	// CodeHTTPResponseFailed: the response body could not be read, or is
	// larger than the cap.
	CodeHTTPResponseFailed = "http_response_failed"
	// CodeHTTPError: a 4xx/5xx answer without an {"error": {…}} body.
	CodeHTTPError = "http_error"
)

// Defaults of a call.
const (
	// DefaultTimeout applies when the registration has no timeout_ms.
	DefaultTimeout = 30 * time.Second
	// MaxTimeout bounds timeout_ms.
	MaxTimeout = time.Hour
	// DefaultMaxResponseBytes caps the body of an endpoint's answer.
	DefaultMaxResponseBytes = 16 << 20
	// DefaultAnswerBudget caps the bytes of all answers being read at
	// once, so many calls of large answers cannot exhaust the engine's
	// memory: a call whose answer would go past it fails.
	DefaultAnswerBudget = 128 << 20
	// maxHeaderBytes caps an answer's headers.
	maxHeaderBytes = 1 << 20
	// readChunk is how much of an answer is read (and taken from the
	// budget) at a time.
	readChunk = 64 << 10
)

// Methods an invocation may use; absent is POST.
var methods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// Options configure an Invoker.
type Options struct {
	// Security is the worker's security: block.
	Security Security
	// Resolver looks host names up for Validate and the dialer; nil is
	// net.DefaultResolver.
	Resolver *net.Resolver
	// LookupEnv reads the engine's environment for auth references; nil:
	// nothing is set.
	LookupEnv func(string) (string, bool)
	// DefaultTimeout replaces DefaultTimeout when positive.
	DefaultTimeout time.Duration
	// MaxResponseBytes replaces DefaultMaxResponseBytes when positive.
	MaxResponseBytes int64
	// AnswerBudget replaces DefaultAnswerBudget when positive.
	AnswerBudget int64
	// TLSConfig is the client's TLS configuration (tests trust their
	// server's certificate with it); nil is the system's roots.
	TLSConfig *tls.Config
}

// Invoker calls HTTP endpoints under one Security block.
type Invoker struct {
	v        *Validator
	client   *http.Client
	lookup   func(string) (string, bool)
	timeout  time.Duration
	maxBytes int64
	// budget is what is left of the answer budget.
	budget atomic.Int64
}

// New builds an Invoker; an invalid allowlist pattern is an error.
func New(opts Options) (*Invoker, error) {
	var res Resolver = net.DefaultResolver
	if opts.Resolver != nil {
		res = opts.Resolver
	}
	v, err := NewValidator(opts.Security, res)
	if err != nil {
		return nil, err
	}
	inv := &Invoker{v: v, lookup: opts.LookupEnv, timeout: DefaultTimeout, maxBytes: DefaultMaxResponseBytes}
	if inv.lookup == nil {
		inv.lookup = func(string) (string, bool) { return "", false }
	}
	if opts.DefaultTimeout > 0 {
		inv.timeout = opts.DefaultTimeout
	}
	if opts.MaxResponseBytes > 0 {
		inv.maxBytes = opts.MaxResponseBytes
	}
	inv.budget.Store(DefaultAnswerBudget)
	if opts.AnswerBudget > 0 {
		inv.budget.Store(opts.AnswerBudget)
	}
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Resolver: opts.Resolver}
	if v.sec.BlockPrivateIPs {
		dialer.Control = checkDial
	}
	tr := &http.Transport{
		// Never a proxy from the environment: the dialer must see the
		// endpoint's own address to check it.
		Proxy:                  nil,
		DialContext:            dialer.DialContext,
		TLSClientConfig:        opts.TLSConfig,
		ForceAttemptHTTP2:      true,
		MaxIdleConnsPerHost:    50,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		MaxResponseHeaderBytes: maxHeaderBytes,
	}
	inv.client = &http.Client{
		Transport: tr,
		// A redirect is the endpoint's answer, not a place to go: the
		// rules were checked for the registered URL only.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return inv, nil
}

// Close drops the idle connections.
func (inv *Invoker) Close() { inv.client.CloseIdleConnections() }

// Security is the block the invoker applies.
func (inv *Invoker) Security() Security { return inv.v.Security() }

// EngineHook is an Invoker as the engine calls it (engine.HTTPInvoker),
// wired in by host/server: host/engine may not import this package
// (docs/architecture.md, "Layers"), so it keeps the *Endpoint Prepare
// returns without knowing its type and hands it back to Invoke.
type EngineHook struct{ Invoker *Invoker }

// Prepare is Invoker.Prepare with the endpoint untyped; nil on an error
// (never a nil *Endpoint in an interface).
func (h EngineHook) Prepare(ref *protocol.HTTPInvocationRef) (any, *protocol.ErrorBody) {
	ep, errb := h.Invoker.Prepare(ref)
	if errb != nil {
		return nil, errb
	}
	return ep, nil
}

// Invoke is Invoker.Invoke on an endpoint Prepare returned (any
// Invoker's: an Endpoint does not depend on the one that prepared it).
func (h EngineHook) Invoke(ctx context.Context, endpoint any, functionID string, data json.RawMessage) (json.RawMessage, *protocol.ErrorBody) {
	ep, ok := endpoint.(*Endpoint)
	if !ok || ep == nil {
		return nil, &protocol.ErrorBody{Code: CodeHTTPRequestFailed,
			Message: fmt.Sprintf("function %s: the endpoint to call is a %T, not one an iii-http-functions invoker prepared", functionID, endpoint)}
	}
	return h.Invoker.Invoke(ctx, ep, functionID, data)
}

// Close is Invoker.Close.
func (h EngineHook) Close() { h.Invoker.Close() }

// blockedDialError is a connection the dialer refused.
type blockedDialError struct {
	addr netip.Addr
	why  string
}

func (e *blockedDialError) Error() string {
	return fmt.Sprintf("%s: %s is %s", errBlockedDial, e.addr, e.why)
}

func (e *blockedDialError) Unwrap() error { return errBlockedDial }

// checkDial is the dialer's Control: it runs with the address the socket
// is about to connect to, after DNS.
func checkDial(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot read the address %q", errBlockedDial, address)
	}
	if why := PrivateReason(ap.Addr()); why != "" {
		return &blockedDialError{addr: ap.Addr().Unmap(), why: why}
	}
	return nil
}

// Endpoint is a registered HTTP invocation, checked and with its auth
// resolved. It does not depend on the Invoker that prepared it.
type Endpoint struct {
	URL     string
	Method  string
	Timeout time.Duration // 0: the invoker's default
	Headers map[string]string
	auth    *auth
}

// Prepare checks a registration's invocation reference: the URL under the
// rules that need no DNS (a host name is resolved and checked at each
// call), the method, the headers, and the auth object, whose environment
// variables it reads now, as upstream does.
func (inv *Invoker) Prepare(ref *protocol.HTTPInvocationRef) (*Endpoint, *protocol.ErrorBody) {
	if ref == nil {
		return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "no invocation"}
	}
	if _, err := inv.v.Static(ref.URL); err != nil {
		return nil, &protocol.ErrorBody{Code: CodeURLValidationFailed, Message: err.Error()}
	}
	ep := &Endpoint{URL: ref.URL, Method: http.MethodPost, Headers: map[string]string{}}
	if ref.Method != "" {
		ok := false
		for _, m := range methods {
			if ref.Method == m {
				ok = true
			}
		}
		if !ok {
			return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "invocation.method " + strconv.Quote(ref.Method) + " is not GET, POST, PUT, PATCH or DELETE"}
		}
		ep.Method = ref.Method
	}
	if ref.TimeoutMS != nil {
		ms := *ref.TimeoutMS
		if ms == 0 || ms > uint64(MaxTimeout/time.Millisecond) {
			return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: fmt.Sprintf("invocation.timeout_ms %d is out of range: 1 to %d", ms, MaxTimeout/time.Millisecond)}
		}
		ep.Timeout = time.Duration(ms) * time.Millisecond
	}
	for k, v := range ref.Headers {
		if !validHeaderName(k) || !httpguts.ValidHeaderFieldValue(v) {
			return nil, &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "invocation.headers: " + strconv.Quote(k) + " is not a valid HTTP header"}
		}
		ep.Headers[k] = v
	}
	a, errb := resolveAuth(ref.Auth, inv.lookup)
	if errb != nil {
		return nil, errb
	}
	ep.auth = a
	return ep, nil
}

func validHeaderName(k string) bool { return k != "" && httpguts.ValidHeaderFieldName(k) }

// Invoke calls ep for function functionID with data as the JSON body. It
// checks the URL again (with DNS), sends the request under ep's timeout
// and returns the endpoint's JSON: null for an empty 2xx body or a 1xx/3xx
// answer that is not JSON; an *protocol.ErrorBody with upstream's codes
// otherwise. ctx ending stops the request.
func (inv *Invoker) Invoke(ctx context.Context, ep *Endpoint, functionID string, data json.RawMessage) (json.RawMessage, *protocol.ErrorBody) {
	timeout := ep.Timeout
	if timeout <= 0 {
		timeout = inv.timeout
	}
	// The timeout covers the DNS lookup of the check too.
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := inv.v.Validate(tctx, ep.URL); err != nil {
		if tctx.Err() != nil {
			return nil, inv.sendError(ctx, tctx, timeout, tctx.Err())
		}
		return nil, &protocol.ErrorBody{Code: CodeURLValidationFailed, Message: err.Error()}
	}
	body := []byte(data)
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("null")
	}
	req, err := http.NewRequestWithContext(tctx, ep.Method, ep.URL, bytes.NewReader(body))
	if err != nil {
		return nil, &protocol.ErrorBody{Code: CodeHTTPRequestFailed, Message: "build the request: " + err.Error()}
	}
	// The registrant's headers first: the engine's own headers and the
	// auth header replace any of the same name.
	for k, v := range ep.Headers {
		req.Header.Set(k, v)
	}
	ts := time.Now().Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-iii-Function-Path", functionID)
	req.Header.Set("x-iii-Invocation-ID", uuid.NewString())
	req.Header.Set("x-iii-Timestamp", strconv.FormatInt(ts, 10))
	if a := ep.auth; a != nil {
		switch a.kind {
		case AuthHMAC:
			req.Header.Set("x-iii-Signature", Sign(body, a.secret, ts))
		case AuthBearer:
			req.Header.Set("Authorization", "Bearer "+a.secret)
		case AuthAPIKey:
			req.Header.Set(a.header, a.secret)
		}
	}
	resp, err := inv.client.Do(req)
	if err != nil {
		return nil, inv.sendError(ctx, tctx, timeout, err)
	}
	defer resp.Body.Close()
	raw, taken, errb := inv.readAnswer(resp.Body, ep)
	defer inv.budget.Add(taken)
	if errb != nil {
		return nil, errb
	}
	return parseResponse(resp.StatusCode, raw)
}

// readAnswer reads a body up to the cap, taking what it reads from the
// answer budget; taken is what the caller gives back once it is done with
// raw.
func (inv *Invoker) readAnswer(body io.Reader, ep *Endpoint) (raw []byte, taken int64, errb *protocol.ErrorBody) {
	chunk := make([]byte, readChunk)
	for {
		n, err := body.Read(chunk)
		if n > 0 {
			if int64(len(raw)+n) > inv.maxBytes {
				return nil, taken, &protocol.ErrorBody{Code: CodeHTTPResponseFailed,
					Message: fmt.Sprintf("the answer of %s is larger than %d bytes, the engine's cap", redact(ep.URL), inv.maxBytes)}
			}
			if inv.budget.Add(-int64(n)) < 0 {
				inv.budget.Add(int64(n))
				return nil, taken, &protocol.ErrorBody{Code: CodeHTTPResponseFailed,
					Message: "the engine is reading too many large HTTP answers at once (its memory budget for them is in use); retry later"}
			}
			taken += int64(n)
			raw = append(raw, chunk[:n]...)
		}
		if errors.Is(err, io.EOF) {
			return raw, taken, nil
		}
		if err != nil {
			return nil, taken, &protocol.ErrorBody{Code: CodeHTTPResponseFailed, Message: fmt.Sprintf("read the answer of %s: %v", redact(ep.URL), err)}
		}
	}
}

// sendError names why a request failed.
func (inv *Invoker) sendError(ctx, tctx context.Context, timeout time.Duration, err error) *protocol.ErrorBody {
	var bd *blockedDialError
	switch {
	case errors.As(err, &bd):
		return &protocol.ErrorBody{Code: CodeURLValidationFailed, Message: ReasonPrivateIPBlocked + ": the endpoint's address " + bd.addr.String() + " is " + bd.why + "; security.block_private_ips is on"}
	case errors.Is(err, errBlockedDial):
		return &protocol.ErrorBody{Code: CodeURLValidationFailed, Message: ReasonPrivateIPBlocked + ": " + err.Error()}
	case ctx.Err() == nil && errors.Is(tctx.Err(), context.DeadlineExceeded):
		return &protocol.ErrorBody{Code: CodeHTTPRequestFailed, Message: fmt.Sprintf("no answer within %v (invocation.timeout_ms)", timeout)}
	}
	return &protocol.ErrorBody{Code: CodeHTTPRequestFailed, Message: err.Error()}
}

// parseResponse turns an answer into a result or an error, as upstream:
// 2xx is the JSON body (empty: null; not JSON: invalid_response); other
// codes below 400 are the body when it is JSON, else null; 400 and above
// are {"error": {"code", "message"}} from the body, else http_error.
func parseResponse(status int, raw []byte) (json.RawMessage, *protocol.ErrorBody) {
	switch {
	case status >= 200 && status < 300:
		if len(raw) == 0 {
			return nil, nil
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return nil, &protocol.ErrorBody{Code: CodeInvalidResponse, Message: fmt.Sprintf("the endpoint answered HTTP %d with a body that is not JSON: %v", status, err)}
		}
		return buf.Bytes(), nil
	case status < 400:
		var buf bytes.Buffer
		if json.Compact(&buf, raw) != nil {
			return nil, nil
		}
		return buf.Bytes(), nil
	}
	var body struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(raw, &body) == nil && len(body.Error) > 0 && string(body.Error) != "null" {
		var e struct {
			Code    any `json:"code"`
			Message any `json:"message"`
		}
		_ = json.Unmarshal(body.Error, &e)
		eb := &protocol.ErrorBody{Code: CodeHTTPError, Message: "HTTP request failed"}
		if s, ok := e.Code.(string); ok {
			eb.Code = s
		}
		if s, ok := e.Message.(string); ok {
			eb.Message = s
		}
		return nil, eb
	}
	return nil, &protocol.ErrorBody{Code: CodeHTTPError, Message: fmt.Sprintf("HTTP %d %s", status, http.StatusText(status))}
}

// redact drops a URL's user information and query for messages.
func redact(raw string) string {
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		raw = raw[:i]
	}
	if s, rest, ok := strings.Cut(raw, "://"); ok {
		if at := strings.LastIndex(rest, "@"); at >= 0 && !strings.Contains(rest[:at], "/") {
			rest = rest[at+1:]
		}
		return s + "://" + rest
	}
	return raw
}
