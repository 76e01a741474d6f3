package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/server"
	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/registrytest"
	"github.com/iii-sandbox/iii/protocol"
)

// callTimeout bounds one call. A create under TCG on a loaded two-core
// host takes a while, and the first one of an image pulls it.
const callTimeout = 5 * time.Minute

// ctxT is a context for the calls of one test.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// ── the engine ────────────────────────────────────────────────────────────

// engineFixture is an engine assembled from a config.yaml by host/server
// (engine, configuration worker, plugin host, router, WebSocket listener),
// and a Go client connected to it over a real WebSocket.
type engineFixture struct {
	srv  *server.Server
	url  string
	cl   *client.Client
	logs *syncbuf.Buffer
}

// startEngine writes config.yaml into dir (a listener on a free loopback
// port, plus extra) and serves it until the test ends.
func startEngine(t *testing.T, dir, extra string) *engineFixture {
	t.Helper()
	cfg := "workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: 0 }\n" + extra
	path := filepath.Join(dir, "config.yaml")
	assert.NilError(t, os.WriteFile(path, []byte(cfg), 0o644))
	logs := &syncbuf.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.Start(ctx, server.Options{ConfigPath: path, Version: "0.26.0",
		Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := waitfor.Recv(t, served, time.Minute, "the engine to stop"); err != nil {
			t.Errorf("engine stopped with %v", err)
		}
		if t.Failed() {
			t.Logf("engine log (tail):\n%s", logs.Tail(150))
		}
	})
	e := &engineFixture{srv: srv, url: "ws://" + srv.Addrs()["iii-worker-manager"], logs: logs}
	dctx, dcancel := context.WithTimeout(ctx, time.Minute)
	defer dcancel()
	// The same user's engine token, found as iii call finds it: the
	// caller starts adapters and sets configuration (privileged).
	token, err := client.DiscoverToken(e.url)
	assert.NilError(t, err)
	e.cl, err = client.Dial(dctx, e.url, client.Options{Name: "e2e-caller", IgnoreEnv: true, Token: token,
		Reconnect: client.ReconnectPolicy{Disable: true}, CallTimeout: callTimeout})
	assert.NilError(t, err)
	// Cleanups run last-in first-out: the client leaves before the
	// engine stops.
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		_ = e.cl.Close(cctx)
	})
	return e
}

// call invokes fn, which must succeed, and decodes its result into out.
func (e *engineFixture) call(t *testing.T, fn string, payload, out any) {
	t.Helper()
	raw, err := e.cl.Call(ctxT(t), fn, payload, client.WithTimeout(callTimeout))
	if err != nil {
		t.Fatalf("%s %s: %v", fn, brief(payload), err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s: decode %s: %v", fn, raw, err)
		}
	}
}

// fail invokes fn, which must fail with a sandbox error: the error body the
// caller gets, checked against the wire shape (checkWire).
func (e *engineFixture) fail(t *testing.T, fn string, payload any, want wantErr) *wireError {
	t.Helper()
	_, err := e.cl.Call(ctxT(t), fn, payload, client.WithTimeout(callTimeout))
	var eb *protocol.ErrorBody
	if !errors.As(err, &eb) {
		t.Fatalf("%s %s: want %s, got %v", fn, brief(payload), want.code, err)
	}
	return checkWire(t, eb, want)
}

func brief(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}

// ── the error wire shape ──────────────────────────────────────────────────

// wireKeys are the keys of the sandbox error object (spec §7.4), in order.
func wireKeys() []string {
	return []string{"type", "code", "message", "docs_url", "retryable", "fix", "fix_note"}
}

// wireError is a sandbox error object read off the wire.
type wireError struct {
	Type      string
	Code      string
	Message   string
	DocsURL   string
	Retryable bool
	Fix       map[string]any // nil when fix is null
	FixNote   string
}

var sCode = regexp.MustCompile(`^S[0-9]{3}$`)

