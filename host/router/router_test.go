package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/config"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// One test body, two adapters: only the bound name changes.
func TestSwapByName(t *testing.T) {
	te := newEnv(t, nil)
	te.startAdapter(t, "sandbox-hostdir", "sbx", nil)
	te.startAdapter(t, "sandbox-althost", "sbx", nil)
	for _, adapter := range []string{"sandbox-hostdir", "sandbox-althost"} {
		t.Run(adapter, func(t *testing.T) {
			assert.NilError(t, te.router.Bind(adapter, "sbx"))
			run := te.MustCall(t, "sandbox::run", map[string]any{"image": "python", "lang": "python", "code": "print(2+2)", "keep_sandbox": true})
			assert.Equal(t, run["stdout"], "4\n")
			assert.Equal(t, run["success"], true)
			// The sandbox it kept lives in the bound adapter.
			id := run["sandbox_id"].(string)
			out, err := te.Client.Call(context.Background(), contract.AdapterFunctionID(adapter, contract.OpList), map[string]any{}, client.WithNamespace("sbx"))
			assert.NilError(t, err)
			assert.Check(t, is.Contains(string(out), id))
			stop := te.MustCall(t, "sandbox::stop", map[string]any{"sandbox_id": id, "wait": true})
			assert.Equal(t, stop["stopped"], true)
		})
	}
}

func TestUnboundIsS303(t *testing.T) {
	te := newEnv(t, nil)
	for _, op := range contract.Ops() {
		_, err := te.Call(t, contract.RouterFunctionID(op), map[string]any{})
		se := enginetest.SandboxError(t, err)
		assert.Equal(t, se.Code, contract.S303, "%s", op)
	}
	_, err := te.Call(t, "sandbox::list", nil)
	se := enginetest.SandboxError(t, err)
	assert.Equal(t, se.Type, contract.TypeConfig)
	assert.Check(t, is.Contains(se.Message, "`sandbox:`"))
	assert.Check(t, is.Contains(se.Message, "iii compose --up"))
	assert.Equal(t, se.DocsURL, contract.DocsURL(contract.S303))
}

func TestBoundNotRunningIsS301(t *testing.T) {
	te := newEnv(t, func() (Binding, bool) { return Binding{Adapter: "sandbox-libkrun", Namespace: "dev"}, true })
	_, err := te.Call(t, "sandbox::create", map[string]any{"image": "python"})
	se := enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S301)
	assert.Equal(t, se.Retryable, true)
	for _, want := range []string{`namespace "dev"`, `"sandbox-libkrun"`, "iii call compose::add worker=iii-sandbox",
		"iii compose --up --namespace dev --engine " + te.URL, "iii call engine::adapters::start --json '"} {
		assert.Check(t, is.Contains(se.Message, want))
	}
	// The hints work as copied: the --json payload is a start request with
	// a configuration, and the config.yaml block parses to the binding.
	_, rest, ok := strings.Cut(se.Message, "iii call engine::adapters::start --json '")
	assert.Assert(t, ok)
	payload, _, ok := strings.Cut(rest, "'")
	assert.Assert(t, ok)
	var start struct {
		Adapter, Namespace string
		Config             map[string]any
	}
	assert.NilError(t, json.Unmarshal([]byte(payload), &start), payload)
	assert.Check(t, start.Adapter == "sandbox-libkrun" && start.Namespace == "dev" && len(start.Config["image_allowlist"].([]any)) > 0, payload)
	_, rest, ok = strings.Cut(se.Message, "give config.yaml `")
	assert.Assert(t, ok)
	block, _, ok := strings.Cut(rest, "`")
	assert.Assert(t, ok)
	cfg, err := config.Parse([]byte(block+"\n"), config.ParseOptions{})
	assert.NilError(t, err, block)
	assert.DeepEqual(t, *cfg.Sandbox, config.Sandbox{Adapter: "sandbox-libkrun", Namespace: "dev", Config: `{"image_allowlist":["python","node"]}`})

	// Running in another namespace does not count.
	te.startAdapter(t, "sandbox-hostdir", "default", nil)
	assert.NilError(t, te.router.Bind("sandbox-hostdir", "dev"))
	_, err = te.Call(t, "sandbox::list", nil)
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S301)
	assert.NilError(t, te.router.Bind("sandbox-hostdir", ""))
	list := te.MustCall(t, "sandbox::list", nil)
	assert.DeepEqual(t, list, map[string]any{"sandboxes": []any{}})
}

