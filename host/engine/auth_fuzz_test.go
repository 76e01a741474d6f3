package engine

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/rbac"
)

// FuzzHandshake drives the authentication of a new connection with
// arbitrary headers, query and auth function answers: it never panics, a
// connection is admin only with the exact engine token, a refusal is always
// AUTH_ERROR, and a session a refused auth function never granted does not
// appear.
func FuzzHandshake(f *testing.F) {
	f.Add("Bearer "+testAdminToken, "127.0.0.1:1", "a=b", []byte(`{"allowed_functions":["x"]}`))
	f.Add("bearer  x", "evil.example", "a=%zz", []byte(`null`))
	f.Add("", "[::1]:5", "", []byte(`{"namespaces":{"o":["*"]},"function_registration_prefix":"p"}`))
	f.Add("Basic abc", "localhost", "x=1&x=2", []byte(`[1]`))
	e := New(Options{AdminToken: func() string { return testAdminToken }})
	f.Cleanup(func() { _ = e.Close(context.Background()) })
	lw, err := e.AttachLocalWorker(LocalWorkerSpec{Name: "auth"})
	if err != nil {
		f.Fatal(err)
	}
	answer := make(chan []byte, 1)
	if err := lw.RegisterFunction(FunctionDef{ID: "auth::fuzz"}, func(context.Context, *Call) (json.RawMessage, error) {
		return json.RawMessage(<-answer), nil
	}); err != nil {
		f.Fatal(err)
	}
	withAuth := &ListenerPolicy{Name: "fuzz", RBAC: &rbac.Config{AuthFunctionID: "auth::fuzz"}}
	open := &ListenerPolicy{Name: "open", LoopbackHostOnly: true}
	f.Fuzz(func(t *testing.T, authz, host, query string, result []byte) {
		r := httptest.NewRequest("GET", "http://127.0.0.1/", nil)
		r.Host = host
		r.URL.RawQuery = query
		r.Header.Set("Authorization", authz)
		_ = loopback.Host(host)

		p, errb := e.authenticate(context.Background(), r, open, "127.0.0.1")
		switch {
		case errb != nil:
			if errb.Code != CodeAuthError {
				t.Fatalf("refusal coded %s", errb.Code)
			}
		case p.admin && bearer(r) != testAdminToken:
			t.Fatalf("admin without the token: %q", authz)
		}

		answer <- result
		p, errb = e.authenticate(context.Background(), r, withAuth, "127.0.0.1")
		if len(answer) > 0 {
			<-answer // the engine token skipped the auth function
		}
		if errb != nil {
			if errb.Code != CodeAuthError {
				t.Fatalf("refusal coded %s", errb.Code)
			}
			return
		}
		if !p.admin {
			if _, err := rbac.DecodeAuthResult(result); err != nil {
				t.Fatalf("accepted a result the decoder refuses: %s", result)
			}
		}
	})
}
