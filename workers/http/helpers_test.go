package httpworker

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/client"
)

// fakeInvoker answers calls with functions of the test, recording them.
type fakeInvoker struct {
	mu    sync.Mutex
	fns   map[string]func(ctx context.Context, payload json.RawMessage) (json.RawMessage, error)
	calls []call
}

type call struct {
	ns, fn  string
	payload json.RawMessage
	md      json.RawMessage
}

func (f *fakeInvoker) Invoke(ctx context.Context, ns, fn string, payload, md json.RawMessage) (json.RawMessage, error) {
	f.mu.Lock()
	f.calls = append(f.calls, call{ns, fn, payload, md})
	h := f.fns[fn]
	f.mu.Unlock()
	if h == nil {
		return nil, &client.Error{Code: "function_not_found", Message: "function " + fn + " not found"}
	}
	return h(ctx, payload)
}

func (f *fakeInvoker) called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		out = append(out, c.fn)
	}
	return out
}

func answer(s string) func(context.Context, json.RawMessage) (json.RawMessage, error) {
	return func(context.Context, json.RawMessage) (json.RawMessage, error) { return json.RawMessage(s), nil }
}

type fixture struct {
	w   *Worker
	inv *fakeInvoker
	srv *httptest.Server
}

func newFixture(t *testing.T, cfgJSON string) *fixture {
	t.Helper()
	cfg, err := ParseConfig(json.RawMessage(cfgJSON))
	assert.NilError(t, err)
	inv := &fakeInvoker{fns: map[string]func(context.Context, json.RawMessage) (json.RawMessage, error){}}
	w := New(cfg, Options{Invoker: inv})
	srv := httptest.NewServer(w)
	t.Cleanup(srv.Close)
	return &fixture{w: w, inv: inv, srv: srv}
}

func (f *fixture) route(t *testing.T, id, fn, cfg string) {
	t.Helper()
	assert.NilError(t, f.w.RegisterTrigger(context.Background(), client.TriggerRegistration{ID: id, TriggerType: TriggerType,
		FunctionID: fn, Config: json.RawMessage(cfg), Namespace: "proj"}))
}

func (f *fixture) do(t *testing.T, method, path, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, strings.NewReader(body))
	assert.NilError(t, err)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := f.srv.Client().Do(req)
	assert.NilError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	assert.NilError(t, err)
	return resp, string(b)
}

func errCode(t *testing.T, body string) string {
	t.Helper()
	var e errorBody
	assert.NilError(t, json.Unmarshal([]byte(body), &e), body)
	return e.Error.Code
}

func jsonBody(s string) io.Reader { return strings.NewReader(s) }