func TestBindingSources(t *testing.T) {
	var cfg atomic.Pointer[Binding]
	te := newEnv(t, func() (Binding, bool) {
		b := cfg.Load()
		if b == nil {
			return Binding{}, false
		}
		return *b, true
	})
	_, ok := te.router.Binding()
	assert.Assert(t, !ok)
	cfg.Store(&Binding{Adapter: "from-config"})
	b, ok := te.router.Binding()
	assert.Assert(t, ok)
	assert.Equal(t, b, Binding{Adapter: "from-config", Namespace: "default"}, "the config is read on every call")
	assert.NilError(t, te.router.Bind("explicit", "ns1"))
	b, _ = te.router.Binding()
	assert.Equal(t, b, Binding{Adapter: "explicit", Namespace: "ns1"}, "Bind wins over the config")
	te.router.Unbind()
	b, _ = te.router.Binding()
	assert.Equal(t, b.Adapter, "from-config")
	cfg.Store(nil)
	_, err := te.Call(t, "sandbox::list", nil)
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S303, "a removed section unbinds")

	for _, bad := range []struct{ adapter, ns, code string }{
		{"Bad Name", "", CodeInvalidBinding},
		{"a/b", "", CodeInvalidBinding},
		{"ok", "Dev", protocol.CodeInvalidNamespace},
	} {
		assert.Equal(t, client.CodeOf(te.router.Bind(bad.adapter, bad.ns)), bad.code, "%v", bad)
	}
}

// kill -9 of the adapter during 50 in-flight calls: every caller gets a
// result or S301 within a second, the adapter is back within two, the next
// call succeeds, and once the engine stops no adapter process remains.
func TestKillDuringInFlightCalls(t *testing.T) {
	te := newEnv(t, nil)
	st := te.startAdapter(t, "sandbox-hostdir", "default", map[string]any{"max_concurrent_exec_per_sandbox": 64})
	assert.NilError(t, te.router.Bind("sandbox-hostdir", "default"))
	sb := te.MustCall(t, "sandbox::create", map[string]any{"image": "shell"})
	id := sb["sandbox_id"].(string)

	const calls = 50
	type outcome struct {
		err error
		at  time.Time
	}
	results := make(chan outcome, calls)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for range calls {
		go func() {
			// sleep 30, not less: on a loaded 2-core CI machine starting 50
			// host processes took over 5 s, so shorter sleeps finished before
			// the last one started and 50 were never in flight together.
			_, err := te.Client.Call(ctx, "sandbox::exec", map[string]any{"sandbox_id": id, "cmd": "sleep 30"})
			results <- outcome{err, time.Now()}
		}()
	}
	pollUntil(t, "50 execs in flight", waitFor, func() bool {
		l := te.MustCall(t, "sandbox::list", nil)
		for _, s := range l["sandboxes"].([]any) {
			if e := s.(map[string]any); e["sandbox_id"] == id {
				return e["exec_in_flight"] == float64(calls)
			}
		}
		return false
	})

	killed := time.Now()
	assert.NilError(t, syscall.Kill(st.PID, syscall.SIGKILL))
	for i := range calls {
		o := waitfor.Recv(t, results, waitFor, fmt.Sprintf("exec %d of %d to answer after the kill", i+1, calls))
		// sleep 30 cannot finish in time, so every caller gets S301.
		assert.Assert(t, o.err != nil, "an exec of sleep 30 answered within a second of the kill")
		assert.Equal(t, enginetest.SandboxError(t, o.err).Code, contract.S301, "%v", o.err)
		assert.Assert(t, o.at.Sub(killed) <= time.Second, "a caller waited %v after the kill", o.at.Sub(killed))
	}
	pollUntil(t, "adapter back", 2*time.Second-time.Since(killed), func() bool {
		s, _ := te.host.Lookup("sandbox-hostdir", "default")
		return s.State == pluginhost.StateRunning && s.PID != st.PID && te.host.Hosted("sandbox-hostdir", "default")
	})
	run := te.MustCall(t, "sandbox::run", map[string]any{"image": "python", "lang": "python", "code": "print(2+2)"})
	assert.Equal(t, run["stdout"], "4\n")

	ctx2, cancel2 := context.WithTimeout(context.Background(), waitFor)
	defer cancel2()
	assert.NilError(t, te.host.Close(ctx2))
	assert.NilError(t, te.Engine.Close(ctx2))
	assert.Equal(t, len(adapterProcesses()), 0, "no adapter process remains once the engine stopped")
}

