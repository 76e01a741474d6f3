package router

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/protocol"
)

// trustEnv is an engine with the trust rules installed and no plugin host:
// what these tests judge is who may register and serve an adapter's names.
type trustEnv struct {
	*enginetest.Env
	trust *Trust
}

func newTrustEnv(t *testing.T) *trustEnv {
	t.Helper()
	env := enginetest.Start(t, enginetest.Options{ClientName: "test-caller", CallTimeout: waitFor, Wait: waitFor})
	tr, err := NewTrust(env.Engine)
	assert.NilError(t, err)
	return &trustEnv{Env: env, trust: tr}
}

// wsWorker is a worker that speaks raw frames, as a remote host or a
// squatter does.
type wsWorker struct {
	t        *testing.T
	c        *websocket.Conn
	in       chan map[string]any
	closed   chan struct{}
	workerID string
}

func (te *trustEnv) dial(t *testing.T, token string) *wsWorker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	var h http.Header
	if token != "" {
		h = http.Header{"Authorization": {"Bearer " + token}}
	}
	c, _, err := websocket.Dial(ctx, te.URL, &websocket.DialOptions{HTTPHeader: h})
	assert.NilError(t, err)
	w := &wsWorker{t: t, c: c, in: make(chan map[string]any, 256), closed: make(chan struct{})}
	go func() {
		defer close(w.closed)
		for {
			_, b, err := c.Read(context.Background())
			if err != nil {
				return
			}
			var f map[string]any
			if json.Unmarshal(b, &f) == nil {
				w.in <- f
			}
		}
	}()
	t.Cleanup(func() {
		_ = c.CloseNow()
		for {
			select {
			case <-w.in:
			case <-w.closed:
				return
			}
		}
	})
	hello := w.expect("workerregistered")
	w.workerID, _ = hello["worker_id"].(string)
	return w
}

