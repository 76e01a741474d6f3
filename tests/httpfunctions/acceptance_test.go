package httpfunctions

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

const waitFor = 30 * time.Second

var workerScript = nodesdk.Script{Path: filepath.Join("testdata", "worker.mjs"), RejectNonJSON: true}

// engine is a real `iii` process serving a config.yaml.
type engine struct {
	iii, dir, config string
	port             int
	logs             *syncbuf.Buffer
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := loopback.FreePort()
	assert.NilError(t, err)
	return p
}

// startEngine runs `iii -c config.yaml` with workers (the listener comes
// first, on a free loopback port) until the test ends.
func startEngine(t *testing.T, workers string) *engine {
	t.Helper()
	e := &engine{iii: iiiBinary(t), dir: t.TempDir(), port: freePort(t), logs: &syncbuf.Buffer{}}
	e.config = filepath.Join(e.dir, "config.yaml")
	e.write(t, workers)
	cmd := exec.Command(e.iii, "-c", e.config)
	cmd.Dir = e.dir
	cmd.Env = append(os.Environ(), "HOME="+e.dir)
	cmd.Stdout, cmd.Stderr = e.logs, e.logs
	assert.NilError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			waitfor.Closed(t, done, waitfor.Default, "the killed engine to be reaped")
		}
		if t.Failed() {
			t.Logf("engine log:\n%s", e.logs.String())
		}
	})
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case <-done:
			return poll.Error(fmt.Errorf("the engine exited:\n%s", e.logs.String()))
		default:
		}
		c, err := net.Dial("tcp", e.addr())
		if err != nil {
			return poll.Continue("the engine does not listen yet")
		}
		c.Close()
		return poll.Success()
	}, poll.WithTimeout(waitFor))
	return e
}

func (e *engine) addr() string { return "127.0.0.1:" + strconv.Itoa(e.port) }

// write replaces config.yaml (write and rename, as editors do).
func (e *engine) write(t *testing.T, workers string) {
	t.Helper()
	content := fmt.Sprintf("workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\n%s", e.port, workers)
	tmp := e.config + ".tmp"
	assert.NilError(t, os.WriteFile(tmp, []byte(content), 0o644))
	assert.NilError(t, os.Rename(tmp, e.config))
}

// call runs `iii call fn --json payload` and returns its exit code,
// stdout and stderr.
func (e *engine) call(t *testing.T, fn, payload string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.iii, "call", fn, "--address", "127.0.0.1", "--port", strconv.Itoa(e.port), "--json", payload)
	cmd.Dir = e.dir
	cmd.Env = append(os.Environ(), "HOME="+e.dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("iii call %s did not finish: %s", fn, stderr.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		assert.NilError(t, err)
	}
	return code, stdout.String(), stderr.String()
}

// callError runs a call that must fail and returns the error's code and
// message as `iii call` prints them ("Error: " and the JSON error body).
func (e *engine) callError(t *testing.T, fn string) (code, message string) {
	t.Helper()
	exit, stdout, stderr := e.call(t, fn, `{}`)
	assert.Equal(t, exit, 1, "stdout %q, stderr %q", stdout, stderr)
	body, ok := strings.CutPrefix(stderr, "Error: ")
	assert.Assert(t, ok, "stderr: %q", stderr)
	var eb struct{ Code, Message string }
	assert.NilError(t, json.Unmarshal([]byte(body), &eb), "stderr: %q", stderr)
	return eb.Code, eb.Message
}

// waitCode polls `iii call fn` until it fails with code.
func (e *engine) waitCode(t *testing.T, fn, code string) string {
	t.Helper()
	var msg string
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		exit, _, stderr := e.call(t, fn, `{}`)
		if exit == 1 && strings.Contains(stderr, `"code": "`+code+`"`) {
			msg = stderr
			return poll.Success()
		}
		return poll.Continue("iii call %s: exit %d, %s", fn, exit, stderr)
	}, poll.WithTimeout(waitFor), poll.WithDelay(100*time.Millisecond))
	return msg
}

