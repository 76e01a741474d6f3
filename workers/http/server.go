// Package httpworker is the registry's `http` worker: its own HTTP
// listener (port 3111, 127.0.0.1 by default) whose routes are `http`
// triggers of upstream's trigger-type generation (what the published Node
// iii-sdk 0.22.1 speaks): each request is turned into a call of the
// trigger's function through the engine, and the function's
// {status_code, headers, body} into the response. docs/standard-workers.md
// is its user's page; cmd/http is the binary Compose runs
// (workers/workerkit connects it). The directory is workers/http; the
// package is httpworker so it does not shadow net/http.
package httpworker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/protocol"
)

// TriggerType is the trigger type the worker provides.
const TriggerType = "http"

// Error codes of the JSON error responses ({"error":{code, message}}).
const (
	CodeNotFound         = "NOT_FOUND"
	CodeMethodNotAllowed = "METHOD_NOT_ALLOWED"
	CodePayloadTooLarge  = "PAYLOAD_TOO_LARGE"
	CodeConditionNotMet  = "CONDITION_NOT_MET"
	CodeInternal         = "INTERNAL_ERROR"
	CodeTimeout          = "TIMEOUT"
	CodeMiddlewareTimout = "MIDDLEWARE_TIMEOUT"
	CodeUnavailable      = "SERVICE_UNAVAILABLE"
	CodeBadRequest       = "BAD_REQUEST"
)

// Invoker calls a function through the engine, in namespace ("" is the
// worker's own for global middleware; a trigger's namespace otherwise),
// with the trigger's metadata.
type Invoker interface {
	Invoke(ctx context.Context, namespace, functionID string, payload, metadata json.RawMessage) (json.RawMessage, error)
}

// ClientInvoker is the Invoker of a connected worker. The engine checks a
// trigger provider's call of a binding's function as the binding's
// registrant (docs/security.md, "Authority when a call runs").
type ClientInvoker struct{ C *client.Client }

// Invoke calls fn; ns "" resolves in the worker's namespace.
func (ci ClientInvoker) Invoke(ctx context.Context, ns, fn string, payload, md json.RawMessage) (json.RawMessage, error) {
	var opts []client.CallOption
	if ns != "" {
		opts = append(opts, client.WithNamespace(ns))
	}
	if dl, ok := ctx.Deadline(); ok {
		opts = append(opts, client.WithTimeout(time.Until(dl)))
	}
	if len(md) > 0 {
		opts = append(opts, client.WithMetadata(md))
	}
	return ci.C.Call(ctx, fn, payload, opts...)
}

// Options configure New.
type Options struct {
	Logger  hclog.Logger
	Invoker Invoker
	// ReadHeaderTimeout overrides ReadHeaderTimeout (tests).
	ReadHeaderTimeout time.Duration
}

// live is what a configuration change applies without a restart.
type live struct {
	timeout    time.Duration
	middleware []MiddlewareConfig
}

// Worker is the http worker's logic: the router, the listener's handler
// and the trigger type.
type Worker struct {
	log     hclog.Logger
	invoker Invoker
	streams Streams // nil: requests carry no channels
	rht     time.Duration
	router  *Router
	cfg     Config // restart settings, as started
	cors    *CORSConfig
	sem     chan struct{}
	live    atomic.Pointer[live]

	srv      *http.Server
	ln       net.Listener
	serveErr chan error
}

// New builds a worker for cfg; Listen starts serving.
func New(cfg Config, o Options) *Worker {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.ReadHeaderTimeout <= 0 {
		o.ReadHeaderTimeout = ReadHeaderTimeout
	}
	w := &Worker{log: o.Logger, invoker: o.Invoker, rht: o.ReadHeaderTimeout, router: NewRouter(), cfg: cfg, cors: cfg.CORS,
		sem: make(chan struct{}, cfg.Concurrency())}
	w.Reconfigure(cfg)
	return w
}

// SetInvoker sets the invoker (once connected).
func (w *Worker) SetInvoker(i Invoker) { w.invoker = i }