// The router forwards the payload untouched and passes the adapter's
// result and errors through as they are.
func TestForwardsUnchanged(t *testing.T) {
	te := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	adapterErr := &protocol.ErrorBody{Code: "S100", Message: `{"type":"config","code":"S100","message":"image q is not allowed","docs_url":"x","retryable":false,"fix":null,"fix_note":"pick one"}`}
	w, err := client.Dial(ctx, te.URL, client.Options{Name: "echo-adapter", Namespace: "tools", IgnoreEnv: true, Token: te.Token, Reconnect: client.ReconnectPolicy{Disable: true}})
	assert.NilError(t, err)
	defer w.Close(context.Background())
	got := make(chan json.RawMessage, 1)
	assert.NilError(t, register(t, w, client.FunctionDef{ID: "echo::adapter::info"}, func(context.Context, *client.Invocation) (any, error) {
		return map[string]any{"adapter": "echo", "adapter_version": "1", "contract": map[string]int{"major": contract.Major, "minor": 0}}, nil
	}))
	assert.NilError(t, register(t, w, client.FunctionDef{ID: "echo::create"}, func(_ context.Context, inv *client.Invocation) (any, error) {
		got <- inv.Data
		return json.RawMessage(`{"sandbox_id":"s","image":"q","extra":[1,2]}`), nil
	}))
	assert.NilError(t, register(t, w, client.FunctionDef{ID: "echo::stop"}, func(context.Context, *client.Invocation) (any, error) {
		return nil, adapterErr
	}))
	waitRegistered(t, te, "tools", "echo::stop")
	assert.NilError(t, te.router.Bind("echo", "tools"))

	payload := `{"image":"q","weird":[1,{"a":null}],"n":1.5}`
	out, err := te.Client.Call(ctx, "sandbox::create", json.RawMessage(payload))
	assert.NilError(t, err)
	assert.Equal(t, string(out), `{"sandbox_id":"s","image":"q","extra":[1,2]}`)
	var sent, want map[string]any
	assert.NilError(t, json.Unmarshal(waitfor.Recv(t, got, waitFor, "the adapter to receive the create"), &sent))
	assert.NilError(t, json.Unmarshal([]byte(payload), &want))
	want["_caller_worker_id"] = sent["_caller_worker_id"] // added by the engine on the caller's hop, not by the router
	assert.DeepEqual(t, sent, want)

	_, err = te.Call(t, "sandbox::stop", map[string]any{"sandbox_id": "s"})
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb))
	assert.DeepEqual(t, eb, adapterErr)
}

