package tenancy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// waitFor bounds every wait: a hang guard, not a timing.
const waitFor = 30 * time.Second

const token = "tenancy-acceptance-token"

// iiiEngine is a real `iii` process.
type iiiEngine struct {
	url  string
	dir  string
	logs *syncbuf.Buffer
}

// startEngine runs `iii -c config.yaml` (with the engine token, one
// listener, and sandbox, the config.yaml sandbox: block, when not empty)
// until the test ends. Its HOME is a directory of the test's own.
func startEngine(t *testing.T, sandbox string) *iiiEngine {
	t.Helper()
	dir := t.TempDir()
	port, err := loopback.FreePort()
	assert.NilError(t, err)
	e := &iiiEngine{url: "ws://127.0.0.1:" + strconv.Itoa(port), dir: dir, logs: &syncbuf.Buffer{}}
	config := fmt.Sprintf("engine_token: %s\nworkers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\n%s", token, port, sandbox)
	path := filepath.Join(dir, "config.yaml")
	assert.NilError(t, os.WriteFile(path, []byte(config), 0o644))
	cmd := exec.Command(testBins.Path(t, "iii"), "-c", path)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+dir, "III_ENGINE_TOKEN=", "III_PLUGIN_PATH=", "III_COMPOSE_STATE_DIR=")
	cmd.Stdout, cmd.Stderr = e.logs, e.logs
	assert.NilError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(waitFor):
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
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			return poll.Continue("the engine does not listen yet")
		}
		c.Close()
		return poll.Success()
	}, poll.WithTimeout(waitFor), poll.WithDelay(20*time.Millisecond))
	return e
}

// dial connects a worker; rejected receives the registrations the engine
// refused.
func dial(t *testing.T, e *iiiEngine, name, ns, tok string) (*client.Client, chan *client.RejectionError) {
	t.Helper()
	rejected := make(chan *client.RejectionError, 16)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cl, err := client.Dial(ctx, e.url, client.Options{Name: name, Namespace: ns, Token: tok, IgnoreEnv: true,
		ConfirmRegistration: true, CallTimeout: waitFor, Reconnect: client.ReconnectPolicy{Disable: true},
		OnRegistrationError: func(err error) {
			var re *client.RejectionError
			if errors.As(err, &re) {
				rejected <- re
			}
		}})
	assert.NilError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		_ = cl.Close(ctx)
	})
	return cl, rejected
}

func call(t *testing.T, cl *client.Client, ns, fn string, payload any) (map[string]any, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	raw, err := cl.Call(ctx, fn, payload, client.WithNamespace(ns))
	if err != nil {
		return nil, err
	}
	var out map[string]any
	assert.NilError(t, json.Unmarshal(raw, &out))
	return out, nil
}

func mustCall(t *testing.T, cl *client.Client, ns, fn string, payload any) map[string]any {
	t.Helper()
	out, err := call(t, cl, ns, fn, payload)
	assert.NilError(t, err, "call %s", fn)
	return out
}

func sandboxCode(t *testing.T, err error) contract.Code {
	t.Helper()
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb), "a remote error, got %v", err)
	se, ok := contract.FromErrorBody(eb)
	assert.Assert(t, ok, "a sandbox error: %q", eb.Message)
	return se.Code
}

// rejections collects n refusals, in any order, by function id.
func rejections(t *testing.T, ch chan *client.RejectionError, n int) map[string]string {
	t.Helper()
	got := map[string]string{}
	deadline := time.After(waitFor)
	for len(got) < n {
		select {
		case re := <-ch:
			got[re.FunctionID] = re.Code
		case <-deadline:
			t.Fatalf("only %d of %d refusals arrived: %v", len(got), n, got)
		}
	}
	return got
}

func hostdirConfig(t *testing.T) string {
	b, err := json.Marshal(map[string]any{"image_allowlist": []string{"shell"}, "state_dir": t.TempDir()})
	assert.NilError(t, err)
	return string(b)
}

