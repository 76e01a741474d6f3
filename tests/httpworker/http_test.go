package httpworker

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/icmd"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
	httpw "github.com/iii-sandbox/iii/workers/http"
)

// routeWait bounds the wait for a route to appear (the Node worker's
// trigger is parked until the http worker provides the type).
const routeWait = time.Minute

type reply struct {
	status int
	header http.Header
	body   string
}

func request(t *testing.T, c *http.Client, method, url, body string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	assert.NilError(t, err)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	assert.NilError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	assert.NilError(t, err)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func errCode(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	assert.NilError(t, json.Unmarshal([]byte(body), &e), body)
	return e.Error.Code
}

// startProject runs a project of the Node worker app and containers (a
// containers: block indented by two). No namespace: the published Node
// iii-sdk 0.22.1 knows none (docs/standard-workers.md).
func startProject(t *testing.T, containers string) *composeproj.Project {
	t.Helper()
	if testing.Short() {
		t.Skip("runs iii compose --up with an engine and a Node worker")
	}
	return composeproj.StartNodeApp(t, iii, containers)
}

// waitRoute waits for the Node worker's GET /hello/:who: its trigger is
// parked until the http worker provides the type.
func waitRoute(t *testing.T, c *http.Client, base string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		r := request(t, c, "GET", base+"/hello/world", "")
		if r.status != 200 {
			return poll.Continue("GET /hello/world: %d %s", r.status, r.body)
		}
		return poll.Success()
	}, poll.WithTimeout(routeWait), poll.WithDelay(100*time.Millisecond))
}

