package httpworker

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRequestPayloadAndResponse(t *testing.T) {
	f := newFixture(t, `{}`)
	f.route(t, "t1", "app::user", `{"api_path":"users/{id}","http_method":"post"}`)
	var got Request
	f.inv.fns["app::user"] = func(_ context.Context, p json.RawMessage) (json.RawMessage, error) {
		assert.NilError(t, json.Unmarshal(p, &got))
		return json.RawMessage(`{"status_code":201,"headers":{"x-id":"42"},"body":{"ok":true}}`), nil
	}
	resp, _ := f.do(t, "POST", "/users/a%2Fb%20c", "")
	assert.Check(t, is.Equal(resp.StatusCode, 201))
	assert.Check(t, is.DeepEqual(got.PathParams, map[string]string{"id": "a/b c"}), "an encoded / stays in its parameter")
	resp, body := f.do(t, "POST", "/users/42/?q=a&q=b&z=1", `{"name":"Ada"}`, "X-Custom", "v", "Content-Type", "application/json")
	assert.Equal(t, resp.StatusCode, 201)
	assert.Equal(t, resp.Header.Get("X-Id"), "42")
	assert.Equal(t, resp.Header.Get("Content-Type"), "application/json")
	assert.Equal(t, body, `{"ok":true}`)
	assert.Check(t, is.Equal(got.Method, "POST"))
	assert.Check(t, is.Equal(got.Path, "/users/:id"))
	assert.Check(t, is.DeepEqual(got.PathParams, map[string]string{"id": "42"}))
	assert.Check(t, is.DeepEqual(got.QueryParams, map[string]string{"q": "b", "z": "1"}))
	assert.Check(t, is.Equal(got.Headers["x-custom"], "v"))
	assert.Check(t, is.Equal(got.Headers["content-type"], "application/json"))
	assert.Check(t, is.Equal(got.Headers["host"], strings.TrimPrefix(f.srv.URL, "http://")))
	assert.Check(t, is.Equal(string(got.Body), `{"name":"Ada"}`))
	assert.Check(t, is.DeepEqual(got.Trigger, RequestTrigger{Type: "http", Path: "/users/:id", Method: "POST"}))
	f.inv.mu.Lock()
	assert.Check(t, is.Equal(f.inv.calls[0].ns, "proj"), "the function is called in the trigger's namespace")
	f.inv.mu.Unlock()
}

func TestBodies(t *testing.T) {
	f := newFixture(t, `{}`)
	f.route(t, "t1", "echo", `{"api_path":"/b","http_method":"PUT"}`)
	f.inv.fns["echo"] = func(_ context.Context, p json.RawMessage) (json.RawMessage, error) {
		var r Request
		_ = json.Unmarshal(p, &r)
		return json.Marshal(map[string]any{"body": r.Body})
	}
	for _, tc := range []struct{ in, want string }{
		{"", "null"}, {"  ", "null"}, {`[1,2]`, `[1,2]`}, {`"s"`, `"s"`}, {"a=1&b=2", `"a=1\u0026b=2"`}, {"\xff\xfe", "null"},
	} {
		_, body := f.do(t, "PUT", "/b", tc.in)
		if tc.want == "null" {
			assert.Check(t, is.Equal(body, ""), "in %q", tc.in) // body null → empty response
			continue
		}
		assert.Check(t, is.Equal(body, tc.want), "in %q", tc.in)
	}
}