// A worker without the engine token cannot register a sandbox adapter's
// names: <adapter>::worker::* and <adapter>::host::* of any adapter, and
// every <adapter>::* of one the engine knows (sandbox-hostdir is installed
// beside iii). So the engine token's holder calling
// sandbox-libkrun::worker::start with a VM worker's engine credential (as
// Compose does) never reaches it, and the adapter starts in the namespace
// where the squatter holds its worker name. A worker that registered an
// adapter's names before the adapter was known loses them when it starts.
func TestSquatterRefusedRealEngine(t *testing.T) {
	t.Parallel()
	e := startEngine(t, "")
	admin, _ := dial(t, e, "admin", "", token)
	received := make(chan string, 16)
	handler := func(id string) client.Handler {
		return func(_ context.Context, inv *client.Invocation) (any, error) {
			received <- id
			return map[string]any{"stolen": true}, nil
		}
	}
	squatter, rejected := dial(t, e, "sandbox-hostdir", "proj", "")
	squat := []string{"sandbox-libkrun::worker::start", "sandbox-libkrun::host::h1::create", "sandbox-hostdir::create", "sandbox-hostdir::worker::start"}
	for _, id := range squat {
		_, err := squatter.RegisterFunction(client.FunctionDef{ID: id}, handler(id))
		assert.NilError(t, err)
	}
	got := rejections(t, rejected, len(squat))
	for _, id := range squat {
		assert.Check(t, is.Equal(got[id], engine.CodeForbidden), id)
	}

	// Compose's call, with the credential and host directory it carries,
	// finds nothing to deliver to.
	_, err := call(t, admin, "proj", "sandbox-libkrun::worker::start", map[string]any{"vm_id": "proj-api",
		"engine_credential": "a-secret-credential", "host_dir": e.dir})
	assert.Equal(t, client.CodeOf(err), protocol.CodeFunctionNotFound, "%v", err)

	// The adapter starts in the squatter's namespace, its worker name
	// taken over.
	st := mustCall(t, admin, "default", "engine::adapters::start", map[string]any{"adapter": "sandbox-hostdir", "namespace": "proj",
		"config": json.RawMessage(hostdirConfig(t))})
	assert.Equal(t, st["state"], "running", "%v", st)
	info := mustCall(t, admin, "proj", "sandbox-hostdir::adapter::info", map[string]any{})
	assert.Check(t, info["contract"] != nil)

	// An adapter that becomes known after a worker took its names.
	late, lateRejected := dial(t, e, "late-squatter", "proj2", "")
	_, err = late.RegisterFunction(client.FunctionDef{ID: "late::create"}, handler("late::create"))
	assert.NilError(t, err)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := call(t, admin, "proj2", "late::create", map[string]any{}); err == nil {
			return poll.Success()
		}
		return poll.Continue("late::create is not registered yet")
	}, poll.WithTimeout(waitFor), poll.WithDelay(20*time.Millisecond))
	select { // the admin's probe above reached it: it was an open function then
	case id := <-received:
		assert.Equal(t, id, "late::create")
	case <-time.After(waitFor):
		t.Fatal("the probe's call did not reach late::create")
	}
	st = mustCall(t, admin, "default", "engine::adapters::start", map[string]any{"adapter": "late", "namespace": "proj2",
		"path": testBins.Path(t, "sandbox-hostdir"), "config": json.RawMessage(hostdirConfig(t))})
	assert.Equal(t, st["state"], "running", "%v", st)
	assert.Check(t, is.Equal(rejections(t, lateRejected, 1)["late::create"], engine.CodeForbidden))
	_, err = call(t, admin, "proj2", "late::create", map[string]any{"image": "nope"})
	assert.Check(t, sandboxCode(t, err) != "", "answered by the adapter, not the squatter")

	select {
	case id := <-received:
		t.Fatalf("a squatter received a call of %s", id)
	default:
	}
}

