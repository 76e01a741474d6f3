package httpfn

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/protocol"
)

// seen is what the test server received last.
type seen struct {
	mu      sync.Mutex
	method  string
	header  http.Header
	body    []byte
	reached map[string]int
}

func (s *seen) get() (string, http.Header, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.method, s.header, s.body
}

func (s *seen) hits(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reached[path]
}

// endpoints serves the answers the tests need, on 127.0.0.1.
func endpoints(t *testing.T, tlsServer bool) (*httptest.Server, *seen) {
	t.Helper()
	s := &seen{reached: map[string]int{}}
	mux := http.NewServeMux()
	record := func(r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.method, s.header, s.body = r.Method, r.Header.Clone(), b
		s.reached[r.URL.Path]++
		s.mu.Unlock()
	}
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		var in any
		_ = json.Unmarshal(s.body, &in)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"method": r.Method, "body": in})
	})
	mux.HandleFunc("/empty", func(w http.ResponseWriter, r *http.Request) { record(r); w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/invalid", func(w http.ResponseWriter, r *http.Request) { record(r); _, _ = io.WriteString(w, "not-json") })
	mux.HandleFunc("/error-json", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, `{"error":{"code":"UPSTREAM_ERROR","message":"upstream failed"}}`)
	})
	mux.HandleFunc("/error-empty", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{}}`)
	})
	mux.HandleFunc("/error-plain", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, "oops")
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		http.Redirect(w, r, "/echo", http.StatusFound)
	})
	mux.HandleFunc("/redirect-json", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		w.Header().Set("Location", "/echo")
		w.WriteHeader(http.StatusTemporaryRedirect)
		_, _ = io.WriteString(w, `{"moved":true}`)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		record(r)
		_, _ = io.WriteString(w, `"`+strings.Repeat("x", 4096)+`"`)
	})
	var srv *httptest.Server
	if tlsServer {
		srv = httptest.NewTLSServer(mux)
	} else {
		srv = httptest.NewServer(mux)
	}
	t.Cleanup(srv.Close)
	return srv, s
}

// loopbackOK lets the tests reach their own servers on 127.0.0.1.
func loopbackOK() Security { return Security{BlockPrivateIPs: false, RequireHTTPS: false} }

func newInvoker(t *testing.T, opts Options) *Invoker {
	t.Helper()
	inv, err := New(opts)
	assert.NilError(t, err)
	t.Cleanup(inv.Close)
	return inv
}

func prepare(t *testing.T, inv *Invoker, ref protocol.HTTPInvocationRef) *Endpoint {
	t.Helper()
	ep, errb := inv.Prepare(&ref)
	assert.Assert(t, errb == nil, "prepare: %v", errb)
	return ep
}

func ms(n uint64) *uint64 { return &n }

func TestInvokeRequestAndAnswers(t *testing.T) {
	srv, s := endpoints(t, false)
	inv := newInvoker(t, Options{Security: loopbackOK()})
	ctx := context.Background()

	ep := prepare(t, inv, protocol.HTTPInvocationRef{URL: srv.URL + "/echo", Headers: map[string]string{
		"x-custom": "present", "x-iii-Function-Path": "spoofed", "Content-Type": "text/plain",
	}})
	before := time.Now().Unix()
	res, errb := inv.Invoke(ctx, ep, "remote::echo", json.RawMessage(`{"hello":"world"}`))
	assert.Assert(t, errb == nil, "%v", errb)
	assert.Equal(t, string(res), `{"body":{"hello":"world"},"method":"POST"}`)
	method, h, body := s.get()
	assert.Equal(t, method, http.MethodPost, "POST by default")
	assert.Equal(t, string(body), `{"hello":"world"}`)
	assert.Equal(t, h.Get("X-Custom"), "present")
	assert.Equal(t, h.Get("x-iii-function-path"), "remote::echo", "the engine's header wins over the registrant's")
	assert.DeepEqual(t, h.Values("x-iii-function-path"), []string{"remote::echo"})
	assert.Equal(t, h.Get("Content-Type"), "application/json")
	_, err := uuid.Parse(h.Get("x-iii-invocation-id"))
	assert.NilError(t, err, "a fresh invocation id")
	ts, err := strconv.ParseInt(h.Get("x-iii-timestamp"), 10, 64)
	assert.NilError(t, err)
	assert.Assert(t, ts >= before && ts <= time.Now().Unix())
	assert.Equal(t, h.Get("x-iii-signature"), "", "no auth, no signature")
	assert.Equal(t, h.Get("Authorization"), "")

	for _, tc := range []struct {
		name, path, method string
		result             string // when the call succeeds
		code, message      string // when it fails
	}{
		{name: "GET", path: "/echo", method: "GET", result: `{"body":{"n":1},"method":"GET"}`},
		{name: "PUT", path: "/echo", method: "PUT", result: `{"body":{"n":1},"method":"PUT"}`},
		{name: "DELETE", path: "/echo", method: "DELETE", result: `{"body":{"n":1},"method":"DELETE"}`},
		{name: "empty 204 is null", path: "/empty"},
		{name: "not JSON", path: "/invalid", code: CodeInvalidResponse, message: "not JSON"},
		{name: "structured error", path: "/error-json", code: "UPSTREAM_ERROR", message: "upstream failed"},
		{name: "error without fields", path: "/error-empty", code: CodeHTTPError, message: "HTTP request failed"},
		{name: "plain error", path: "/error-plain", code: CodeHTTPError, message: "HTTP 500 Internal Server Error"},
		{name: "redirect is not followed", path: "/redirect"},
		{name: "redirect's JSON body", path: "/redirect-json", result: `{"moved":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			echoes := s.hits("/echo")
			ep := prepare(t, inv, protocol.HTTPInvocationRef{URL: srv.URL + tc.path, Method: tc.method})
			res, errb := inv.Invoke(ctx, ep, "remote::x", json.RawMessage(`{"n":1}`))
			if tc.code != "" {
				assert.Assert(t, errb != nil, "want %s, got %s", tc.code, res)
				assert.Equal(t, errb.Code, tc.code)
				assert.Check(t, is.Contains(errb.Message, tc.message))
				return
			}
			assert.Assert(t, errb == nil, "%v", errb)
			assert.Equal(t, string(res), tc.result)
			if strings.HasPrefix(tc.path, "/redirect") {
				assert.Equal(t, s.hits("/echo"), echoes, "the redirect's target was not called")
			}
		})
	}
}