// SetStreams gives every request its two channels (stream.go); before it
// (and with streaming: false) requests carry none.
func (w *Worker) SetStreams(s Streams) { w.streams = s }

// Router is the worker's route table.
func (w *Worker) Router() *Router { return w.router }

// Reconfigure applies the live settings (default_timeout, middleware); a
// change of the others is logged: it applies at the next start.
func (w *Worker) Reconfigure(cfg Config) {
	w.live.Store(&live{timeout: cfg.Timeout(), middleware: cfg.GlobalMiddleware()})
	if cfg.Addr() != w.cfg.Addr() || cfg.Concurrency() != w.cfg.Concurrency() || !sameCORS(cfg.CORS, w.cfg.CORS) || cfg.StreamingOn() != w.cfg.StreamingOn() {
		w.log.Warn("http settings that apply at start changed (port, host, concurrency_request_limit, cors, streaming); restart the worker: iii call compose::restart worker=http")
	}
}

func sameCORS(a, b *CORSConfig) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// Listen binds the configured address and serves until Close.
func (w *Worker) Listen() error {
	ln, err := net.Listen("tcp", w.cfg.Addr())
	if err != nil {
		return fmt.Errorf("http listener on %s: %w", w.cfg.Addr(), err)
	}
	w.Serve(ln)
	return nil
}

// Serve serves on ln until Close.
func (w *Worker) Serve(ln net.Listener) {
	w.ln = ln
	w.srv = &http.Server{
		Handler:           w,
		ReadHeaderTimeout: w.rht,
		ReadTimeout:       BodyReadTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          w.log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}
	w.serveErr = make(chan error, 1)
	go func() { w.serveErr <- w.srv.Serve(ln) }()
	w.log.Info("http listening", "addr", ln.Addr().String())
}

// Addr is the bound address (after Listen or Serve).
func (w *Worker) Addr() net.Addr {
	if w.ln == nil {
		return nil
	}
	return w.ln.Addr()
}

// Close stops the listener, letting requests in flight finish within ctx.
func (w *Worker) Close(ctx context.Context) error {
	if w.srv == nil {
		return nil
	}
	err := w.srv.Shutdown(ctx)
	if err != nil {
		_ = w.srv.Close()
	}
	select {
	case <-w.serveErr:
	case <-ctx.Done():
	}
	return err
}

// --- trigger type ---

// triggerConfig is an http trigger's config (upstream's HttpTriggerConfig).
type triggerConfig struct {
	APIPath               *string  `json:"api_path"`
	HTTPMethod            string   `json:"http_method"`
	ConditionFunctionID   string   `json:"condition_function_id"`
	MiddlewareFunctionIDs []string `json:"middleware_function_ids"`
	PublicWebhook         bool     `json:"public_webhook"`
}

func triggerErr(id string, format string, args ...any) *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: "INVALID_TRIGGER_CONFIG", Message: "Failed to parse trigger config: http trigger " + id + ": " + fmt.Sprintf(format, args...)}
}

// RouteFor turns a trigger registration into its route.
func RouteFor(t client.TriggerRegistration) (*Route, error) {
	var c triggerConfig
	raw := bytes.TrimSpace(t.Config)
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &c) != nil {
		return nil, triggerErr(t.ID, "needs an object {api_path, http_method?, condition_function_id?, middleware_function_ids?}")
	}
	if c.APIPath == nil {
		return nil, triggerErr(t.ID, "api_path is required")
	}
	tpl, err := ParseTemplate(*c.APIPath)
	if err != nil {
		return nil, triggerErr(t.ID, "%v", err)
	}
	m := strings.ToUpper(strings.TrimSpace(c.HTTPMethod))
	if m == "" {
		m = http.MethodGet
	}
	if !validMethod(m) {
		return nil, triggerErr(t.ID, "http_method %q is not an HTTP method", c.HTTPMethod)
	}
	if c.PublicWebhook {
		return nil, triggerErr(t.ID, "public_webhook is not supported by this http worker (no webhook listener)")
	}
	for _, id := range c.MiddlewareFunctionIDs {
		if id == "" {
			return nil, triggerErr(t.ID, "middleware_function_ids holds an empty id")
		}
	}
	return &Route{TriggerID: t.ID, Method: m, Template: tpl, FunctionID: t.FunctionID, Namespace: t.Namespace,
		Metadata: t.Metadata, Condition: c.ConditionFunctionID, Middlewares: c.MiddlewareFunctionIDs}, nil
}