// An adapter whose worker goes away mid-call answers S301.
func TestAdapterGoneMidCall(t *testing.T) {
	te := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	w, err := client.Dial(ctx, te.URL, client.Options{Name: "slow-adapter", IgnoreEnv: true, Token: te.Token, Reconnect: client.ReconnectPolicy{Disable: true}})
	assert.NilError(t, err)
	entered := make(chan struct{}, 1)
	assert.NilError(t, register(t, w, client.FunctionDef{ID: "slow::adapter::info"}, func(context.Context, *client.Invocation) (any, error) {
		return map[string]any{"adapter": "slow", "adapter_version": "1", "contract": map[string]int{"major": contract.Major, "minor": 1}}, nil
	}))
	assert.NilError(t, register(t, w, client.FunctionDef{ID: "slow::exec"}, func(c context.Context, _ *client.Invocation) (any, error) {
		entered <- struct{}{}
		<-c.Done()
		return nil, c.Err()
	}))
	waitRegistered(t, te, "default", "slow::exec")
	assert.NilError(t, te.router.Bind("slow", ""))
	res := make(chan error, 1)
	go func() {
		_, err := te.Call(t, "sandbox::exec", map[string]any{"sandbox_id": "x", "cmd": "true"})
		res <- err
	}()
	waitfor.Recv(t, entered, waitFor, "the exec to reach the slow adapter")
	assert.NilError(t, w.Close(ctx))
	se := enginetest.SandboxError(t, waitfor.Recv(t, res, waitFor, "the exec to answer once its adapter went away"))
	assert.Equal(t, se.Code, contract.S301)
	assert.Check(t, is.Contains(se.Message, "went away while serving sandbox::exec"))
}

func waitRegistered(t *testing.T, te *testEnv, ns, id string) {
	t.Helper()
	pollUntil(t, id+" registered in "+ns, waitFor, func() bool {
		_, err := te.Engine.Invoke(context.Background(), "", engine.FnFunctionsInfo, json.RawMessage(`{"function_id":"`+id+`","namespace":"`+ns+`"}`))
		return err == nil
	})
}

func waitGone(t *testing.T, te *testEnv, ns, id string) {
	t.Helper()
	pollUntil(t, id+" gone from "+ns, waitFor, func() bool {
		_, err := te.Engine.Invoke(context.Background(), "", engine.FnFunctionsInfo, json.RawMessage(`{"function_id":"`+id+`","namespace":"`+ns+`"}`))
		return err != nil
	})
}

// A plain WebSocket worker (the published Node SDK) registering
// <name>::* serves the router; its contract major is checked once per
// connection, again when another connection takes the name over.
func TestNodeAdapter(t *testing.T) {
	ne := nodesdk.Find(t)
	te := newEnv(t, nil)
	// This test is not about the heartbeat: a Node process still running
	// its start-up code on a loaded machine can leave a ping unanswered for
	// longer than the default 500 ms window, and would be cut mid-test.
	te.Engine.SetHostHeartbeat(2 * time.Second)
	assert.NilError(t, te.router.Bind("nodebox", "nb"))

	p := ne.Start(t, sandboxScript, map[string]any{"mode": "adapter", "url": te.URL, "headers": te.adminHeaders(), "name": "nodebox", "namespace": "nb", "major": contract.Major}, waitFor)
	assert.Equal(t, p.Line(t, waitFor)["started"], true)
	waitRegistered(t, te, "nb", "nodebox::adapter::info")
	waitRegistered(t, te, "nb", "nodebox::fs::sed")

	cat := te.MustCall(t, "sandbox::catalog::list", nil)
	assert.Equal(t, cat["images"].([]any)[0].(map[string]any)["oci_ref"], "node-host:python3")
	run := te.MustCall(t, "sandbox::run", map[string]any{"image": "python", "lang": "python", "code": "print(2+2)"})
	assert.Equal(t, run["stdout"], "4\n")
	// The adapter's S-code error passes through as the SDK sent it.
	_, err := te.Call(t, "sandbox::exec", map[string]any{"sandbox_id": "1b4e6709-f265-4142-9178-3a7d83b46aa5", "cmd": "true"})
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, protocol.CodeInvocationFailed, "the Node SDK reports thrown errors as invocation_failed")
	se, ok := contract.FromErrorBody(eb)
	assert.Assert(t, ok)
	assert.Equal(t, se.Code, contract.S002)

	// The same name, now from a build that speaks contract major 2.
	p.Stop(waitFor)
	waitGone(t, te, "nb", "nodebox::adapter::info")
	p2 := ne.Start(t, sandboxScript, map[string]any{"mode": "adapter", "url": te.URL, "headers": te.adminHeaders(), "name": "nodebox", "namespace": "nb", "major": contract.Major + 1}, waitFor)
	assert.Equal(t, p2.Line(t, waitFor)["started"], true)
	waitRegistered(t, te, "nb", "nodebox::adapter::info")
	waitRegistered(t, te, "nb", "nodebox::catalog::list")
	_, err = te.Call(t, "sandbox::catalog::list", nil)
	se = enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S302)
	assert.Check(t, is.Contains(se.Message, "contract 2.1"))
	assert.Check(t, is.Contains(te.Logs.String(), "sandbox adapter refused"))
}