// TestComposeUpHTTP: a project declaring `worker: package://http` is
// resolved, locked, installed and run from the default registry; the Node
// worker's routes answer a real HTTP client with their status, headers
// and body; a duplicate route is refused, and bad requests get upstream's
// errors (404, 405, 413).
func TestComposeUpHTTP(t *testing.T) {
	t.Parallel()
	httpPort, err := loopback.FreePort()
	assert.NilError(t, err)
	p := startProject(t, fmt.Sprintf(`  http:
    worker: package://http
    version: '^0.22'
    config_override:
      port: %d
      default_timeout: 10000
`, httpPort))
	p.WaitReady(t, "http", "app")

	lock, err := os.ReadFile(filepath.Join(p.Dir, "worker-compose.lock"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(lock), httpw.Version))
	_, err = os.Stat(filepath.Join(p.StateDir, "packages", "http-"+httpw.Version+"-"+registry.HostPlatform().Target(), "http"))
	assert.NilError(t, err, "the package is installed in the cache")

	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	c := &http.Client{Timeout: time.Minute}
	waitRoute(t, c, base)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		r := request(t, c, "POST", base+"/users/probe", "{}")
		if r.status != 201 {
			return poll.Continue("POST /users/probe: %d %s", r.status, r.body)
		}
		return poll.Success()
	}, poll.WithTimeout(routeWait), poll.WithDelay(100*time.Millisecond))

	// A path parameter, a query, a JSON body and a header in; status,
	// headers and body out.
	r := request(t, c, "POST", base+"/users/42?verbose=yes", `{"name":"Ada"}`, "Content-Type", "application/json", "X-Test-Agent", "go")
	assert.Check(t, is.Equal(r.status, 201), r.body)
	assert.Check(t, is.Equal(r.header.Get("X-User-Id"), "42"))
	assert.Check(t, is.Equal(r.header.Get("Content-Type"), "application/json"))
	var got map[string]any
	assert.NilError(t, json.Unmarshal([]byte(r.body), &got), r.body)
	assert.Check(t, is.DeepEqual(got, map[string]any{"id": "42", "verbose": "yes", "name": "Ada", "method": "POST", "path": "/users/:id", "agent": "go"}))

	// A string body with the function's content-type is sent as is; a
	// header list is accepted; trailing slash does not matter.
	r = request(t, c, "GET", base+"/hello/world/", "")
	assert.Check(t, is.Equal(r.status, 200))
	assert.Check(t, is.Equal(r.body, "hello world"))
	assert.Check(t, is.Equal(r.header.Get("Content-Type"), "text/plain; charset=utf-8"))
	assert.Check(t, is.Equal(r.header.Get("X-Hello"), "yes"))

	// A streamed response (the http() helper of @iii-dev/helpers): status
	// and headers from the response channel, the body in pieces, the raw
	// request body read from request_body.
	r = request(t, c, "POST", base+"/stream", "plain <text>", "Content-Type", "text/plain")
	assert.Check(t, is.Equal(r.status, 206), r.body)
	assert.Check(t, is.Equal(r.header.Get("Content-Type"), "text/plain"))
	assert.Check(t, is.Equal(r.header.Get("X-Streamed"), "yes"))
	assert.Check(t, is.Equal(r.body, "part one; you sent 12 bytes: plain <text>"))

	// A duplicate route is refused: the http worker says why, and the
	// first one still answers.
	p.MustCall(t, "app::add-dup")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if log := p.Log("http"); !strings.Contains(log, "Route 'POST /users/:other' conflicts with 'POST /users/:id'") {
			return poll.Continue("the http worker's log does not name the conflict yet:\n%s", composeproj.Tail(log, 20))
		}
		return poll.Success()
	}, poll.WithTimeout(routeWait), poll.WithDelay(100*time.Millisecond))
	r = request(t, c, "POST", base+"/users/7", `{}`)
	assert.Check(t, is.Equal(r.status, 201), r.body)

	// Bad requests.
	r = request(t, c, "GET", base+"/nope", "")
	assert.Check(t, is.Equal(r.status, 404))
	assert.Check(t, is.Equal(errCode(t, r.body), "NOT_FOUND"))
	r = request(t, c, "DELETE", base+"/users/42", "")
	assert.Check(t, is.Equal(r.status, 405))
	assert.Check(t, is.Equal(errCode(t, r.body), "METHOD_NOT_ALLOWED"))
	assert.Check(t, is.Equal(r.header.Get("Allow"), "POST"))
	r = request(t, c, "POST", base+"/users/42", strings.Repeat("x", httpw.MaxBodyBytes+1))
	assert.Check(t, is.Equal(r.status, 413))
	assert.Check(t, is.Equal(errCode(t, r.body), "PAYLOAD_TOO_LARGE"))
	// CORS from the registry seed: any origin.
	r = request(t, c, "OPTIONS", base+"/users/42", "", "Origin", "https://app.example", "Access-Control-Request-Method", "POST")
	assert.Check(t, is.Equal(r.status, 204))
	assert.Check(t, is.Equal(r.header.Get("Access-Control-Allow-Origin"), "*"))
	assert.Check(t, is.Equal(r.header.Get("Access-Control-Allow-Methods"), "GET, POST, PUT, DELETE, OPTIONS"))

	// default_timeout changed live through the configuration entry "http"
	// (the worker name): the 3 s function now answers 504.
	p.CallNS("default", "configuration::register", "--json",
		`{"id":"http","schema":{},"initial_value":{"default_timeout":300}}`).Assert(t, icmd.Success)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		r := request(t, c, "GET", base+"/slow", "")
		if r.status != 504 {
			return poll.Continue("GET /slow: %d %s", r.status, r.body)
		}
		if code := errCode(t, r.body); code != "TIMEOUT" {
			return poll.Error(fmt.Errorf("GET /slow: 504 with %s", r.body))
		}
		return poll.Success()
	}, poll.WithTimeout(routeWait), poll.WithDelay(100*time.Millisecond))

	// http::configuration-id answers the entry id.
	out := p.MustCall(t, httpw.FnConfigurationID)
	assert.Check(t, is.Contains(out, `"http"`))

	p.Stop(t)
}

// TestComposeAddHTTP: `compose::add` of the http package (a container
// object, to give it a free port) from the default registry, offline,
// edits the file and the lock and starts it; the Node worker's parked
// route then answers.
func TestComposeAddHTTP(t *testing.T) {
	t.Parallel()
	p := startProject(t, "")
	p.WaitReady(t, "app")
	httpPort, err := loopback.FreePort()
	assert.NilError(t, err)
	out := p.MustCall(t, "compose::add", "--json", fmt.Sprintf(`{"workers":[{"worker":"http","config_override":{"port":%d}}]}`, httpPort))
	var added struct {
		Added  []string `json:"added"`
		Edited bool     `json:"edited"`
	}
	assert.NilError(t, json.Unmarshal([]byte(out), &added), out)
	assert.Check(t, added.Edited, out)
	assert.Check(t, is.DeepEqual(added.Added, []string{"http"}), out)
	file, err := os.ReadFile(filepath.Join(p.Dir, "worker-compose.yaml"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(file), "worker: package://http"))
	assert.Check(t, is.Contains(string(file), httpw.Version))
	lock, err := os.ReadFile(filepath.Join(p.Dir, "worker-compose.lock"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(lock), httpw.Version))
	p.WaitReady(t, "http", "app")
	c := &http.Client{Timeout: time.Minute}
	waitRoute(t, c, fmt.Sprintf("http://127.0.0.1:%d", httpPort))
	p.Stop(t)
}