func (w *wsWorker) send(m protocol.Message) {
	w.t.Helper()
	b, err := protocol.Encode(m)
	assert.NilError(w.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	assert.NilError(w.t, w.c.Write(ctx, websocket.MessageText, b))
}

func (w *wsWorker) next() map[string]any {
	w.t.Helper()
	select {
	case f := <-w.in:
		return f
	case <-w.closed:
		select {
		case f := <-w.in:
			return f
		default:
		}
		w.t.Fatal("connection closed while waiting for a frame")
	case <-w.ctxDone():
		w.t.Fatal("no frame arrived")
	}
	return nil
}

func (w *wsWorker) ctxDone() <-chan struct{} {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	context.AfterFunc(ctx, cancel)
	return ctx.Done()
}

func (w *wsWorker) expect(typ string) map[string]any {
	w.t.Helper()
	f := w.next()
	assert.Equal(w.t, f["type"], typ, "frame: %v", f)
	return f
}

// rejected registers ids in ns under name and returns, in order, those the
// engine refused with FORBIDDEN, after it applied all (a ping's pong comes
// after every earlier frame's answer).
func (w *wsWorker) rejected(ns, name string, ids ...string) []string {
	w.t.Helper()
	for _, id := range ids {
		w.send(&protocol.RegisterFunction{ID: id})
	}
	w.register(ns, name)
	w.send(&protocol.Ping{})
	var out []string
	for {
		f := w.next()
		if f["type"] == "pong" {
			return out
		}
		assert.Equal(w.t, f["type"], "registrationrejected", "frame: %v", f)
		assert.Equal(w.t, f["code"], engine.CodeForbidden)
		out = append(out, f["function_id"].(string))
	}
}

func (w *wsWorker) register(ns, name string) {
	w.t.Helper()
	data, err := json.Marshal(map[string]any{"name": name, "namespace": ns})
	assert.NilError(w.t, err)
	w.send(&protocol.InvokeFunction{FunctionID: engine.FnWorkersRegister, Data: data, Action: &protocol.TriggerAction{Type: protocol.ActionVoid}})
}

// call invokes fn in ns and returns the error code, "" on success.
func (w *wsWorker) call(id, fn, ns string) string {
	w.t.Helper()
	w.send(&protocol.InvokeFunction{InvocationID: id, FunctionID: fn, Namespace: &ns, Data: json.RawMessage(`{}`)})
	for {
		f := w.next()
		if f["type"] != "invocationresult" {
			continue
		}
		assert.Equal(w.t, f["invocation_id"], id)
		e, _ := f["error"].(map[string]any)
		if e == nil {
			return ""
		}
		return e["code"].(string)
	}
}

func (te *trustEnv) issue(t *testing.T, spec string) string {
	t.Helper()
	out := te.MustCall(t, engine.FnCredentialsIssue, json.RawMessage(spec))
	return out["token"].(string)
}

func (te *trustEnv) has(ns, id string) bool {
	_, ok := te.Engine.FunctionOwner(ns, id)
	return ok
}

// Names under an adapter's prefix are registered only by its trusted
// owner: <a>::worker::* and <a>::host::* whatever a, every <a>::* once a
// is a known adapter; others get FORBIDDEN and nothing is registered.
func TestAdapterNamesOnlyTheirOwner(t *testing.T) {
	te := newTrustEnv(t)
	te.trust.Reserve("hostdir")
	assert.Check(t, is.DeepEqual(te.trust.Known(), []string{"hostdir"}))
	plain := te.issue(t, `{"label":"compose/p/w","namespace":"p","allow":{"default":["*"]}}`)
	hostTok := te.issue(t, `{"label":"hosts/h1","namespace":"p","sandbox_host":{"adapter":"hostdir","host_name":"h1"}}`)

	ids := []string{"sandbox-libkrun::worker::start", "sandbox-libkrun::host::h1::create", "hostdir::create", "hostdir::adapter::info",
		"hostdir::worker::start", "hostdirx::create", "orders::create", "hostdir"}
	squat := []string{"sandbox-libkrun::worker::start", "sandbox-libkrun::host::h1::create", "hostdir::create", "hostdir::adapter::info", "hostdir::worker::start"}

	t.Run("anonymous", func(t *testing.T) {
		anon := te.dial(t, "")
		assert.DeepEqual(t, anon.rejected("p", "squatter", ids...), squat)
		for _, id := range squat {
			assert.Check(t, !te.has("p", id), id)
		}
		assert.Check(t, te.has("p", "hostdirx::create"))
	})
	t.Run("a VM worker's credential", func(t *testing.T) {
		vm := te.dial(t, plain)
		assert.DeepEqual(t, vm.rejected("p", "vm", "hostdir::create", "sandbox-libkrun::worker::start", "vm::ok"),
			[]string{"hostdir::create", "sandbox-libkrun::worker::start"})
	})
	t.Run("the adapter's sandbox host credential", func(t *testing.T) {
		h := te.dial(t, hostTok)
		assert.DeepEqual(t, h.rejected("p", "hostdir-h1", "hostdir::create", "hostdir::adapter::info", "hostdir::worker::start", "sandbox-libkrun::worker::start"),
			[]string{"sandbox-libkrun::worker::start"})
		assert.Check(t, te.trust.OwnerOf("p", "hostdir", "hostdir::create").Trusted)
		// Its operations on sandboxes are privileged, as the plugin
		// host's: a credential of the namespace cannot call them past the
		// router's tenancy (adapter::info stays open).
		vm := te.dial(t, plain)
		assert.Equal(t, vm.call("c1", "hostdir::create", "p"), engine.CodeUnauthorized)
		priv, ok := te.Engine.FunctionPrivileged("p", "hostdir::adapter::info")
		assert.Check(t, ok && !priv)
	})
	t.Run("the engine token", func(t *testing.T) {
		admin := te.dial(t, te.Token)
		assert.DeepEqual(t, admin.rejected("q", "admin-adapter", "hostdir::create", "sandbox-libkrun::worker::start"), []string(nil))
	})
	// The refusal's text is what users have always read.
	anon := te.dial(t, "")
	anon.send(&protocol.RegisterFunction{ID: "hostdir::exec"})
	anon.register("p", "squatter-2")
	anon.expect("registrationrejected")
	assert.Check(t, is.Contains(te.Logs.String(), `function ids under hostdir:: are reserved to the sandbox adapter \"hostdir\" (<adapter>::* of a known adapter, and every <adapter>::worker::* and <adapter>::host::*): only the engine token's holder or a sandbox host credential issued for that adapter and namespace registers them; hostdir::exec in namespace \"p\" cannot be registered (docs/security.md)`))
}

// A worker that registered an adapter's names before the adapter became
// known loses them when it does (told with registrationrejected), and its
// worker name too, so the adapter starts in that namespace.
func TestAdapterSquatterEvicted(t *testing.T) {
	te := newTrustEnv(t)
	anon := te.dial(t, "")
	assert.DeepEqual(t, anon.rejected("p", "late", "late::create", "late::exec"), []string(nil))
	assert.Assert(t, te.has("p", "late::create"))

	te.Engine.ReserveName("late") // as the plugin host does
	got := map[string]bool{}
	for range 2 {
		f := anon.expect("registrationrejected")
		assert.Equal(t, f["code"], engine.CodeForbidden)
		got[f["function_id"].(string)] = true
	}
	assert.DeepEqual(t, got, map[string]bool{"late::create": true, "late::exec": true})
	assert.Check(t, !te.trust.OwnerOf("p", "late", "late::create").Registered)
	assert.Check(t, is.Contains(te.Logs.String(), `[WARN]  engine: function evicted: its id is under a sandbox adapter's prefix and its worker is not that adapter's trusted owner: adapter=late namespace=p function_id=late::create worker_id=`+anon.workerID))

	// The adapter, in-process as the plugin host runs it, takes its name
	// and functions in that namespace.
	lw, err := te.Engine.AttachLocalWorker(engine.LocalWorkerSpec{Name: "late", Namespace: "p"})
	assert.NilError(t, err)
	t.Cleanup(lw.Detach)
	assert.Check(t, is.Contains(te.Logs.String(), `[WARN]  engine: worker name taken over by its sandbox adapter: the worker holding it is not the adapter's trusted owner: adapter=late namespace=p worker_id=`+anon.workerID))
	assert.NilError(t, lw.RegisterFunction(engine.FunctionDef{ID: "late::create"}, func(context.Context, *engine.Call) (json.RawMessage, error) {
		return json.RawMessage(`{"sandbox_id":"s1"}`), nil
	}))
	o := te.trust.OwnerOf("p", "late", "late::create")
	assert.Check(t, o.Registered && o.Trusted)
	// And the squatter cannot take them back.
	anon.send(&protocol.RegisterFunction{ID: "late::create"})
	f := anon.expect("registrationrejected")
	assert.Equal(t, f["code"], engine.CodeForbidden)
	assert.Equal(t, f["function_id"], "late::create")
	out, err := te.Engine.Invoke(context.Background(), "p", "late::create", json.RawMessage(`{}`))
	assert.NilError(t, err)
	assert.Equal(t, string(out), `{"sandbox_id":"s1"}`)
}

func TestIssueSandboxHostValidation(t *testing.T) {
	te := newTrustEnv(t)
	for _, tc := range []struct {
		name, payload, code, msg string
	}{
		{"no adapter", `{"namespace":"sbx","sandbox_host":{"host_name":"h1"}}`, engine.CodeInvalidArgument, "sandbox_host.adapter"},
		{"adapter upper case", `{"namespace":"sbx","sandbox_host":{"adapter":"Remote","host_name":"h1"}}`, engine.CodeInvalidArgument, "not an adapter name"},
		{"adapter with ::", `{"namespace":"sbx","sandbox_host":{"adapter":"a::b","host_name":"h1"}}`, engine.CodeInvalidArgument, "not an adapter name"},
		{"adapter reserved", `{"namespace":"sbx","sandbox_host":{"adapter":"sandbox","host_name":"h1"}}`, engine.CodeInvalidArgument,
			`sandbox_host.adapter "sandbox" is a reserved prefix (engine::, compose::, configuration::, sandbox::)`},
		{"adapter engine", `{"namespace":"sbx","sandbox_host":{"adapter":"engine","host_name":"h1"}}`, engine.CodeInvalidArgument, "reserved"},
		{"no host name", `{"namespace":"sbx","sandbox_host":{"adapter":"remote"}}`, engine.CodeInvalidArgument, "host_name"},
		{"host name with _", `{"namespace":"sbx","sandbox_host":{"adapter":"remote","host_name":"h_1"}}`, engine.CodeInvalidArgument,
			`sandbox_host.host_name "h_1" is not a host name: 1 to 63 of a-z 0-9 -`},
		{"host name too long", `{"namespace":"sbx","sandbox_host":{"adapter":"remote","host_name":"` + strings.Repeat("h", 64) + `"}}`, engine.CodeInvalidArgument, "host_name"},
		{"bad namespace", `{"namespace":"Sbx","sandbox_host":{"adapter":"remote","host_name":"h1"}}`, protocol.CodeInvalidNamespace, "namespace"},
		{"a queue provider too", `{"namespace":"default","queue_provider":true,"sandbox_host":{"adapter":"remote","host_name":"h1"}}`, engine.CodeInvalidArgument,
			"a credential is a queue provider or a sandbox host, not both"},
		{"a queue provider too, elsewhere", `{"namespace":"proj","queue_provider":true,"sandbox_host":{"adapter":"remote","host_name":"h1"}}`, engine.CodeInvalidArgument,
			"not both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := te.Engine.Invoke(context.Background(), engine.DefaultNamespace, engine.FnCredentialsIssue, json.RawMessage(tc.payload))
			var eb *protocol.ErrorBody
			assert.Assert(t, errors.As(err, &eb), "%v", err)
			assert.Equal(t, eb.Code, tc.code)
			assert.Check(t, is.Contains(eb.Message, tc.msg))
		})
	}
	// The longest valid ones are fine, and claim their adapter's names.
	te.issue(t, `{"namespace":"sbx","sandbox_host":{"adapter":"`+strings.Repeat("a", 64)+`","host_name":"`+strings.Repeat("h", 63)+`"}}`)
	assert.Check(t, is.DeepEqual(te.trust.Known(), []string{strings.Repeat("a", 64)}))
}

