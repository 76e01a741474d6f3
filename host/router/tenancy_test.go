package router

import (
	"context"
	"encoding/json"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
)

// dialCredential connects a client presenting a credential issued for
// label in namespace ns (as Compose issues a VM worker's).
func dialCredential(t *testing.T, te *testEnv, label, ns string) *client.Client {
	t.Helper()
	cred := issueCredential(t, te, map[string]any{"label": label, "namespace": ns, "allow": map[string]any{"default": []string{"*"}}})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cl, err := client.Dial(ctx, te.URL, client.Options{Name: "vm-" + ns, Namespace: ns, Token: cred, IgnoreEnv: true,
		Reconnect: client.ReconnectPolicy{Disable: true}, CallTimeout: waitFor})
	assert.NilError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		_ = cl.Close(ctx)
	})
	return cl
}

func call(t *testing.T, cl *client.Client, fn string, payload any) (map[string]any, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	var out map[string]any
	raw, err := cl.Call(ctx, fn, payload, client.WithNamespace(engine.DefaultNamespace))
	if err == nil {
		assert.NilError(t, jsonUnmarshal(raw, &out))
	}
	return out, err
}

func listed(t *testing.T, cl *client.Client) []string {
	t.Helper()
	out, err := call(t, cl, "sandbox::list", map[string]any{})
	assert.NilError(t, err)
	ids := []string{}
	for _, s := range out["sandboxes"].([]any) {
		ids = append(ids, s.(map[string]any)["sandbox_id"].(string))
	}
	return ids
}

// A principal other than the engine token's holder sees and acts only on
// the sandboxes it created: list shows its own, and exec, fs::*, stop of
// another's id answer S002 as for a sandbox that does not exist (the
// sandbox is untouched). The engine token's holder sees all of them.
// Direct calls of the adapter's functions, which would see everyone's,
// answer UNAUTHORIZED to all of them.
func TestSandboxTenancy(t *testing.T) {
	te := newEnv(t, nil)
	te.startAdapter(t, "sandbox-hostdir", "default", nil)
	assert.NilError(t, te.router.Bind("sandbox-hostdir", "default"))
	a := dialCredential(t, te, "compose/p/a", "p")
	b := dialCredential(t, te, "compose/q/b", "q")
	anon := te.Anonymous(t, "local-anon")

	create := func(cl *client.Client) string {
		out, err := call(t, cl, "sandbox::create", map[string]any{"image": "shell"})
		assert.NilError(t, err)
		return out["sandbox_id"].(string)
	}
	ida, idb, idn := create(a), create(b), create(anon)
	idAdmin := te.MustCall(t, "sandbox::create", map[string]any{"image": "shell"})["sandbox_id"].(string)

	assert.Check(t, is.DeepEqual(listed(t, a), []string{ida}))
	assert.Check(t, is.DeepEqual(listed(t, b), []string{idb}))
	assert.Check(t, is.DeepEqual(listed(t, anon), []string{idn}))
	all := map[string]bool{}
	for _, s := range te.MustCall(t, "sandbox::list", nil)["sandboxes"].([]any) {
		all[s.(map[string]any)["sandbox_id"].(string)] = true
	}
	assert.Check(t, is.DeepEqual(all, map[string]bool{ida: true, idb: true, idn: true, idAdmin: true}))

	for _, tc := range []struct {
		name    string
		cl      *client.Client
		fn      string
		payload map[string]any
	}{
		{"exec in another credential's", a, "sandbox::exec", map[string]any{"sandbox_id": idb, "cmd": "echo owned"}},
		{"exec in the admin's", a, "sandbox::exec", map[string]any{"sandbox_id": idAdmin, "cmd": "true"}},
		{"exec in an anonymous one's", b, "sandbox::exec", map[string]any{"sandbox_id": idn, "cmd": "true"}},
		{"anonymous exec in a credential's", anon, "sandbox::exec", map[string]any{"sandbox_id": ida, "cmd": "true"}},
		{"fs::write", a, "sandbox::fs::write", map[string]any{"sandbox_id": idb, "path": "/tmp/x", "content": "x"}},
		{"fs::read", a, "sandbox::fs::read", map[string]any{"sandbox_id": idb, "path": "/etc/hostname"}},
		{"fs::ls", anon, "sandbox::fs::ls", map[string]any{"sandbox_id": idAdmin, "path": "/"}},
		{"stop", a, "sandbox::stop", map[string]any{"sandbox_id": idb, "wait": true}},
		{"stop the admin's", anon, "sandbox::stop", map[string]any{"sandbox_id": idAdmin}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := call(t, tc.cl, tc.fn, tc.payload)
			assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S002)
		})
	}
	// Everyone's sandboxes are still there and still work for their owners.
	for _, tc := range []struct {
		cl *client.Client
		id string
	}{{a, ida}, {b, idb}, {anon, idn}} {
		out, err := call(t, tc.cl, "sandbox::exec", map[string]any{"sandbox_id": tc.id, "cmd": "echo mine"})
		assert.NilError(t, err)
		assert.Check(t, is.Equal(out["stdout"], "mine\n"))
	}
	assert.Check(t, is.Len(te.MustCall(t, "sandbox::list", nil)["sandboxes"].([]any), 4))

	// The adapter's own functions are not a way around the router.
	for _, cl := range []*client.Client{a, anon} {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		_, err := cl.Call(ctx, "sandbox-hostdir::list", map[string]any{}, client.WithNamespace(engine.DefaultNamespace))
		cancel()
		assert.Equal(t, client.CodeOf(err), engine.CodeUnauthorized)
	}

	// The owner stops its own; the admin stops anyone's.
	_, err := call(t, b, "sandbox::stop", map[string]any{"sandbox_id": idb, "wait": true})
	assert.NilError(t, err)
	te.MustCall(t, "sandbox::stop", map[string]any{"sandbox_id": ida, "wait": true})
}