// RegisterTrigger adds a route; one whose method and shape another
// trigger holds is refused ("Route 'GET /a/:y' conflicts with …").
func (w *Worker) RegisterTrigger(_ context.Context, t client.TriggerRegistration) error {
	r, err := RouteFor(t)
	if err != nil {
		w.log.Warn("http trigger refused", "trigger_id", t.ID, "error", err)
		return err
	}
	if err := w.router.Add(r); err != nil {
		w.log.Warn("http trigger refused", "trigger_id", t.ID, "function_id", t.FunctionID, "error", err)
		return &protocol.ErrorBody{Code: "ROUTE_CONFLICT", Message: err.Error()}
	}
	w.log.Info("route added", "route", r.Label(), "function_id", r.FunctionID, "trigger_id", t.ID)
	return nil
}

// UnregisterTrigger removes a route.
func (w *Worker) UnregisterTrigger(_ context.Context, t client.TriggerRegistration) error {
	w.router.Remove(t.ID)
	return nil
}

var _ client.TriggerHandler = (*Worker)(nil)

// --- requests ---

// errorBody is upstream's error response.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Skipped bool `json:"skipped,omitempty"`
}

func writeError(rw http.ResponseWriter, status int, code, msg string) {
	var b errorBody
	b.Error.Code, b.Error.Message = code, msg
	writeErrorBody(rw, status, b)
}

func writeErrorBody(rw http.ResponseWriter, status int, b errorBody) {
	out, _ := json.Marshal(b)
	rw.Header().Set("Content-Type", "application/json")
	rw.Header().Set("Content-Length", strconv.Itoa(len(out)))
	rw.WriteHeader(status)
	_, _ = rw.Write(out)
}

// Request is the payload a route's function receives (upstream's
// HttpRequest of the trigger-type generation).
type Request struct {
	Method      string            `json:"method"`
	Path        string            `json:"path"`
	PathParams  map[string]string `json:"path_params"`
	QueryParams map[string]string `json:"query_params"`
	Headers     map[string]string `json:"headers"`
	Body        json.RawMessage   `json:"body"`
	Trigger     RequestTrigger    `json:"trigger"`
	// RequestBody and Response are the request's channels (stream.go):
	// the raw body to read, the streamed response to write. Absent with
	// streaming: false.
	RequestBody *protocol.StreamChannelRef `json:"request_body,omitempty"`
	Response    *protocol.StreamChannelRef `json:"response,omitempty"`
}

// RequestTrigger names the trigger the request came through.
type RequestTrigger struct {
	Type   string `json:"type"`
	Path   string `json:"path"`
	Method string `json:"method"`
}

// middlewareInput is what a middleware receives.
type middlewareInput struct {
	Phase   string         `json:"phase"`
	Request middlewareReq  `json:"request"`
	Context map[string]any `json:"context"`
}

type middlewareReq struct {
	PathParams  map[string]string `json:"path_params"`
	QueryParams map[string]string `json:"query_params"`
	Headers     map[string]string `json:"headers"`
	Method      string            `json:"method"`
}

