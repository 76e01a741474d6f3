package httpworker

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// FuzzRouter: any template parses or is refused, and matching any path
// against what parsed never panics; a template matches its own rendering.
func FuzzRouter(f *testing.F) {
	f.Add("users/:id", "/users/42")
	f.Add("/a/{b}/c/", "//a/x/c")
	f.Add("/:a/:b", "/")
	f.Add("{}", "/%zz")
	f.Fuzz(func(t *testing.T, tpl, path string) {
		rt := NewRouter()
		tp, err := ParseTemplate(tpl)
		if err != nil {
			return
		}
		if err := rt.Add(&Route{TriggerID: "t", Method: "GET", Template: tp}); err != nil {
			t.Fatal(err)
		}
		if segs, ok := SplitPath(path); ok {
			rt.Match("GET", segs)
			rt.Match("POST", segs)
		}
		again, err := ParseTemplate(tp.String())
		if err != nil || again.String() != tp.String() {
			t.Fatalf("%q renders as %q, which parses as %q (%v)", tpl, tp.String(), again.String(), err)
		}
		// A request for the template's literals (escaped, as a client
		// sends them) and a value for each parameter matches it.
		var p strings.Builder
		for _, s := range tp.segs {
			p.WriteByte('/')
			if s.param != "" {
				p.WriteString("v")
			} else {
				p.WriteString(url.PathEscape(s.lit))
			}
		}
		segs, _ := SplitPath(p.String())
		if r, _, _ := rt.Match("GET", segs); r == nil {
			t.Fatalf("%q does not match the request %q", tpl, p.String())
		}
	})
}

// FuzzBuildResponse: any function result is a response or an error.
func FuzzBuildResponse(f *testing.F) {
	f.Add(`{"status_code":201,"headers":{"a":"b"},"body":{"x":1}}`)
	f.Add(`{"headers":["A: b"],"body":"s"}`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, s string) {
		_, _, _, _ = BuildResponse(json.RawMessage(s))
	})
}

// FuzzParseConfig: any configuration is accepted or refused.
func FuzzParseConfig(f *testing.F) {
	f.Add(DefaultConfig)
	f.Add(`{"port":0,"middleware":[{"function_id":"a"}]}`)
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseConfig(json.RawMessage(s))
		if err == nil {
			_ = c.Addr()
			_ = c.GlobalMiddleware()
		}
	})
}

// FuzzStreamControl: any text message on a response channel (what a
// function writes) sets a valid status and header, or is refused; never a
// panic, never a header with a line break.
func FuzzStreamControl(f *testing.F) {
	for _, s := range []string{`{"type":"set_status","status_code":201}`, `{"type":"set_headers","headers":{"a":"b"}}`,
		`{"type":"set_headers","headers":["A: b"]}`, `{"type":"set_headers","headers":{"a":["1","2"]}}`, `{}`, `null`, `[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		h, status := http.Header{}, 200
		if err := applyControl(h, &status, msg); err != nil {
			return
		}
		if status < 100 || status > 999 {
			t.Fatalf("status %d from %q", status, msg)
		}
		for k, vs := range h {
			for _, v := range vs {
				if strings.ContainsAny(k+v, "\r\n\x00") {
					t.Fatalf("header %q: %q from %q", k, v, msg)
				}
			}
		}
	})
}