// A sandbox host credential registers its adapter's functions in its
// namespace (not its own worker name's prefix), nothing else; they are a
// trusted adapter for that adapter and namespace only; it calls nothing
// privileged; revoking it closes its connection and ends the trust at once.
func TestSandboxHostCredential(t *testing.T) {
	te := newTrustEnv(t)
	tok := te.issue(t, `{"label":"hosts/h1","namespace":"sbx","allow":{"default":["*"]},"sandbox_host":{"adapter":"remote","host_name":"h1"}}`)
	plain := te.issue(t, `{"label":"plain","namespace":"sbx"}`)

	host := te.dial(t, tok)
	assert.DeepEqual(t, host.rejected("sbx", "sandbox-host-h1", "remote::create", "remote::adapter::info", "remote::worker::start", "other::create", "sandbox::create", "remotex::create",
		"remote::host::h1::create", "remote::host::h1::worker::start", "remote::host::h2::create", "remote::host::h10::create"),
		// As a fleet host it serves only its own host name's functions.
		[]string{"other::create", "sandbox::create", "remotex::create", "remote::host::h2::create", "remote::host::h10::create"})
	assert.Check(t, is.Contains(te.Logs.String(), `the sandbox host credential \"hosts/h1\" of host \"h1\" registers only remote::host::h1::* of the fleet's host functions in namespace \"sbx\"; remote::host::h2::create in namespace \"sbx\" is refused`))
	assert.Check(t, te.has("sbx", "remote::create"))

	for _, tc := range []struct {
		name, ns, adapter, id string
		want                  AdapterOwner
	}{
		{"its adapter and namespace", "sbx", "remote", "remote::create", AdapterOwner{Registered: true, Trusted: true, Host: "h1"}},
		{"another adapter's binding", "sbx", "other", "remote::create", AdapterOwner{Registered: true, Host: "h1"}},
		{"not registered", "sbx", "other", "other::create", AdapterOwner{}},
		{"another namespace", "default", "remote", "remote::create", AdapterOwner{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := te.trust.OwnerOf(tc.ns, tc.adapter, tc.id)
			if got.Registered {
				assert.Equal(t, got.WorkerID, host.workerID)
			}
			got.WorkerID = ""
			assert.DeepEqual(t, got, tc.want)
		})
	}

	// Nothing privileged answers it (its other connection), not even the
	// adapter's worker::*, which are privileged whatever it registered
	// them as.
	other := te.dial(t, tok)
	for _, tc := range []struct{ id, fn, ns string }{
		{"4", "remote::worker::start", "sbx"},
		{"4b", "remote::host::h1::worker::start", "sbx"},
		{"5", engine.FnCredentialsIssue, "default"},
		{"6", engine.FnCredentialsRevoke, "default"},
	} {
		assert.Equal(t, other.call(tc.id, tc.fn, tc.ns), engine.CodeUnauthorized, tc.fn)
	}
	assert.Equal(t, te.dial(t, "").call("7", "remote::worker::start", "sbx"), engine.CodeUnauthorized)

	// A plain credential of the same namespace is no adapter.
	pw := te.dial(t, plain)
	assert.DeepEqual(t, pw.rejected("sbx", "plain", "plain::create"), []string(nil))
	o := te.trust.OwnerOf("sbx", "plain", "plain::create")
	assert.Assert(t, o.Registered && !o.Trusted)

	// Revoked: untrusted from that moment, its connections closed.
	rev := te.MustCall(t, engine.FnCredentialsRevoke, map[string]any{"token": tok})
	assert.Equal(t, rev["revoked"], true)
	assert.Check(t, !te.trust.OwnerOf("sbx", "remote", "remote::create").Trusted)
	for _, w := range []*wsWorker{host, other} {
		select {
		case <-w.closed:
		case <-w.ctxDone():
			t.Fatal("the revoked credential's connection was not closed")
		}
	}
}