// lowerNames holds the lower-case form of common header names (as
// net/http canonicalises them), so most requests' headers cost no
// strings.ToLower allocation. Read-only: a table that grew with what
// clients send would be theirs to fill.
var lowerNames = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control", "Connection",
		"Content-Encoding", "Content-Length", "Content-Type", "Cookie", "Forwarded", "If-Modified-Since", "If-None-Match",
		"Origin", "Pragma", "Referer", "Traceparent", "Tracestate", "Baggage", "Upgrade", "User-Agent", "X-Api-Key",
		"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip", "X-Request-Id", "X-Requested-With",
		"Sec-Fetch-Dest", "Sec-Fetch-Mode", "Sec-Fetch-Site", "Sec-Ch-Ua", "Sec-Ch-Ua-Mobile", "Sec-Ch-Ua-Platform"} {
		m[k] = strings.ToLower(k)
	}
	return m
}()

func lowerHeaders(h http.Header) map[string]string {
	out := make(map[string]string, len(h)+1) // +1: host
	for k, v := range h {
		lk, ok := lowerNames[k]
		if !ok {
			lk = strings.ToLower(k)
		}
		out[lk] = strings.Join(v, ", ")
	}
	return out
}

func queryParams(r *http.Request) map[string]string {
	out := map[string]string{}
	if r.URL.RawQuery == "" {
		return out
	}
	for k, v := range r.URL.Query() {
		if len(v) > 0 {
			out[k] = v[len(v)-1]
		}
	}
	return out
}

// ServeHTTP is the listener: route → global middleware → body → condition
// → route middleware → function.
func (w *Worker) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	defer func() {
		if p := recover(); p != nil {
			if err, ok := p.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(p)
			}
			w.log.Error("http request panicked", "path", r.URL.Path, "panic", p)
			writeError(rw, http.StatusInternalServerError, CodeInternal, "internal error")
		}
	}()
	lv := w.live.Load()
	// Excess requests wait for a slot, at most default_timeout.
	select {
	case w.sem <- struct{}{}:
		defer func() { <-w.sem }()
	default:
		t := time.NewTimer(lv.timeout)
		select {
		case w.sem <- struct{}{}:
			t.Stop()
			defer func() { <-w.sem }()
		case <-t.C:
			writeError(rw, http.StatusServiceUnavailable, CodeUnavailable, "too many requests in flight (concurrency_request_limit)")
			return
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	origin := r.Header.Get("Origin")
	if origin != "" {
		w.corsHeaders(rw, origin)
	}
	segs, ok := SplitPath(r.URL.EscapedPath())
	if !ok {
		writeError(rw, http.StatusNotFound, CodeNotFound, "no route for "+r.Method+" "+r.URL.Path)
		return
	}
	route, params, allowed := w.router.Match(r.Method, segs)
	if route == nil && r.Method == http.MethodHead {
		// A GET route answers HEAD too (net/http drops the body).
		if route, params, _ = w.router.Match(http.MethodGet, segs); route != nil {
			allowed = nil
		}
	}
	if route == nil {
		if r.Method == http.MethodOptions {
			w.preflight(rw, r, origin, allowed)
			return
		}
		if len(allowed) > 0 {
			rw.Header().Set("Allow", strings.Join(allowed, ", "))
			writeError(rw, http.StatusMethodNotAllowed, CodeMethodNotAllowed, fmt.Sprintf("%s %s: the path is served for %s", r.Method, r.URL.Path, strings.Join(allowed, ", ")))
			return
		}
		writeError(rw, http.StatusNotFound, CodeNotFound, "no route for "+r.Method+" "+r.URL.Path)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), lv.timeout)
	defer cancel()
	headers, query := lowerHeaders(r.Header), queryParams(r)
	if r.Host != "" { // net/http keeps Host out of r.Header
		headers["host"] = r.Host
	}
	var mwIn middlewareInput
	if len(lv.middleware) > 0 || len(route.Middlewares) > 0 {
		mwIn = middlewareInput{Phase: PhasePreHandler, Context: map[string]any{},
			Request: middlewareReq{PathParams: params, QueryParams: query, Headers: headers, Method: r.Method}}
	}
	for _, m := range lv.middleware {
		if w.middleware(ctx, rw, "", m.FunctionID, nil, mwIn) {
			return
		}
	}
	body, status, err := readBody(rw, r)
	if err != nil {
		if status == http.StatusRequestEntityTooLarge {
			writeError(rw, status, CodePayloadTooLarge, fmt.Sprintf("the request body exceeds %d bytes", MaxBodyBytes))
		} else {
			writeError(rw, status, CodeBadRequest, "reading the request body: "+err.Error())
		}
		return
	}
	tpl := route.Template.String()
	req := Request{Method: r.Method, Path: tpl, PathParams: params, QueryParams: query,
		Headers: headers, Body: parseBody(body), Trigger: RequestTrigger{Type: TriggerType, Path: tpl, Method: route.Method}}
	var st RequestStreams
	if w.streams != nil {
		if st, err = w.streams.Open(ctx, body); err != nil {
			w.callFailed(rw, ctx, "opening the request's channels", err, CodeTimeout)
			return
		}
		defer st.Close()
		reqBody, resp := st.Refs()
		req.RequestBody, req.Response = &reqBody, &resp
	}
	payload, err := marshalRequest(req)
	if err != nil {
		writeError(rw, http.StatusInternalServerError, CodeInternal, "encode the request: "+err.Error())
		return
	}
	if route.Condition != "" {
		out, err := w.invoke(ctx, route.Namespace, route.Condition, payload, nil)
		if err != nil {
			w.callFailed(rw, ctx, "condition "+route.Condition, err, CodeTimeout)
			return
		}
		if bytes.Equal(bytes.TrimSpace(out), []byte("false")) {
			var b errorBody
			b.Error.Code, b.Error.Message, b.Skipped = CodeConditionNotMet, "the route's condition "+route.Condition+" answered false", true
			writeErrorBody(rw, http.StatusUnprocessableEntity, b)
			return
		}
	}
	for _, m := range route.Middlewares {
		if w.middleware(ctx, rw, route.Namespace, m, route.Metadata, mwIn) {
			return
		}
	}
	out, err := w.invoke(ctx, route.Namespace, route.FunctionID, payload, route.Metadata)
	if err != nil {
		w.callFailed(rw, ctx, "function "+route.FunctionID, err, CodeTimeout)
		return
	}
	if st != nil && isNullResult(out) {
		// A function that returned null answers through its response
		// channel; each wait there is bounded by default_timeout.
		w.streamResponse(r.Context(), rw, st, lv.timeout, route.Label())
		return
	}
	if err := WriteResponse(rw, out); err != nil {
		w.log.Warn("http function answered no response", "route", route.Label(), "function_id", route.FunctionID, "error", err)
		writeError(rw, http.StatusInternalServerError, CodeInternal, err.Error())
	}
}