func TestInvokeTimeoutAndCancel(t *testing.T) {
	srv, _ := endpoints(t, false)
	inv := newInvoker(t, Options{Security: loopbackOK()})
	ep := prepare(t, inv, protocol.HTTPInvocationRef{URL: srv.URL + "/slow", TimeoutMS: ms(150)})
	start := time.Now()
	_, errb := inv.Invoke(context.Background(), ep, "remote::slow", nil)
	assert.Assert(t, errb != nil)
	assert.Equal(t, errb.Code, CodeHTTPRequestFailed)
	assert.Check(t, is.Contains(errb.Message, "no answer within 150ms"))
	assert.Assert(t, time.Since(start) < 5*time.Second, "timeout_ms honoured")

	// The default timeout applies without timeout_ms.
	short := newInvoker(t, Options{Security: loopbackOK(), DefaultTimeout: 100 * time.Millisecond})
	_, errb = short.Invoke(context.Background(), prepare(t, short, protocol.HTTPInvocationRef{URL: srv.URL + "/slow"}), "remote::slow", nil)
	assert.Assert(t, errb != nil && strings.Contains(errb.Message, "no answer within 100ms"), "%v", errb)

	// The caller's context ends the request.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	ep = prepare(t, inv, protocol.HTTPInvocationRef{URL: srv.URL + "/slow"})
	start = time.Now()
	_, errb = inv.Invoke(ctx, ep, "remote::slow", nil)
	assert.Assert(t, errb != nil)
	assert.Assert(t, time.Since(start) < 5*time.Second)
}

func TestInvokeCapsTheAnswer(t *testing.T) {
	srv, _ := endpoints(t, false)
	inv := newInvoker(t, Options{Security: loopbackOK(), MaxResponseBytes: 1024})
	_, errb := inv.Invoke(context.Background(), prepare(t, inv, protocol.HTTPInvocationRef{URL: srv.URL + "/big"}), "remote::big", nil)
	assert.Assert(t, errb != nil)
	assert.Equal(t, errb.Code, CodeHTTPResponseFailed)
	assert.Check(t, is.Contains(errb.Message, "larger than 1024 bytes"))

	big := newInvoker(t, Options{Security: loopbackOK()})
	res, errb := big.Invoke(context.Background(), prepare(t, big, protocol.HTTPInvocationRef{URL: srv.URL + "/big"}), "remote::big", nil)
	assert.Assert(t, errb == nil, "%v", errb)
	assert.Equal(t, len(res), 4098)
}