func TestBuildResponse(t *testing.T) {
	for _, tc := range []struct {
		name, in  string
		status    int
		headers   map[string][]string
		body, err string
	}{
		{"defaults", `{"status_code":204}`, 204, map[string][]string{"Content-Type": {"application/json"}}, "{}", ""},
		{"null body", `{"status_code":200,"body":null}`, 200, map[string][]string{}, "", ""},
		{"string raw with content-type", `{"headers":{"Content-Type":"text/plain"},"body":"hi"}`, 200, map[string][]string{"Content-Type": {"text/plain"}}, "hi", ""},
		{"string as JSON", `{"body":"hi"}`, 200, map[string][]string{"Content-Type": {"application/json"}}, `"hi"`, ""},
		{"header list", `{"headers":["X-A: 1","X-A: 2"],"body":1}`, 200, map[string][]string{"X-A": {"1", "2"}, "Content-Type": {"application/json"}}, "1", ""},
		{"header array values", `{"headers":{"set-cookie":["a=1","b=2"]},"body":{}}`, 200, map[string][]string{"Set-Cookie": {"a=1", "b=2"}, "Content-Type": {"application/json"}}, "{}", ""},
		{"hop headers dropped", `{"headers":{"Content-Length":"99","Connection":"close"},"body":{}}`, 200, map[string][]string{"Content-Type": {"application/json"}}, "{}", ""},
		{"null result", `null`, 200, map[string][]string{}, "", ""},
		{"plain object", `{"hello":1}`, 200, map[string][]string{"Content-Type": {"application/json"}}, `{"hello":1}`, ""},
		{"array", `[1]`, 200, map[string][]string{"Content-Type": {"application/json"}}, `[1]`, ""},
		{"bad status", `{"status_code":42}`, 0, nil, "", "not an HTTP status"},
		{"status type", `{"status_code":"200"}`, 0, nil, "", "not {status_code"},
		{"header injection", `{"headers":{"X":"a\r\nSet-Cookie: x"}}`, 0, nil, "", "line break"},
		{"bad header name", `{"headers":{"X Y":"a"}}`, 0, nil, "", "not valid"},
		{"bad header list", `{"headers":["nocolon"]}`, 0, nil, "", "Name: value"},
		{"bad headers type", `{"headers":5}`, 0, nil, "", "neither"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, h, body, err := BuildResponse(json.RawMessage(tc.in))
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.Check(t, is.Equal(status, tc.status))
			assert.Check(t, is.DeepEqual(map[string][]string(h), tc.headers))
			assert.Check(t, is.Equal(string(body), tc.body))
		})
	}
}

func TestErrors(t *testing.T) {
	f := newFixture(t, `{"default_timeout":200}`)
	f.route(t, "t1", "ok", `{"api_path":"/a/:x"}`)
	f.route(t, "t2", "fails", `{"api_path":"/fail"}`)
	f.route(t, "t3", "slow", `{"api_path":"/slow"}`)
	f.route(t, "t4", "bad", `{"api_path":"/bad"}`)
	f.inv.fns["ok"] = answer(`{"body":"ok"}`)
	f.inv.fns["fails"] = func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return nil, &client.Error{Code: "boom", Message: "it broke"}
	}
	f.inv.fns["slow"] = func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	f.inv.fns["bad"] = answer(`{"status_code":1}`)
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/nope", 404, CodeNotFound},
		{"GET", "/a", 404, CodeNotFound},
		{"POST", "/a/1", 405, CodeMethodNotAllowed},
		{"HEAD", "/a/1", 200, ""},
		{"GET", "/fail", 500, CodeInternal},
		{"GET", "/slow", 504, CodeTimeout},
		{"GET", "/bad", 500, CodeInternal},
	} {
		t.Run(tc.method+tc.path, func(t *testing.T) {
			resp, body := f.do(t, tc.method, tc.path, "")
			assert.Check(t, is.Equal(resp.StatusCode, tc.status), body)
			if tc.method == "HEAD" { // served by the GET route, without a body
				assert.Check(t, is.Equal(body, ""))
				return
			}
			assert.Check(t, is.Equal(errCode(t, body), tc.code))
			assert.Check(t, is.Equal(resp.Header.Get("Content-Type"), "application/json"))
			if tc.status == 405 {
				assert.Check(t, is.Equal(resp.Header.Get("Allow"), "GET"))
			}
		})
	}
}