func isNullResult(out json.RawMessage) bool {
	out = bytes.TrimSpace(out)
	return len(out) == 0 || bytes.Equal(out, []byte("null"))
}

func (w *Worker) invoke(ctx context.Context, ns, fn string, payload, md json.RawMessage) (json.RawMessage, error) {
	if w.invoker == nil {
		return nil, errors.New("not connected to the engine")
	}
	return w.invoker.Invoke(ctx, ns, fn, payload, md)
}

// callFailed answers a failed call: 504 when default_timeout ran out,
// 500 with the function's message otherwise.
func (w *Worker) callFailed(rw http.ResponseWriter, ctx context.Context, what string, err error, timeoutCode string) {
	if ctx.Err() == context.DeadlineExceeded || client.CodeOf(err) == "TIMEOUT" {
		writeError(rw, http.StatusGatewayTimeout, timeoutCode, what+" did not answer within default_timeout")
		return
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return // the client went away
	}
	w.log.Debug("http call failed", "call", what, "error", err)
	writeError(rw, http.StatusInternalServerError, CodeInternal, what+" failed: "+err.Error())
}

// middleware runs one; true when it answered (or failed) the request.
func (w *Worker) middleware(ctx context.Context, rw http.ResponseWriter, ns, fn string, md json.RawMessage, in middlewareInput) bool {
	payload, _ := json.Marshal(in)
	out, err := w.invoke(ctx, ns, fn, payload, md)
	if err != nil {
		w.callFailed(rw, ctx, "middleware "+fn, err, CodeMiddlewareTimout)
		return true
	}
	var res struct {
		Action   string          `json:"action"`
		Response json.RawMessage `json:"response"`
	}
	if json.Unmarshal(out, &res) != nil || (res.Action != "continue" && res.Action != "respond") {
		writeError(rw, http.StatusInternalServerError, CodeInternal, "middleware "+fn+` answered neither {action:"continue"} nor {action:"respond", response}`)
		return true
	}
	if res.Action == "continue" {
		return false
	}
	if len(res.Response) == 0 {
		res.Response = json.RawMessage(`null`)
	}
	if err := WriteResponse(rw, res.Response); err != nil {
		writeError(rw, http.StatusInternalServerError, CodeInternal, "middleware "+fn+": "+err.Error())
	}
	return true
}

