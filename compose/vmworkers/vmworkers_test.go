package vmworkers

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/protocol"
)

// vm_ids are what worker::start accepts (1 to 48 of a-z 0-9 . _ -,
// starting with a letter or digit), stable, and distinct per container.
func TestVMID(t *testing.T) {
	none := func(string) string { return "" }
	id := VMID("/srv/My Shop/worker-compose.yaml", "Dev", "API", none)
	assert.Check(t, strings.HasPrefix(id, "my-shop-"), id)
	assert.Check(t, strings.HasSuffix(id, "-dev-api"), id)
	assert.Equal(t, VMID("/srv/My Shop/worker-compose.yaml", "Dev", "API", none), id)
	assert.Check(t, VMID("/srv/My Shop/worker-compose.yaml", "Dev", "web", none) != id)
	assert.Check(t, VMID("/moved/My Shop/worker-compose.yaml", "Dev", "API", none) != id, "a moved project gets new vm_ids")
	long := VMID("/srv/"+strings.Repeat("x", 80)+"/worker-compose.yaml", "ns", "api", none)
	assert.Equal(t, len(long), 48)
	assert.Check(t, long != VMID("/srv/"+strings.Repeat("x", 80)+"/worker-compose.yaml", "ns", "web", none), "the hash keeps long ids apart")
}

func FuzzVMID(f *testing.F) {
	f.Add("/srv/shop/worker-compose.yaml", "default", "api")
	f.Add("/_/worker-compose.yaml", "", "")
	f.Add("/srv/"+strings.Repeat("é", 40)+"/worker-compose.yaml", "ns", "k")
	f.Fuzz(func(t *testing.T, path, ns, key string) {
		id := VMID(path, ns, key, func(string) string { return "" })
		if len(id) < 1 || len(id) > 48 {
			t.Fatalf("vm_id %q has %d characters", id, len(id))
		}
		for i, c := range []byte(id) {
			ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || (i > 0 && (c == '.' || c == '_' || c == '-'))
			if !ok {
				t.Fatalf("vm_id %q: character %q at %d", id, c, i)
			}
		}
	})
}

// fakeEngine answers calls from a map of function id to reply (or error)
// and records what was called, in which namespace.
type fakeEngine struct {
	replies map[string]any
	calls   []string
}

func (f *fakeEngine) Call(_ context.Context, fn string, payload any, opts ...client.CallOption) (json.RawMessage, error) {
	f.calls = append(f.calls, fn)
	switch r := f.replies[fn].(type) {
	case error:
		return nil, r
	case string:
		return json.RawMessage(r), nil
	}
	return nil, &protocol.ErrorBody{Code: "function_not_found", Message: fn}
}