func TestBodyLimit(t *testing.T) {
	f := newFixture(t, `{}`)
	f.route(t, "t1", "echo", `{"api_path":"/up","http_method":"POST"}`)
	f.inv.fns["echo"] = answer(`{"body":"ok"}`)
	big := strings.Repeat("x", MaxBodyBytes+1)
	resp, body := f.do(t, "POST", "/up", big)
	assert.Check(t, is.Equal(resp.StatusCode, 413))
	assert.Check(t, is.Equal(errCode(t, body), CodePayloadTooLarge))
	// Without a Content-Length (chunked): refused while reading.
	req, err := http.NewRequest("POST", f.srv.URL+"/up", struct{ *strings.Reader }{strings.NewReader(big)})
	assert.NilError(t, err)
	resp, err = f.srv.Client().Do(req)
	if err == nil { // the server may close before the client finished sending
		resp.Body.Close()
		assert.Check(t, is.Equal(resp.StatusCode, 413))
	}
	assert.Check(t, is.DeepEqual(f.inv.called(), []string(nil)), "the function is never called")
	resp, _ = f.do(t, "POST", "/up", strings.Repeat("x", 1024))
	assert.Check(t, is.Equal(resp.StatusCode, 200))
}

func TestConditionAndMiddleware(t *testing.T) {
	f := newFixture(t, `{"middleware":[{"function_id":"mw::second","priority":5},{"function_id":"mw::first","phase":"preHandler","priority":1}]}`)
	f.route(t, "t1", "h", `{"api_path":"/c/:x","condition_function_id":"cond","middleware_function_ids":["mw::route"]}`)
	f.inv.fns["mw::first"] = answer(`{"action":"continue"}`)
	f.inv.fns["mw::second"] = func(_ context.Context, p json.RawMessage) (json.RawMessage, error) {
		var in middlewareInput
		assert.NilError(t, json.Unmarshal(p, &in))
		if in.Request.Headers["authorization"] == "" {
			return json.RawMessage(`{"action":"respond","response":{"status_code":401,"body":{"error":"no"}}}`), nil
		}
		assert.Check(t, is.Equal(in.Phase, "preHandler"))
		assert.Check(t, in.Request.PathParams["x"] != "")
		return json.RawMessage(`{"action":"continue"}`), nil
	}
	f.inv.fns["cond"] = func(_ context.Context, p json.RawMessage) (json.RawMessage, error) {
		var r Request
		_ = json.Unmarshal(p, &r)
		return json.Marshal(r.PathParams["x"] != "no")
	}
	f.inv.fns["mw::route"] = answer(`{"action":"continue"}`)
	f.inv.fns["h"] = answer(`{"body":"done"}`)

	resp, body := f.do(t, "GET", "/c/1", "")
	assert.Check(t, is.Equal(resp.StatusCode, 401))
	assert.Check(t, is.Equal(body, `{"error":"no"}`))
	assert.Check(t, is.DeepEqual(f.inv.called(), []string{"mw::first", "mw::second"}))

	f.inv.calls = nil
	resp, body = f.do(t, "GET", "/c/1", "", "Authorization", "x")
	assert.Check(t, is.Equal(resp.StatusCode, 200))
	assert.Check(t, is.Equal(body, `"done"`))
	assert.Check(t, is.DeepEqual(f.inv.called(), []string{"mw::first", "mw::second", "cond", "mw::route", "h"}))

	f.inv.calls = nil
	resp, body = f.do(t, "GET", "/c/no", "", "Authorization", "x")
	assert.Check(t, is.Equal(resp.StatusCode, 422))
	assert.Check(t, is.Equal(body, `{"error":{"code":"CONDITION_NOT_MET","message":"the route's condition cond answered false"},"skipped":true}`))
	assert.Check(t, is.DeepEqual(f.inv.called(), []string{"mw::first", "mw::second", "cond"}))

	// A middleware that answers nonsense, or fails.
	f.inv.fns["mw::first"] = answer(`{"action":"maybe"}`)
	resp, body = f.do(t, "GET", "/c/1", "")
	assert.Check(t, is.Equal(resp.StatusCode, 500))
	assert.Check(t, is.Equal(errCode(t, body), CodeInternal))

	// Live: middleware and default_timeout change without a restart.
	cfg, err := ParseConfig(json.RawMessage(`{"default_timeout":100,"middleware":[{"function_id":"mw::slow"}]}`))
	assert.NilError(t, err)
	f.w.Reconfigure(cfg)
	f.inv.fns["mw::slow"] = func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	resp, body = f.do(t, "GET", "/c/1", "")
	assert.Check(t, is.Equal(resp.StatusCode, 504))
	assert.Check(t, is.Equal(errCode(t, body), CodeMiddlewareTimout))
}