func jsonUnmarshal(raw []byte, v any) error { return json.Unmarshal(raw, v) }

// Every spelling of sandbox_id in a request must name the caller's own
// sandbox: the adapter's decoder (exact key, last occurrence) and the
// router's must not be played against each other.
func TestSandboxTenancyDuplicateKeys(t *testing.T) {
	te := newEnv(t, nil)
	te.startAdapter(t, "sandbox-hostdir", "default", nil)
	assert.NilError(t, te.router.Bind("sandbox-hostdir", "default"))
	a := dialCredential(t, te, "compose/p/a", "p")
	mine, err := call(t, a, "sandbox::create", map[string]any{"image": "shell"})
	assert.NilError(t, err)
	theirs := te.MustCall(t, "sandbox::create", map[string]any{"image": "shell"})["sandbox_id"].(string)
	m := mine["sandbox_id"].(string)
	for _, payload := range []string{
		`{"sandbox_id":"` + theirs + `","SANDBOX_ID":"` + m + `","cmd":"true"}`,
		`{"SANDBOX_ID":"` + m + `","sandbox_id":"` + theirs + `","cmd":"true"}`,
		`{"sandbox_id":"` + m + `","sandbox_id":"` + theirs + `","cmd":"true"}`,
		`{"sandbox_id":"` + theirs + `","sandbox_id":"` + m + `","cmd":"true"}`,
		`{"sandbox_id":"{` + theirs + `}","cmd":"true"}`,
	} {
		_, err := call(t, a, "sandbox::exec", json.RawMessage(payload))
		assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S002, payload)
	}
	_, err = call(t, a, "sandbox::exec", json.RawMessage(`{"sandbox_id":["`+theirs+`"],"cmd":"true"}`))
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S001)
	out, err := call(t, a, "sandbox::exec", json.RawMessage(`{"sandbox_id":"`+m+`","Sandbox_Id":"{`+m+`}","cmd":"echo ok"}`))
	assert.NilError(t, err)
	assert.Equal(t, out["stdout"], "ok\n")
}