// A persisted sandbox host credential keeps its rule and its trust in the
// next engine on the same file, and its adapter's names are reserved from
// the moment it is loaded.
func TestPersistedSandboxHost(t *testing.T) {
	path := filepath.Join(t.TempDir(), engine.CredentialsFileName)
	first := newTrustEnv(t)
	_, err := first.Engine.UseCredentialsFile(path)
	assert.NilError(t, err)
	tok := first.issue(t, `{"label":"hosts/h1","namespace":"sbx","persist":true,"sandbox_host":{"adapter":"remote","host_name":"h1"}}`)

	second := newTrustEnv(t)
	n, err := second.Engine.UseCredentialsFile(path)
	assert.NilError(t, err)
	assert.Equal(t, n, 1)
	assert.Check(t, is.DeepEqual(second.trust.Known(), []string{"remote"}))
	host := second.dial(t, tok)
	assert.DeepEqual(t, host.rejected("sbx", "h1", "remote::create", "other::create"), []string{"other::create"})
	o := second.trust.OwnerOf("sbx", "remote", "remote::create")
	assert.Check(t, o.Trusted && o.Host == "h1", "%+v", o)
}

// The connections the engine heartbeats are those that serve sandboxes
// over WebSocket.
func TestTrustHeartbeat(t *testing.T) {
	tr := &Trust{}
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"sandbox-x::host::h1::sandbox::exec", true},
		{"remote::host::h1::create", true},
		{"remote::adapter::info", true},
		{"remote::host::h1", false},
		{"remote::create", false},
		{"plain::echo", false},
	} {
		assert.Check(t, tr.Heartbeat(tc.id) == tc.want, tc.id)
	}
}

// An engine takes the trust rules once.
func TestTrustInstalledOnce(t *testing.T) {
	te := newTrustEnv(t)
	_, err := NewTrust(te.Engine)
	assert.ErrorContains(t, err, "a registration guard is installed already")
	_, err = New(te.Engine, Options{})
	assert.ErrorContains(t, err, "install the sandbox trust rules")
	r, err := New(te.Engine, Options{Trust: te.trust})
	assert.NilError(t, err)
	r.Close()
}