// parseWire reads the invocation error message our engine sends: exactly
// the JSON object, with exactly the seven keys and each of its type.
func parseWire(message string) (*wireError, error) {
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(strings.NewReader(message))
	if err := dec.Decode(&fields); err != nil {
		return nil, fmt.Errorf("the message is not a JSON object: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("the message holds more than the JSON object")
	}
	if fields == nil {
		return nil, errors.New("the message is JSON null")
	}
	keys := wireKeys()
	for _, k := range keys {
		if _, ok := fields[k]; !ok {
			return nil, fmt.Errorf("key %q is missing", k)
		}
	}
	if len(fields) != len(keys) {
		return nil, fmt.Errorf("%d keys, want exactly %v", len(fields), keys)
	}
	var w wireError
	var fixNote *string
	for _, f := range []struct {
		key string
		dst any
	}{{"type", &w.Type}, {"code", &w.Code}, {"message", &w.Message}, {"docs_url", &w.DocsURL},
		{"retryable", &w.Retryable}, {"fix", &w.Fix}, {"fix_note", &fixNote}} {
		raw := fields[f.key]
		if f.key != "fix" && f.key != "fix_note" && string(bytes.TrimSpace(raw)) == "null" {
			return nil, fmt.Errorf("%s is null", f.key)
		}
		if err := json.Unmarshal(raw, f.dst); err != nil {
			return nil, fmt.Errorf("%s: %w", f.key, err)
		}
	}
	if fixNote != nil {
		w.FixNote = *fixNote
	}
	if !sCode.MatchString(w.Code) {
		return nil, fmt.Errorf("code %q is not an S-code", w.Code)
	}
	return &w, nil
}

// wantErr is what a test expects of a sandbox error. Type and retryable
// come from the spec's table (iii-0.26 §7.5), not from the code under test.
type wantErr struct {
	code, typ string
	retryable bool
	// fix is the machine fix expected; nil means fix must be null.
	fix map[string]any
	// inMessage must appear in the message.
	inMessage string
}

// checkWire checks the error body a caller got: the invocation error's
// code is the S-code and its message is the wire object with every key,
// the code's type and retryability, a docs entry, and a note.
func checkWire(t *testing.T, eb *protocol.ErrorBody, want wantErr) *wireError {
	t.Helper()
	assert.Equal(t, eb.Code, want.code, "invocation error: %s", eb.Message)
	w, err := parseWire(eb.Message)
	assert.NilError(t, err, "message: %s", eb.Message)
	assert.Check(t, is.Equal(w.Code, want.code))
	assert.Check(t, is.Equal(w.Type, want.typ), "message: %s", eb.Message)
	assert.Check(t, is.Equal(w.Retryable, want.retryable))
	assert.Check(t, is.Equal(w.DocsURL, contract.DocsURL(contract.Code(want.code))))
	assert.Check(t, strings.HasSuffix(w.DocsURL, "#"+strings.ToLower(want.code)))
	assert.Check(t, w.Message != "", "empty message")
	assert.Check(t, w.FixNote != "", "empty fix_note")
	if want.fix == nil {
		assert.Check(t, w.Fix == nil, "fix should be null, is %v", w.Fix)
	} else {
		assert.Check(t, is.DeepEqual(w.Fix, want.fix))
	}
	if want.inMessage != "" {
		assert.Check(t, is.Contains(w.Message, want.inMessage))
	}
	return w
}

// ── the OCI registry ──────────────────────────────────────────────────────

// registryTap is the registrytest fault hook: it counts the blob downloads
// the registry serves, and answers those of one digest with a server error
// while a fault is set.
type registryTap struct {
	mu     sync.Mutex
	fault  string         // digest ("sha256:…") to fail; "" for none
	failed int            // requests failed on purpose
	served map[string]int // blob GETs passed on to the registry, by digest
}

func newRegistryTap() *registryTap { return &registryTap{served: map[string]int{}} }

func (rt *registryTap) hook(w http.ResponseWriter, r *http.Request) bool {
	dir, digest := path.Split(r.URL.Path)
	if r.Method != http.MethodGet || !strings.HasSuffix(dir, "/blobs/") {
		return false
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if digest == rt.fault {
		rt.failed++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"errors":[{"code":"UNAVAILABLE","message":"fault injected by the e2e test"}]}`))
		return true
	}
	rt.served[digest]++
	return false
}

func (rt *registryTap) setFault(digest string) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.fault = digest
}

func (rt *registryTap) counts(digest string) (served, failed int) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.served[digest], rt.failed
}

// ── the adapter's image cache ─────────────────────────────────────────────

// checkCache checks that the image cache under cacheDir is consistent for
// ref (canonical) with manifest digest: installed, the image directory is
// complete and the ref points at it, and the layers it was built from are
// gone; not installed, nothing of it is visible. Either way no scratch
// directory is left and every kept blob matches its digest.
func checkCache(t *testing.T, cacheDir, ref, digest string, layers []string, installed bool) {
	t.Helper()
	images := filepath.Join(cacheDir, "images")
	hexd := strings.TrimPrefix(digest, "sha256:")
	dir := filepath.Join(images, "sha256", hexd)
	_, err := os.Stat(dir)
	assert.Check(t, is.Equal(err == nil, installed), "image directory %s: %v", dir, err)
	if installed {
		fi, err := os.Stat(filepath.Join(dir, "rootfs.erofs"))
		assert.Check(t, err == nil && fi.Size() > 0, "rootfs.erofs: %v", err)
		b, err := os.ReadFile(filepath.Join(dir, "image.json"))
		assert.Check(t, err == nil && json.Valid(b), "image.json: %v", err)
	}

	refs, _ := filepath.Glob(filepath.Join(images, "refs", "*.json"))
	found := ""
	for _, f := range refs {
		b, err := os.ReadFile(f)
		assert.NilError(t, err)
		var rec struct{ Ref, Digest string }
		assert.NilError(t, json.Unmarshal(b, &rec), "%s", f)
		if rec.Ref == ref {
			found = rec.Digest
		}
	}
	if installed {
		assert.Check(t, is.Equal(found, digest), "the ref %s should point at the installed image", ref)
	} else {
		assert.Check(t, is.Equal(found, ""), "the ref %s points somewhere with nothing installed", ref)
	}

	scratch, _ := os.ReadDir(filepath.Join(images, "tmp"))
	assert.Check(t, is.Len(scratch, 0), "scratch left in images/tmp")

	blobs, _ := os.ReadDir(filepath.Join(images, "blobs", "sha256"))
	for _, b := range blobs {
		data, err := os.ReadFile(filepath.Join(images, "blobs", "sha256", b.Name()))
		assert.NilError(t, err)
		sum := sha256.Sum256(data)
		assert.Check(t, is.Equal(hex.EncodeToString(sum[:]), b.Name()), "a kept blob does not match its digest")
		if installed {
			for _, l := range layers {
				assert.Check(t, "sha256:"+b.Name() != l, "layer %s is kept after the image was built", l)
			}
		}
	}
}

// ── processes ─────────────────────────────────────────────────────────────

// procsMarked lists the live processes (zombies aside, this test binary
// aside) that carry one of markers: in an argument, as (or under) their
// working directory, or in an environment variable. Every process the
// stack starts for a test carries its temporary directories one way or
// another: iii and the adapter run in the project directory with the
// test's HOME, a runner's argument is its state directory, QEMU's sockets
// live there.
func procsMarked(markers ...string) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		p := filepath.Join("/proc", e.Name())
		if stat, err := os.ReadFile(filepath.Join(p, "stat")); err != nil {
			continue
		} else if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		environ, _ := os.ReadFile(filepath.Join(p, "environ"))
		cwd, _ := os.Readlink(filepath.Join(p, "cwd"))
		for _, m := range markers {
			if bytes.Contains(cmdline, []byte(m)) || bytes.Contains(environ, []byte(m)) || cwd == m || strings.HasPrefix(cwd, m+"/") {
				out = append(out, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " ")))
				break
			}
		}
	}
	return out
}

// assertRunning checks that running (procsMarked's lines) has a process
// of each kind (a substring of its command line).
func assertRunning(t *testing.T, running []string, kinds ...string) {
	t.Helper()
	for _, k := range kinds {
		found := false
		for _, p := range running {
			found = found || strings.Contains(p, k)
		}
		assert.Check(t, found, "no %s process among:\n%s", k, strings.Join(running, "\n"))
	}
}

// runs reports whether pid is a live process (not a zombie) running exe.
func runs(pid int, exe string) bool {
	got, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "exe"))
	return err == nil && got == exe
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	p, err := loopback.FreePort()
	assert.NilError(t, err)
	return p
}

// startPullingAdapter starts an engine whose sandbox-libkrun (an empty
// cache, auto_install) pulls the python preset from a loopback registry
// loaded from the local OCI layout; config is added to the adapter's
// configuration. The adapter must report running. Its state directory
// (named with prefix) is registered for clean-up before the engine starts,
// so the check runs after the engine (and the adapter) stopped: no process
// may carry it then.
func startPullingAdapter(t *testing.T, s *suite, prefix string, config map[string]any) *engineFixture {
	t.Helper()
	reg, err := registrytest.Start(registrytest.Options{})
	assert.NilError(t, err)
	t.Cleanup(reg.Close)
	_, err = reg.PushLayout(ctxT(t), s.layout, pythonRef)
	assert.NilError(t, err)

	state := dirs.Short(t, prefix)
	t.Cleanup(func() {
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if left := procsMarked(state); len(left) > 0 {
				return poll.Continue("processes outlive the engine: %v", left)
			}
			return poll.Success()
		}, poll.WithTimeout(30*time.Second), poll.WithDelay(100*time.Millisecond))
	})
	eng := startEngine(t, t.TempDir(), "sandbox:\n  adapter: sandbox-libkrun\n  namespace: default\n")
	cfg := map[string]any{
		"image_allowlist":  []string{"python"},
		"auto_install":     true,
		"state_dir":        state,
		"cache_dir":        t.TempDir(), // empty: the create pulls
		"registry_mirrors": map[string]string{"docker.io": reg.URL()},
		"boot_timeout_ms":  180_000,
		// The clean-up above checks that nothing outlives the engine:
		// no VM waits for a next adapter.
		"adopt_grace_ms": 0,
	}
	maps.Copy(cfg, config)
	var st struct {
		State     string `json:"state"`
		LastError string `json:"last_error"`
	}
	eng.call(t, "engine::adapters::start", map[string]any{"adapter": "sandbox-libkrun", "namespace": "default",
		"path": s.adapterBin, "config": cfg}, &st)
	assert.Equal(t, st.State, "running", "last error: %s", st.LastError)
	return eng
}