// The answers being read share a budget: one that would go past it fails,
// and what a call took is given back when it ends.
func TestInvokeAnswerBudget(t *testing.T) {
	srv, _ := endpoints(t, false)
	inv := newInvoker(t, Options{Security: loopbackOK(), AnswerBudget: 1024})
	_, errb := inv.Invoke(context.Background(), prepare(t, inv, protocol.HTTPInvocationRef{URL: srv.URL + "/big"}), "remote::big", nil)
	assert.Assert(t, errb != nil)
	assert.Equal(t, errb.Code, CodeHTTPResponseFailed)
	assert.Check(t, is.Contains(errb.Message, "memory budget"))
	assert.Equal(t, inv.budget.Load(), int64(1024), "given back")

	res, errb := inv.Invoke(context.Background(), prepare(t, inv, protocol.HTTPInvocationRef{URL: srv.URL + "/echo"}), "remote::echo", json.RawMessage(`1`))
	assert.Assert(t, errb == nil, "%v", errb)
	assert.Equal(t, string(res), `{"body":1,"method":"POST"}`)
	assert.Equal(t, inv.budget.Load(), int64(1024), "given back")
}

func TestInvokeAuth(t *testing.T) {
	srv, s := endpoints(t, false)
	env := map[string]string{"TOKEN": "secret-token", "KEY": "key-123", "HMAC": "top-secret"}
	inv := newInvoker(t, Options{Security: loopbackOK(), LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
	call := func(auth string) http.Header {
		t.Helper()
		ep := prepare(t, inv, protocol.HTTPInvocationRef{URL: srv.URL + "/echo", Auth: json.RawMessage(auth),
			Headers: map[string]string{"Authorization": "Bearer from-headers"}})
		_, errb := inv.Invoke(context.Background(), ep, "remote::auth", json.RawMessage(`{"secure":true}`))
		assert.Assert(t, errb == nil, "%v", errb)
		_, h, _ := s.get()
		return h
	}
	h := call(`{"type":"bearer","token_key":"TOKEN"}`)
	assert.DeepEqual(t, h.Values("Authorization"), []string{"Bearer secret-token"})

	h = call(`{"type":"api_key","header":"x-api-key","value_key":"KEY"}`)
	assert.Equal(t, h.Get("X-Api-Key"), "key-123")

	h = call(`{"type":"hmac","secret_key":"HMAC"}`)
	ts, err := strconv.ParseInt(h.Get("x-iii-timestamp"), 10, 64)
	assert.NilError(t, err)
	_, _, body := s.get()
	assert.Equal(t, h.Get("x-iii-signature"), Sign(body, "top-secret", ts))
}

// Sign matches a signature computed independently (Python's hmac):
// HMAC-SHA256 of "1700000000:" + base64(`{"hello":"world"}`), key "secret".
func TestSignKnownAnswer(t *testing.T) {
	assert.Equal(t, Sign([]byte(`{"hello":"world"}`), "secret", 1_700_000_000),
		"sha256=d0490163db52084b80eebdd46f07171996db9c1a1c4934485373495c9f3bbda0")
}

func TestPrepareRefuses(t *testing.T) {
	inv := newInvoker(t, Options{Security: loopbackOK(), LookupEnv: func(k string) (string, bool) { return "v", k == "SET" }})
	for _, tc := range []struct {
		name string
		ref  protocol.HTTPInvocationRef
		code string
		msg  string
	}{
		{"bad url", protocol.HTTPInvocationRef{URL: "://bad-url"}, CodeURLValidationFailed, "Invalid URL"},
		{"lower-case method", protocol.HTTPInvocationRef{URL: "http://127.0.0.1/", Method: "get"}, CodeInvalidArgument, "method"},
		{"HEAD", protocol.HTTPInvocationRef{URL: "http://127.0.0.1/", Method: "HEAD"}, CodeInvalidArgument, "method"},
		{"timeout 0", protocol.HTTPInvocationRef{URL: "http://127.0.0.1/", TimeoutMS: ms(0)}, CodeInvalidArgument, "timeout_ms"},
		{"timeout huge", protocol.HTTPInvocationRef{URL: "http://127.0.0.1/", TimeoutMS: ms(1 << 62)}, CodeInvalidArgument, "timeout_ms"},
		{"header name", protocol.HTTPInvocationRef{URL: "http://127.0.0.1/", Headers: map[string]string{"bad name": "v"}}, CodeInvalidArgument, "header"},
		{"header value", protocol.HTTPInvocationRef{URL: "http://127.0.0.1/", Headers: map[string]string{"x": "a\r\nInjected: 1"}}, CodeInvalidArgument, "header"},
		{"auth type", protocol.HTTPInvocationRef{URL: "http://127.0.0.1/", Auth: json.RawMessage(`{"type":"basic"}`)}, CodeInvalidArgument, "auth.type"},
		{"auth shape", protocol.HTTPInvocationRef{URL: "http://127.0.0.1/", Auth: json.RawMessage(`"bearer"`)}, CodeInvalidArgument, "auth"},
		{"hmac unset", protocol.HTTPInvocationRef{URL: "http://127.0.0.1/", Auth: json.RawMessage(`{"type":"hmac","secret_key":"NOPE"}`)}, CodeSecretNotFound, "NOPE"},
		{"bearer unset", protocol.HTTPInvocationRef{URL: "http://127.0.0.1/", Auth: json.RawMessage(`{"type":"bearer","token_key":"NOPE"}`)}, CodeTokenNotFound, "NOPE"},
		{"api key unset", protocol.HTTPInvocationRef{URL: "http://127.0.0.1/", Auth: json.RawMessage(`{"type":"api_key","header":"x-k","value_key":"NOPE"}`)}, CodeAPIKeyNotFound, "NOPE"},
		{"api key bad header", protocol.HTTPInvocationRef{URL: "http://127.0.0.1/", Auth: json.RawMessage(`{"type":"api_key","header":"a b","value_key":"SET"}`)}, CodeInvalidArgument, "header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errb := inv.Prepare(&tc.ref)
			assert.Assert(t, errb != nil)
			assert.Equal(t, errb.Code, tc.code)
			assert.Check(t, is.Contains(errb.Message, tc.msg))
		})
	}
}

// Under the defaults nothing on this host is reachable: a loopback URL is
// refused before any request, and so is a name that resolves to loopback.
func TestDefaultSecurityRefusesLoopback(t *testing.T) {
	srv, s := endpoints(t, false)
	inv := newInvoker(t, Options{Security: DefaultSecurity()})
	_, errb := inv.Prepare(&protocol.HTTPInvocationRef{URL: srv.URL + "/echo"})
	assert.Equal(t, errb.Code, CodeURLValidationFailed)
	assert.Check(t, is.Contains(errb.Message, ReasonHTTPSRequired))

	httpsOK := newInvoker(t, Options{Security: Security{BlockPrivateIPs: true}})
	_, errb = httpsOK.Prepare(&protocol.HTTPInvocationRef{URL: srv.URL + "/echo"})
	assert.Equal(t, errb.Code, CodeURLValidationFailed)
	assert.Check(t, is.Contains(errb.Message, "127.0.0.1 is a loopback address"))

	// A host name passes registration; the call is refused.
	port := srv.URL[strings.LastIndex(srv.URL, ":")+1:]
	ep := prepare(t, httpsOK, protocol.HTTPInvocationRef{URL: "http://localhost:" + port + "/echo"})
	_, errb = httpsOK.Invoke(context.Background(), ep, "remote::echo", nil)
	assert.Assert(t, errb != nil)
	assert.Equal(t, errb.Code, CodeURLValidationFailed)
	assert.Check(t, is.Contains(errb.Message, ReasonPrivateIPBlocked))
	assert.Equal(t, s.hits("/echo"), 0, "no request reached the server")
}

// The dialer checks the address it connects to, whatever the validator
// thought of the URL: a name that resolved to a public address when it
// was checked and to loopback a moment later (DNS rebinding) is refused.
func TestDialerRefusesPrivateAddresses(t *testing.T) {
	srv, s := endpoints(t, false)
	inv := newInvoker(t, Options{Security: Security{BlockPrivateIPs: true}})
	assert.Assert(t, inv.client.Transport.(*http.Transport).Proxy == nil, "no proxy: the dialer sees the endpoint")
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/echo", nil)
	assert.NilError(t, err)
	_, err = inv.client.Do(req) //nolint:bodyclose // it fails
	assert.Assert(t, err != nil)
	errb := inv.sendError(context.Background(), context.Background(), time.Second, err)
	assert.Equal(t, errb.Code, CodeURLValidationFailed)
	assert.Check(t, is.Contains(errb.Message, "127.0.0.1 is a loopback address"))
	assert.Equal(t, s.hits("/echo"), 0)
}

func TestInvokeTLS(t *testing.T) {
	srv, _ := endpoints(t, true)
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	inv := newInvoker(t, Options{Security: Security{RequireHTTPS: true}, TLSConfig: &tls.Config{RootCAs: roots}})
	res, errb := inv.Invoke(context.Background(), prepare(t, inv, protocol.HTTPInvocationRef{URL: srv.URL + "/echo"}), "remote::tls", json.RawMessage(`1`))
	assert.Assert(t, errb == nil, "%v", errb)
	assert.Equal(t, string(res), `{"body":1,"method":"POST"}`)

	// Without the test CA the certificate is refused.
	strict := newInvoker(t, Options{Security: Security{RequireHTTPS: true}})
	_, errb = strict.Invoke(context.Background(), prepare(t, strict, protocol.HTTPInvocationRef{URL: srv.URL + "/echo"}), "remote::tls", nil)
	assert.Assert(t, errb != nil)
	assert.Equal(t, errb.Code, CodeHTTPRequestFailed)
	assert.Check(t, is.Contains(errb.Message, "certificate"))
}

func TestRedact(t *testing.T) {
	assert.Equal(t, redact("https://u:p@h.example/x?token=1#f"), "https://h.example/x")
	assert.Equal(t, redact("https://h.example/a@b"), "https://h.example/a@b")
}

// The engine calls an Invoker through EngineHook: a prepared endpoint goes
// back to Invoke untyped, even to another Invoker (a reload's); a refused
// registration is a nil endpoint, not a nil *Endpoint in an interface; and
// what no invoker prepared is refused, not called.
func TestEngineHook(t *testing.T) {
	srv, s := endpoints(t, false)
	first := EngineHook{Invoker: newInvoker(t, Options{Security: loopbackOK()})}
	ep, errb := first.Prepare(&protocol.HTTPInvocationRef{URL: srv.URL + "/echo", Method: http.MethodPut})
	assert.Assert(t, errb == nil, "%v", errb)

	next := EngineHook{Invoker: newInvoker(t, Options{Security: loopbackOK()})}
	out, errb := next.Invoke(t.Context(), ep, "svc::echo", json.RawMessage(`{"n":1}`))
	assert.Assert(t, errb == nil, "%v", errb)
	assert.Equal(t, strings.TrimSpace(string(out)), `{"body":{"n":1},"method":"PUT"}`)
	assert.Equal(t, s.hits("/echo"), 1)

	// The new invoker's rules apply to the old endpoint.
	strict := EngineHook{Invoker: newInvoker(t, Options{Security: DefaultSecurity()})}
	_, errb = strict.Invoke(t.Context(), ep, "svc::echo", nil)
	assert.Assert(t, errb != nil)
	assert.Equal(t, errb.Code, CodeURLValidationFailed)

	refused, errb := first.Prepare(&protocol.HTTPInvocationRef{URL: "://bad-url"})
	assert.Assert(t, errb != nil)
	assert.Assert(t, refused == nil, "refused registration gave endpoint %#v", refused)

	for _, bad := range []any{nil, (*Endpoint)(nil), "http://127.0.0.1/"} {
		_, errb = first.Invoke(t.Context(), bad, "svc::echo", nil)
		assert.Assert(t, errb != nil, "%#v", bad)
		assert.Equal(t, errb.Code, CodeHTTPRequestFailed)
	}
	assert.Equal(t, s.hits("/echo"), 1)
}