func TestCORS(t *testing.T) {
	f := newFixture(t, `{"cors":{"allowed_origins":["https://app.example"],"allowed_methods":["GET","POST"]}}`)
	f.route(t, "t1", "h", `{"api_path":"/x","http_method":"POST"}`)
	f.inv.fns["h"] = answer(`{"body":1}`)
	resp, _ := f.do(t, "POST", "/x", "", "Origin", "https://app.example")
	assert.Check(t, is.Equal(resp.Header.Get("Access-Control-Allow-Origin"), "https://app.example"))
	assert.Check(t, is.Equal(resp.Header.Get("Vary"), "Origin"))
	resp, _ = f.do(t, "POST", "/x", "", "Origin", "https://evil.example")
	assert.Check(t, is.Equal(resp.Header.Get("Access-Control-Allow-Origin"), ""))

	resp, _ = f.do(t, "OPTIONS", "/x", "", "Origin", "https://app.example", "Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "content-type")
	assert.Check(t, is.Equal(resp.StatusCode, 204))
	assert.Check(t, is.Equal(resp.Header.Get("Access-Control-Allow-Methods"), "GET, POST"))
	assert.Check(t, is.Equal(resp.Header.Get("Access-Control-Allow-Headers"), "content-type"))
	assert.Check(t, is.Equal(resp.Header.Get("Access-Control-Allow-Origin"), "https://app.example"))
	resp, _ = f.do(t, "OPTIONS", "/x", "", "Origin", "https://evil.example", "Access-Control-Request-Method", "POST")
	assert.Check(t, is.Equal(resp.StatusCode, 204))
	assert.Check(t, is.Equal(resp.Header.Get("Access-Control-Allow-Methods"), ""))
	resp, _ = f.do(t, "OPTIONS", "/none", "", "Origin", "https://app.example")
	assert.Check(t, is.Equal(resp.StatusCode, 404))

	// The seed: any origin.
	g := newFixture(t, DefaultConfig)
	g.route(t, "t1", "h", `{"api_path":"/x"}`)
	g.inv.fns["h"] = answer(`{"body":1}`)
	resp, _ = g.do(t, "GET", "/x", "", "Origin", "https://any.example")
	assert.Check(t, is.Equal(resp.Header.Get("Access-Control-Allow-Origin"), "*"))
	assert.Check(t, is.Equal(f.inv.called()[0], "h"))
}

func TestConcurrencyLimit(t *testing.T) {
	f := newFixture(t, `{"concurrency_request_limit":1,"default_timeout":300}`)
	f.route(t, "t1", "hold", `{"api_path":"/hold"}`)
	f.route(t, "t2", "quick", `{"api_path":"/quick"}`)
	entered, release := make(chan struct{}), make(chan struct{})
	f.inv.fns["hold"] = func(context.Context, json.RawMessage) (json.RawMessage, error) {
		close(entered)
		// Holds its slot past default_timeout, until released.
		select {
		case <-release:
		case <-time.After(waitfor.Default):
		}
		return json.RawMessage(`{"body":"held"}`), nil
	}
	f.inv.fns["quick"] = answer(`{"body":"q"}`)
	done := make(chan int, 1)
	go func() {
		resp, err := f.srv.Client().Get(f.srv.URL + "/hold")
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	waitfor.Closed(t, entered, waitfor.Default, "the first request holds the only slot")
	resp, body := f.do(t, "GET", "/quick", "")
	assert.Check(t, is.Equal(resp.StatusCode, 503), body)
	assert.Check(t, is.Equal(errCode(t, body), CodeUnavailable))
	close(release)
	assert.Check(t, is.Equal(waitfor.Recv(t, done, waitfor.Default, "the held request"), 200))
	resp, _ = f.do(t, "GET", "/quick", "")
	assert.Check(t, is.Equal(resp.StatusCode, 200))
}

// Slowloris: a client that never finishes its headers is cut off by
// ReadHeaderTimeout; here the listener's settings are checked, and a
// header block over MaxHeaderBytes is refused.
func TestListenerLimits(t *testing.T) {
	cfg, err := ParseConfig(json.RawMessage(`{"port":0}`))
	assert.NilError(t, err)
	w := New(cfg, Options{Invoker: &fakeInvoker{}})
	assert.NilError(t, w.Listen())
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
		defer cancel()
		assert.NilError(t, w.Close(ctx))
	}()
	assert.Check(t, strings.HasPrefix(w.Addr().String(), "127.0.0.1:"), "bound to loopback by default")
	assert.Check(t, is.Equal(w.srv.ReadHeaderTimeout, ReadHeaderTimeout))
	assert.Check(t, is.Equal(w.srv.MaxHeaderBytes, MaxHeaderBytes))

	conn, err := net.Dial("tcp", w.Addr().String())
	assert.NilError(t, err)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(waitfor.Default))
	_, err = conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", MaxHeaderBytes+8192) + "\r\n\r\n"))
	assert.NilError(t, err)
	buf := make([]byte, 64)
	n, _ := conn.Read(buf)
	assert.Check(t, is.Contains(string(buf[:n]), "431"))
}

