package stream

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/host/engine"
)

// An issued credential (a VM worker's: allow {"default": ["*"]}) reads and
// changes no stream data unless it names stream::* (or the function) for
// default; anonymous local workers keep iii 0.26's open stream::*.
func TestStreamDataNeedsTheCredentialsGrant(t *testing.T) {
	const adminToken = "stream-grant-admin"
	f := startWith(t, engine.New(engine.Options{AdminToken: func() string { return adminToken }}), Config{}, nil)
	f.mustCall(t, "stream::set", `{"stream_name":"secrets","group_id":"g","item_id":"k","data":"top"}`)

	issue := func(allow []string) string {
		tok, errb := f.eng.IssueCredential(engine.CredentialSpec{Label: "compose/p/vm", Namespace: "p", Allow: map[string][]string{engine.DefaultNamespace: allow}})
		assert.Assert(t, errb == nil, "%v", errb)
		return tok
	}
	dial := func(name, tok, ns string) *client.Client {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		c, err := client.Dial(ctx, f.url, client.Options{Name: name, Namespace: ns, Token: tok, IgnoreEnv: true,
			CallTimeout: waitFor, Reconnect: client.ReconnectPolicy{Disable: true}})
		assert.NilError(t, err)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			_ = c.Close(ctx)
		})
		return c
	}
	get := func(c *client.Client, fn, payload string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		out, err := c.Call(ctx, fn, json.RawMessage(payload), client.WithNamespace(engine.DefaultNamespace))
		return string(out), err
	}
	vm := dial("vm", issue([]string{"*"}), "p")
	for _, tc := range []struct{ fn, payload string }{
		{"stream::get", `{"stream_name":"secrets","group_id":"g","item_id":"k"}`},
		{"stream::list", `{"stream_name":"secrets","group_id":"g"}`},
		{"stream::list_groups", `{"stream_name":"secrets"}`},
		{"stream::list_all", `{}`},
		{"stream::set", `{"stream_name":"secrets","group_id":"g","item_id":"k","data":"mine"}`},
		{"stream::delete", `{"stream_name":"secrets","group_id":"g","item_id":"k"}`},
	} {
		_, err := get(vm, tc.fn, tc.payload)
		assert.Check(t, is.Equal(client.CodeOf(err), engine.CodeForbidden), tc.fn)
	}
	assert.Equal(t, f.mustCall(t, "stream::get", `{"stream_name":"secrets","group_id":"g","item_id":"k"}`), `"top"`)

	// Nor through the stream worker's triggers, which would hand it every
	// change (values included) or let it refuse others' joins.
	refused := make(chan *client.TriggerError, 4)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	tw, err := client.Dial(ctx, f.url, client.Options{Name: "vm-triggers", Namespace: "p", Token: issue([]string{"*"}), IgnoreEnv: true,
		Reconnect: client.ReconnectPolicy{Disable: true}, OnRegistrationError: func(err error) {
			var te *client.TriggerError
			if errors.As(err, &te) {
				refused <- te
			}
		}})
	assert.NilError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		_ = tw.Close(ctx)
	})
	_, err = tw.RegisterFunction(client.FunctionDef{ID: "vm::changed"}, func(context.Context, *client.Invocation) (any, error) { return nil, nil })
	assert.NilError(t, err)
	for _, typ := range []string{TriggerStream, TriggerJoin, TriggerLeave} {
		_, err = tw.RegisterTrigger(client.TriggerDef{TriggerType: typ, FunctionID: "vm::changed", Config: json.RawMessage(`{"stream_name":"secrets"}`)})
		assert.NilError(t, err)
		select {
		case te := <-refused:
			assert.Equal(t, te.TriggerType, typ)
			assert.Equal(t, te.Err.Code, engine.CodeForbidden)
		case <-time.After(waitFor):
			t.Fatalf("the %s trigger was not refused", typ)
		}
	}

	granted := dial("granted", issue([]string{"*", "stream::*"}), "p")
	out, err := get(granted, "stream::get", `{"stream_name":"secrets","group_id":"g","item_id":"k"}`)
	assert.NilError(t, err)
	assert.Equal(t, out, `"top"`)

	anon := dial("anon", "", "")
	out, err = get(anon, "stream::get", `{"stream_name":"secrets","group_id":"g","item_id":"k"}`)
	assert.NilError(t, err)
	assert.Equal(t, out, `"top"`)
}