// A Node SDK caller reaches sandbox::* through our engine and reads the
// S-code out of the error message's JSON.
func TestNodeCaller(t *testing.T) {
	ne := nodesdk.Find(t)
	te := newEnv(t, nil)
	res := runNodeCalls(t, ne, te, []map[string]any{{"function_id": "sandbox::catalog::list", "payload": map[string]any{}}})
	assert.Equal(t, res[0]["ok"], false)
	assert.Equal(t, res[0]["code"], "S303")
	se := res[0]["sandbox_error"].(map[string]any)
	assert.Equal(t, se["code"], "S303")
	assert.Equal(t, se["type"], "config")
	assert.Equal(t, se["docs_url"], contract.DocsURL(contract.S303))

	te.startAdapter(t, "sandbox-hostdir", "default", nil)
	assert.NilError(t, te.router.Bind("sandbox-hostdir", ""))
	res = runNodeCalls(t, ne, te, []map[string]any{
		{"function_id": "sandbox::run", "payload": map[string]any{"image": "python", "lang": "python", "code": "print(2+2)"}},
		{"function_id": "sandbox::exec", "payload": map[string]any{"sandbox_id": "not-a-uuid", "cmd": "true"}},
		{"function_id": "sandbox::create", "payload": map[string]any{"image": "node"}},
	})
	assert.Equal(t, res[0]["ok"], true, "%v", res[0])
	assert.Equal(t, res[0]["result"].(map[string]any)["stdout"], "4\n")
	for i, want := range []string{"S001", "S100"} {
		r := res[i+1]
		assert.Equal(t, r["ok"], false)
		assert.Equal(t, r["code"], want)
		assert.Equal(t, r["sandbox_error"].(map[string]any)["code"], want, "%v", r)
	}
}

// The router registers the sixteen functions and sandbox::pause and
// sandbox::resume with their schemas, as an internal worker.
func TestRouterFunctions(t *testing.T) {
	te := newEnv(t, nil)
	wi := te.MustCall(t, engine.FnWorkersInfo, map[string]any{"name": WorkerName})
	assert.Equal(t, wi["worker"].(map[string]any)["internal"], true)
	assert.Equal(t, len(wi["functions"].([]any)), 18)
	fi := te.MustCall(t, engine.FnFunctionsInfo, map[string]any{"function_id": "sandbox::fs::read"})
	assert.Assert(t, fi["request_schema"] != nil && fi["response_schema"] != nil)
	assert.Equal(t, fi["namespace"], "default")
}

// An adapter worker whose operations are registered before its
// adapter::info (as a reconnecting host registers them, one frame at a
// time) is refused only until adapter::info arrives, not for the life of
// its connection.
func TestAdapterInfoLateIsNotRefusedForGood(t *testing.T) {
	te := newEnv(t, nil)
	assert.NilError(t, te.router.Bind("late", ""))
	w := te.Client
	assert.NilError(t, register(t, w, client.FunctionDef{ID: "late::catalog::list"}, func(context.Context, *client.Invocation) (any, error) {
		return map[string]any{"images": []any{}}, nil
	}))
	waitRegistered(t, te, "default", "late::catalog::list")
	_, err := te.Call(t, "sandbox::catalog::list", nil)
	se := enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S302)
	assert.Check(t, is.Contains(se.Message, "does not serve late::adapter::info"))

	assert.NilError(t, register(t, w, client.FunctionDef{ID: "late::adapter::info"}, func(context.Context, *client.Invocation) (any, error) {
		return map[string]any{"adapter": "late", "adapter_version": "1", "contract": map[string]int{"major": contract.Major, "minor": 1}}, nil
	}))
	waitRegistered(t, te, "default", "late::adapter::info")
	te.MustCall(t, "sandbox::catalog::list", nil)
}