func TestConfig(t *testing.T) {
	for _, tc := range []struct{ in, err string }{
		{`{}`, ""},
		{DefaultConfig, ""},
		{`{"port":3111,"host":"0.0.0.0","default_timeout":1000,"concurrency_request_limit":0,"middleware":[{"function_id":"a","phase":"preHandler","priority":2}],"webhook_listener":null}`, ""},
		{`{"bogus":1}`, "unknown field"},
		{`{"port":70000}`, "not a TCP port"},
		{`{"host":"example.com"}`, "not an IP address"},
		{`{"default_timeout":0}`, "positive"},
		{`{"concurrency_request_limit":-1}`, "0 or more"},
		{`{"middleware":[{"phase":"preHandler"}]}`, "function_id is required"},
		{`{"middleware":[{"function_id":"a","phase":"onResponse"}]}`, "unknown"},
		{`{"webhook_listener":{"port":1}}`, "not supported"},
		{`{"cors":{"allowed_methods":["GE T"]}}`, "not an HTTP method"},
		{`[1]`, "INVALID_CONFIG"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			c, err := ParseConfig(json.RawMessage(tc.in))
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			assert.Check(t, c.Concurrency() >= 1)
		})
	}
	c, _ := ParseConfig(nil)
	assert.Equal(t, c.Addr(), "127.0.0.1:3111")
	assert.Equal(t, c.Timeout(), 30*time.Second)
	assert.Equal(t, c.Concurrency(), 1024)
}