// A principal other than the engine token's holder sees and acts only on
// the sandboxes it created: two VM workers' credentials and an anonymous
// local worker each list only their own, and exec, fs and stop of
// another's id answer S002 (the sandbox is untouched); the engine token's
// holder sees every one.
func TestSandboxesOfOthersRealEngine(t *testing.T) {
	t.Parallel()
	e := startEngine(t, "sandbox:\n  adapter: sandbox-hostdir\n  namespace: default\n  config: "+hostdirConfig(t)+"\n")
	admin, _ := dial(t, e, "admin", "", token)
	issue := func(label, ns string) string {
		out := mustCall(t, admin, "default", engine.FnCredentialsIssue, map[string]any{"label": label, "namespace": ns,
			"allow": map[string]any{"default": []string{"*"}}})
		return out["token"].(string)
	}
	a, _ := dial(t, e, "vm-a", "p", issue("compose/p/a", "p"))
	b, _ := dial(t, e, "vm-b", "q", issue("compose/q/b", "q"))
	anon, _ := dial(t, e, "local", "", "")

	var created []string
	create := func(cl *client.Client) string {
		var out map[string]any
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			var err error
			out, err = call(t, cl, "default", "sandbox::create", map[string]any{"image": "shell"})
			if err != nil && client.CodeOf(err) == string(contract.S301) {
				return poll.Continue("the adapter is not running yet")
			}
			if err != nil {
				return poll.Error(err)
			}
			return poll.Success()
		}, poll.WithTimeout(waitFor), poll.WithDelay(50*time.Millisecond))
		id := out["sandbox_id"].(string)
		created = append(created, id)
		return id
	}
	ida, idb, idn, idAdmin := create(a), create(b), create(anon), create(admin)
	list := func(cl *client.Client) []string {
		ids := []string{}
		for _, s := range mustCall(t, cl, "default", "sandbox::list", map[string]any{})["sandboxes"].([]any) {
			ids = append(ids, s.(map[string]any)["sandbox_id"].(string))
		}
		sort.Strings(ids)
		return ids
	}
	assert.Check(t, is.DeepEqual(list(a), []string{ida}))
	assert.Check(t, is.DeepEqual(list(b), []string{idb}))
	assert.Check(t, is.DeepEqual(list(anon), []string{idn}))
	sort.Strings(created)
	assert.Check(t, is.DeepEqual(list(admin), created))

	for _, tc := range []struct {
		name    string
		cl      *client.Client
		fn      string
		payload map[string]any
	}{
		{"exec", a, "sandbox::exec", map[string]any{"sandbox_id": idb, "cmd": "echo not-yours"}},
		{"exec in the admin's", b, "sandbox::exec", map[string]any{"sandbox_id": idAdmin, "cmd": "true"}},
		{"exec, id in upper case", a, "sandbox::exec", map[string]any{"sandbox_id": upper(idb), "cmd": "true"}},
		{"anonymous exec", anon, "sandbox::exec", map[string]any{"sandbox_id": ida, "cmd": "true"}},
		{"fs::read", b, "sandbox::fs::read", map[string]any{"sandbox_id": ida, "path": "/etc/hostname"}},
		{"fs::write", anon, "sandbox::fs::write", map[string]any{"sandbox_id": idb, "path": "/tmp/x", "content": "x"}},
		{"stop", a, "sandbox::stop", map[string]any{"sandbox_id": idb, "wait": true}},
		{"stop the admin's", anon, "sandbox::stop", map[string]any{"sandbox_id": idAdmin}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := call(t, tc.cl, "default", tc.fn, tc.payload)
			assert.Equal(t, sandboxCode(t, err), contract.S002)
		})
	}
	// Nor around the router: the adapter's own functions are privileged.
	_, err := call(t, a, "default", "sandbox-hostdir::list", map[string]any{})
	assert.Equal(t, client.CodeOf(err), engine.CodeUnauthorized)

	// Untouched, and their owners' own.
	assert.Check(t, is.DeepEqual(list(admin), created))
	out := mustCall(t, b, "default", "sandbox::exec", map[string]any{"sandbox_id": idb, "cmd": "echo mine"})
	assert.Check(t, is.Equal(out["stdout"], "mine\n"))
	mustCall(t, a, "default", "sandbox::stop", map[string]any{"sandbox_id": ida, "wait": true})
	mustCall(t, admin, "default", "sandbox::stop", map[string]any{"sandbox_id": idb, "wait": true})
}

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}