func register(t *testing.T, w *client.Client, def client.FunctionDef, h client.Handler) error {
	t.Helper()
	_, err := w.RegisterFunction(def, h)
	return err
}

// A worker without the engine token that registers a bound adapter's
// functions (while the adapter is down) receives nothing: binding evicts
// them, the router answers S301 and never forwards the caller's payload.
func TestSquatterIsNotAnAdapter(t *testing.T) {
	te := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	w := te.Anonymous(t, "squatter")
	called := make(chan struct{}, 1)
	assert.NilError(t, register(t, w, client.FunctionDef{ID: "squat::adapter::info"}, func(context.Context, *client.Invocation) (any, error) {
		called <- struct{}{}
		return map[string]any{"adapter": "squat", "adapter_version": "1", "contract": map[string]int{"major": contract.Major, "minor": 1}}, nil
	}))
	assert.NilError(t, register(t, w, client.FunctionDef{ID: "squat::create"}, func(context.Context, *client.Invocation) (any, error) {
		called <- struct{}{}
		return map[string]any{"sandbox_id": "stolen"}, nil
	}))
	waitRegistered(t, te, "default", "squat::create")
	assert.NilError(t, te.router.Bind("squat", ""))
	_, err := te.Client.Call(ctx, "sandbox::create", map[string]any{"image": "python", "code": "secret"})
	se := enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S301)
	// Binding made squat a known adapter: the squatter's functions were
	// evicted (docs/security.md, Adapter names).
	assert.Check(t, is.Contains(se.Message, "not running there"))
	assert.Check(t, !te.router.trust.OwnerOf("default", "squat", "squat::create").Registered)
	select {
	case <-called:
		t.Fatal("the router forwarded to a worker without the engine token")
	default:
	}
}

// An adapter without the pause capability (it registers no
// <adapter>::pause) answers sandbox::pause and sandbox::resume with S006
// naming itself, not S301; one that registers them gets the call.
func TestPauseCapability(t *testing.T) {
	te := newEnv(t, nil)
	assert.NilError(t, te.router.Bind("plain", ""))
	w := te.Client
	assert.NilError(t, register(t, w, client.FunctionDef{ID: "plain::adapter::info"}, func(context.Context, *client.Invocation) (any, error) {
		return map[string]any{"adapter": "plain", "adapter_version": "1", "contract": map[string]int{"major": contract.Major, "minor": 1}}, nil
	}))
	waitRegistered(t, te, "default", "plain::adapter::info")
	id := "0b7c3a52-4c0e-4b6a-9a43-5bd0c6d8a001"
	for _, op := range contract.PauseOps() {
		_, err := te.Call(t, "sandbox::"+op, map[string]any{"sandbox_id": id})
		se := enginetest.SandboxError(t, err)
		assert.Equal(t, se.Code, contract.S006, op)
		assert.Check(t, is.Contains(se.Message, `"plain"`))
	}
	assert.NilError(t, register(t, w, client.FunctionDef{ID: "plain::pause"}, func(_ context.Context, inv *client.Invocation) (any, error) {
		return map[string]any{"sandbox_id": id, "status": contract.SandboxPaused}, nil
	}))
	waitRegistered(t, te, "default", "plain::pause")
	out := te.MustCall(t, "sandbox::pause", map[string]any{"sandbox_id": id})
	assert.Equal(t, out["status"], contract.SandboxPaused)
}