// endpoints is the HTTP server the functions point at, on loopback.
func endpoints(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var in map[string]any
		_ = json.Unmarshal(b, &in)
		delete(in, "_caller_worker_id") // differs per call
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"method": r.Method, "function": r.Header.Get("x-iii-function-path"), "input": in, "served_by": "test-endpoint",
		})
	})
	mux.HandleFunc("/invalid", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = io.WriteString(w, "<html><body>not json</body></html>")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// The acceptance test: a Node SDK worker registers HTTP-invocation
// functions; `iii call` gets the endpoint's JSON, invalid_response for an
// answer that is not JSON, url_validation_failed once the default
// security is in force; the functions go when the worker disconnects.
func TestHTTPFunctionsWithNodeSDKAndIiiCall(t *testing.T) {
	t.Parallel()
	sdk := nodesdk.Find(t)
	srv := endpoints(t)
	port := srv.URL[strings.LastIndex(srv.URL, ":")+1:]
	// Loopback allowed by the allowlist with the two checks off: the
	// test's endpoint is on 127.0.0.1.
	const loopback = "  - name: iii-http-functions\n    config:\n      security:\n        url_allowlist: ['127.0.0.1', localhost]\n        block_private_ips: false\n        require_https: false\n"
	e := startEngine(t, loopback)

	worker := sdk.Start(t, workerScript, map[string]any{"url": "ws://" + e.addr(), "name": "http-acceptance", "functions": []map[string]any{
		{"id": "acc::echo", "url": srv.URL + "/echo"},
		{"id": "acc::get", "url": srv.URL + "/echo", "method": "GET", "timeout_ms": 5000},
		{"id": "acc::invalid", "url": srv.URL + "/invalid"},
		{"id": "acc::local", "url": "https://localhost:" + port + "/echo"},
	}}, 10*time.Second)
	assert.Equal(t, worker.Line(t, waitFor)["started"], true)

	// The endpoint's JSON, as `iii call` prints it.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if exit, _, stderr := e.call(t, "acc::echo", `{}`); exit != 0 {
			return poll.Continue("not callable yet: %s", stderr)
		}
		return poll.Success()
	}, poll.WithTimeout(waitFor), poll.WithDelay(100*time.Millisecond))
	exit, stdout, stderr := e.call(t, "acc::echo", `{"hello":"world","n":2}`)
	assert.Equal(t, exit, 0, stderr)
	var got map[string]any
	assert.NilError(t, json.Unmarshal([]byte(stdout), &got), stdout)
	assert.DeepEqual(t, got, map[string]any{"method": "POST", "function": "acc::echo", "served_by": "test-endpoint",
		"input": map[string]any{"hello": "world", "n": 2.0}})
	exit, stdout, stderr = e.call(t, "acc::get", `{"q":1}`)
	assert.Equal(t, exit, 0, stderr)
	assert.Check(t, is.Contains(stdout, `"method": "GET"`))

	code, msg := e.callError(t, "acc::invalid")
	assert.Equal(t, code, "invalid_response")
	assert.Check(t, is.Contains(msg, "not JSON"))

	// The default security (a reload to a bare entry): the loopback
	// endpoints are refused before any request.
	e.write(t, "  - name: iii-http-functions\n")
	e.waitCode(t, "acc::echo", "url_validation_failed")
	code, msg = e.callError(t, "acc::local")
	assert.Equal(t, code, "url_validation_failed")
	assert.Check(t, is.Contains(msg, "Private IP blocked: localhost resolves to 127.0.0.1"))
	code, msg = e.callError(t, "acc::echo")
	assert.Equal(t, code, "url_validation_failed")
	assert.Check(t, is.Contains(msg, "HTTPS is required"))

	// The worker disconnects: its functions go with it.
	worker.Stop(10 * time.Second)
	e.waitCode(t, "acc::echo", "function_not_found")
	code, _ = e.callError(t, "acc::local")
	assert.Equal(t, code, "function_not_found")
}

// Under the default security a Node worker's registration of a loopback
// endpoint is refused (url_validation_failed, in the engine's log), so
// the function does not exist; with the worker absent from config.yaml
// the registration is refused too, as upstream drops it.
func TestHTTPFunctionsRefusedRegistrations(t *testing.T) {
	t.Parallel()
	sdk := nodesdk.Find(t)
	srv := endpoints(t)
	for _, tc := range []struct {
		name, workers, log string
	}{
		{"default security", "  - name: iii-http-functions\n", "url_validation_failed"},
		{"worker absent", "", "does not run iii-http-functions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEngine(t, tc.workers)
			worker := sdk.Start(t, workerScript, map[string]any{"url": "ws://" + e.addr(), "name": "http-refused", "functions": []map[string]any{
				{"id": "acc::private", "url": srv.URL + "/echo"},
				{"id": "acc::metadata", "url": "https://169.254.169.254/latest/meta-data/"},
			}}, 10*time.Second)
			assert.Equal(t, worker.Line(t, waitFor)["started"], true)
			poll.WaitOn(t, func(poll.LogT) poll.Result {
				if strings.Count(e.logs.String(), tc.log) < 2 {
					return poll.Continue("the refusals are not logged yet")
				}
				return poll.Success()
			}, poll.WithTimeout(waitFor))
			for _, fn := range []string{"acc::private", "acc::metadata"} {
				code, _ := e.callError(t, fn)
				assert.Equal(t, code, "function_not_found", fn)
			}
		})
	}
}