// readBody reads at most MaxBodyBytes.
func readBody(rw http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	if r.ContentLength > MaxBodyBytes {
		return nil, http.StatusRequestEntityTooLarge, errors.New("too large")
	}
	b, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, http.StatusRequestEntityTooLarge, err
		}
		return nil, http.StatusBadRequest, err
	}
	return b, 0, nil
}

// parseBody is the body as JSON: empty → null, JSON → itself, other UTF-8
// text → a JSON string (so a form or plain-text body is not lost), other
// bytes → null.
func parseBody(b []byte) json.RawMessage {
	t := bytes.TrimSpace(b)
	if len(t) == 0 {
		return json.RawMessage("null")
	}
	if protocol.Valid(t) {
		return t
	}
	s, err := json.Marshal(string(b))
	if err != nil || !utf8.Valid(b) {
		return json.RawMessage("null")
	}
	return s
}

// --- CORS ---

func (w *Worker) originAllowed(origin string) (string, bool) {
	if w.cors == nil || len(w.cors.AllowedOrigins) == 0 {
		return "*", true
	}
	for _, o := range w.cors.AllowedOrigins {
		if o == "*" {
			return "*", true
		}
		if strings.EqualFold(strings.TrimRight(o, "/"), origin) {
			return origin, true
		}
	}
	return "", false
}

func (w *Worker) corsHeaders(rw http.ResponseWriter, origin string) {
	allow, ok := w.originAllowed(origin)
	if !ok {
		return
	}
	rw.Header().Set("Access-Control-Allow-Origin", allow)
	if allow != "*" {
		rw.Header().Add("Vary", "Origin")
	}
}

func (w *Worker) allowedMethods() string {
	if w.cors == nil || len(w.cors.AllowedMethods) == 0 {
		return "*"
	}
	ms := make([]string, 0, len(w.cors.AllowedMethods))
	for _, m := range w.cors.AllowedMethods {
		if m == "*" {
			return "*"
		}
		ms = append(ms, strings.ToUpper(m))
	}
	return strings.Join(ms, ", ")
}

// preflight answers an OPTIONS request no route serves: 204 with the
// CORS headers when the origin is allowed (none otherwise: the browser
// then refuses), 404 when the path has no route at all.
func (w *Worker) preflight(rw http.ResponseWriter, r *http.Request, origin string, allowed []string) {
	if len(allowed) == 0 {
		writeError(rw, http.StatusNotFound, CodeNotFound, "no route for "+r.URL.Path)
		return
	}
	if _, ok := w.originAllowed(origin); ok && origin != "" {
		rw.Header().Set("Access-Control-Allow-Methods", w.allowedMethods())
		if h := r.Header.Get("Access-Control-Request-Headers"); h != "" {
			rw.Header().Set("Access-Control-Allow-Headers", h)
		}
		rw.Header().Set("Access-Control-Max-Age", "600")
	}
	rw.Header().Set("Allow", strings.Join(append(allowed, http.MethodOptions), ", "))
	rw.WriteHeader(http.StatusNoContent)
}

var _ http.Handler = (*Worker)(nil)