func TestTriggerConfig(t *testing.T) {
	f := newFixture(t, `{}`)
	for _, tc := range []struct{ cfg, err string }{
		{`{"http_method":"GET"}`, "api_path is required"},
		{`"x"`, "needs an object"},
		{`{"api_path":"/a/:"}`, "needs a name"},
		{`{"api_path":"/a","http_method":"G ET"}`, "not an HTTP method"},
		{`{"api_path":"/a","public_webhook":true}`, "public_webhook"},
	} {
		err := f.w.RegisterTrigger(context.Background(), client.TriggerRegistration{ID: "x", FunctionID: "f", Config: json.RawMessage(tc.cfg)})
		assert.ErrorContains(t, err, tc.err)
	}
	f.route(t, "a", "f", `{"api_path":"/a/:x"}`)
	err := f.w.RegisterTrigger(context.Background(), client.TriggerRegistration{ID: "b", FunctionID: "g", Config: json.RawMessage(`{"api_path":"/a/:y"}`)})
	assert.ErrorContains(t, err, "Route 'GET /a/:y' conflicts with 'GET /a/:x'")
	assert.NilError(t, f.w.UnregisterTrigger(context.Background(), client.TriggerRegistration{ID: "a"}))
	f.route(t, "b", "g", `{"api_path":"/a/:y"}`)
}

func TestMakefileVersionAndSeed(t *testing.T) {
	b, err := os.ReadFile("../../Makefile")
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), "HTTP_VERSION ?= "+Version+"\n"))
	assert.Check(t, is.Contains(string(b), "HTTP_DEFAULTS := "+DefaultConfig+"\n"))
}

// TestSlowloris: a client that opens a request and never finishes its
// headers is disconnected once ReadHeaderTimeout passes; meanwhile others
// are served.
func TestSlowloris(t *testing.T) {
	cfg, err := ParseConfig(json.RawMessage(`{"port":0}`))
	assert.NilError(t, err)
	inv := &fakeInvoker{fns: map[string]func(context.Context, json.RawMessage) (json.RawMessage, error){"f": answer(`{"body":1}`)}}
	w := New(cfg, Options{Invoker: inv, ReadHeaderTimeout: 200 * time.Millisecond})
	assert.NilError(t, w.Listen())
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
		defer cancel()
		assert.NilError(t, w.Close(ctx))
	}()
	assert.NilError(t, w.RegisterTrigger(context.Background(), client.TriggerRegistration{ID: "t", FunctionID: "f", Config: json.RawMessage(`{"api_path":"/f"}`)}))
	var slow []net.Conn
	for range 16 {
		conn, err := net.Dial("tcp", w.Addr().String())
		assert.NilError(t, err)
		defer conn.Close()
		_, err = conn.Write([]byte("GET /f HTTP/1.1\r\nHost: x\r\nX-Slow: "))
		assert.NilError(t, err)
		slow = append(slow, conn)
	}
	resp, err := (&http.Client{Timeout: waitfor.Default}).Get("http://" + w.Addr().String() + "/f")
	assert.NilError(t, err)
	resp.Body.Close()
	assert.Check(t, is.Equal(resp.StatusCode, 200))
	for _, conn := range slow {
		_ = conn.SetReadDeadline(time.Now().Add(waitfor.Default))
		buf := make([]byte, 512)
		var err error
		for err == nil {
			_, err = conn.Read(buf) // a 408 may come first, then the close
		}
		var ne net.Error
		assert.Check(t, !(errors.As(err, &ne) && ne.Timeout()), "the server closed the connection: %v", err)
	}
}

func TestMarshalRequest(t *testing.T) {
	r := Request{Method: "GET", Path: `/,"body":null`, PathParams: map[string]string{`,"body":null`: `,"body":null`},
		QueryParams: map[string]string{}, Headers: map[string]string{"x": `,"body":null`}, Body: json.RawMessage(`{"a":[1]}`),
		Trigger: RequestTrigger{Type: "http"}}
	b, err := marshalRequest(r)
	assert.NilError(t, err)
	var back Request
	assert.NilError(t, json.Unmarshal(b, &back), string(b))
	r.Body, back.Body = nil, json.RawMessage(compactJSON(t, back.Body))
	assert.Check(t, is.Equal(string(back.Body), `{"a":[1]}`))
	back.Body = nil
	assert.Check(t, is.DeepEqual(back, r))
}

func compactJSON(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var v any
	assert.NilError(t, json.Unmarshal(raw, &v))
	b, _ := json.Marshal(v)
	return string(b)
}