// worker::logs entries become compose::logs entries: the adapter's own
// notes as stderr lines with its name, a stream filter applied, the
// cursor the adapter's; Tail quotes them for a message.
func TestLogs(t *testing.T) {
	eng := &fakeEngine{replies: map[string]any{"sandbox-libkrun::worker::logs": `{"vm_id":"v","cursor":7,"truncated":true,"entries":[
		{"seq":5,"stream":"stdout","message":"listening"},{"seq":6,"stream":"system","message":"copied 3 files"},{"seq":7,"stream":"stderr","message":"warn"}]}`}}
	ref := &Ref{ID: "v", Adapter: &Adapter{Name: "sandbox-libkrun", NS: "shop"}}
	c := Client{Eng: eng}
	for _, tc := range []struct {
		name   string
		stream proc.Stream
		want   []proc.Entry
	}{
		{name: "all", want: []proc.Entry{{Stream: proc.Stdout, Message: "listening"}, {Stream: proc.Stderr, Message: "[sandbox-libkrun] copied 3 files"},
			{Stream: proc.Stderr, Message: "warn"}}},
		{name: "stdout", stream: proc.Stdout, want: []proc.Entry{{Stream: proc.Stdout, Message: "listening"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			entries, cur, truncated, err := c.Logs(context.Background(), ref, 10, nil, tc.stream)
			assert.NilError(t, err)
			assert.DeepEqual(t, entries, tc.want)
			assert.Check(t, is.Equal(cur.Offset, int64(7)))
			assert.Check(t, truncated)
		})
	}
	assert.Equal(t, c.Tail(context.Background(), ref), "; last output:\n  listening\n  [sandbox-libkrun] copied 3 files\n  warn")

	eng.replies["sandbox-libkrun::worker::logs"] = contract.NewError(contract.S002, "no VM v").ErrorBody()
	_, _, _, err := c.Logs(context.Background(), ref, 10, nil, "")
	assert.Check(t, is.Equal(CodeOf(err), "S002"))
	assert.Check(t, is.Equal(c.Tail(context.Background(), ref), ""))
}

func TestStatusAndEnd(t *testing.T) {
	code := 3
	for _, tc := range []struct {
		name  string
		reply any
		ended bool
		text  string
		err   string
	}{
		{name: "running", reply: `{"vm_id":"v","state":"running"}`},
		{name: "exited", reply: `{"vm_id":"v","state":"exited","exit_code":3,"last_error":"boom"}`, ended: true, text: "exited (status 3): boom"},
		{name: "stopped", reply: `{"vm_id":"v","state":"stopped"}`, ended: true, text: "was stopped by its adapter"},
		{name: "failed", reply: `{"vm_id":"v","state":"failed"}`, ended: true, text: "failed"},
		{name: "bad reply", reply: `[1]`, err: "sandbox-libkrun::worker::status returned an unexpected reply"},
		{name: "refused", reply: contract.NewError(contract.S301, "adapter stopped").ErrorBody(), err: "adapter stopped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := &fakeEngine{replies: map[string]any{"sandbox-libkrun::worker::status": tc.reply}}
			st, err := Client{Eng: eng}.Status(context.Background(), &Ref{ID: "v", Adapter: &Adapter{Name: "sandbox-libkrun", NS: "shop"}})
			if tc.err != "" {
				assert.Check(t, is.ErrorContains(err, tc.err))
				return
			}
			assert.NilError(t, err)
			assert.Check(t, is.Equal(Ended(st.State), tc.ended))
			if tc.ended {
				assert.Check(t, is.Equal(EndText(st), tc.text))
			}
		})
	}
	assert.Equal(t, EndText(&contract.WorkerStatus{State: contract.WorkerExited, ExitCode: &code}), "exited (status 3)")
}

func TestErrorWording(t *testing.T) {
	ref := &Ref{ID: "v", Adapter: &Adapter{Name: "sandbox-libkrun", NS: "shop"}}
	for _, tc := range []struct {
		name       string
		err        error
		code, text string
	}{
		{name: "S-code", err: contract.NewError(contract.S501, "not under a host root").ErrorBody(), code: "S501", text: "S501: not under a host root"},
		{name: "engine error", err: &protocol.ErrorBody{Code: "function_not_found", Message: "no such function"}, code: "function_not_found",
			text: "function_not_found: no such function"},
		{name: "other", err: errors.New("connection closed"), code: "", text: "connection closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Check(t, is.Equal(CodeOf(tc.err), tc.code))
			assert.Check(t, is.Equal(ErrorText(tc.err), tc.text))
			err := CallFailed("api", ref, contract.OpWorkerStart, "did not boot it", tc.err)
			assert.Check(t, is.Equal(compose.CodeOf(err), compose.CodeSpawnFailed))
			assert.Check(t, is.ErrorContains(err, `container "api": sandbox-libkrun::worker::start in namespace "shop" did not boot it: `+tc.text))
		})
	}
}

// A credential replaced or forgotten is revoked once; setting the same
// one again revokes nothing.
func TestCredentials(t *testing.T) {
	var revoked []string
	c := &Credentials{Revoke: func(_ context.Context, tok string) { revoked = append(revoked, tok) }}
	ctx := context.Background()
	c.Set(ctx, "vm1", "a")
	c.Set(ctx, "vm1", "a")
	c.Set(ctx, "vm2", "x")
	assert.Check(t, is.Len(revoked, 0))
	c.Set(ctx, "vm1", "b")
	assert.DeepEqual(t, revoked, []string{"a"})
	c.Forget(ctx, "vm1")
	c.Forget(ctx, "vm1")
	c.Forget(ctx, "unknown")
	assert.DeepEqual(t, revoked, []string{"a", "b"})

	spec := CredentialSpec("shop", "api", true)
	assert.Check(t, is.Equal(spec.Label, "compose/shop/api"))
	assert.Check(t, is.Equal(spec.Namespace, "shop"))
	assert.Check(t, spec.Persist)
	assert.DeepEqual(t, spec.Allow, map[string][]string{protocol.DefaultNamespace: {"*"}})
}
