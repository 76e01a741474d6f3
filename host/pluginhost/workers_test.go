package pluginhost

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/protocol"
)

// libkrunConfig configures sandbox-libkrun so that starting it boots no
// VM (an explicit accelerator skips the probe), with one host root.
func libkrunConfig(t *testing.T, root string) map[string]any {
	state, err := os.MkdirTemp("/tmp", "phw")
	assert.NilError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	return map[string]any{
		"image_allowlist": []string{"node"},
		"hypervisor":      "qemu",
		"accel":           "tcg",
		"state_dir":       state,
		"cache_dir":       t.TempDir(),
		"host_roots":      []string{root},
	}
}

// TestWorkerFunctionsPublished: an adapter that announces the worker
// capability is published with the six <adapter>::worker::* functions and
// their schemas; calls go through the host's decoders and the adapter's
// errors (S501 for a directory outside the host roots) reach the caller.
// An adapter without the capability gets none of them.
func TestWorkerFunctionsPublished(t *testing.T) {
	te := newEnv(t, Options{})
	root := t.TempDir()
	st, err := te.start(t, map[string]any{"adapter": "sandbox-libkrun", "path": testBins.Path(t, "sandbox-libkrun"), "config": libkrunConfig(t, root)})
	assert.NilError(t, err)
	assert.Equal(t, st["state"], "running")

	wi := te.MustCall(t, engine.FnWorkersInfo, map[string]any{"name": "sandbox-libkrun"})
	assert.Equal(t, len(wi["functions"].([]any)), 25, "16 ops, adapter::info, 6 worker::* and pause and resume (QEMU sandboxes pause)")
	for _, op := range contract.WorkerOps() {
		fi := te.MustCall(t, engine.FnFunctionsInfo, map[string]any{"function_id": "sandbox-libkrun::" + op})
		assert.Assert(t, fi["request_schema"] != nil && fi["response_schema"] != nil, op)
	}
	info := te.MustCall(t, "sandbox-libkrun::adapter::info", map[string]any{})
	assert.DeepEqual(t, info["capabilities"], []any{contract.CapabilityPause, contract.CapabilityReconfigure, contract.CapabilityWorker})
	assert.DeepEqual(t, info["host_roots"], []any{root})

	list := te.MustCall(t, "sandbox-libkrun::worker::list", nil)
	assert.DeepEqual(t, list, map[string]any{"workers": []any{}})

	// worker::* is privileged (it boots VMs from host directories): a
	// worker without the engine token reaches none of it; the sandbox
	// operations and adapter::info stay open.
	anon := te.Anonymous(t, "a-worker")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for _, op := range contract.WorkerOps() {
		_, err := anon.Call(ctx, "sandbox-libkrun::"+op, map[string]any{"vm_id": "proj-default-api"})
		assert.Equal(t, codeOf(err), engine.CodeUnauthorized, "%s: %v", op, err)
		priv, ok := te.Engine.FunctionPrivileged("default", "sandbox-libkrun::"+op)
		assert.Check(t, ok && priv, op)
	}
	_, err = anon.Call(ctx, "sandbox-libkrun::adapter::info", map[string]any{})
	assert.NilError(t, err)

	outside := t.TempDir()
	start := map[string]any{"vm_id": "proj-default-api", "name": "api", "image": "node", "host_dir": outside,
		"command": "node index.mjs", "engine_url": "ws://127.0.0.1:49134"}
	_, err = te.Call(t, "sandbox-libkrun::worker::start", start)
	se := enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S501)
	assert.Check(t, is.Contains(se.Message, outside))
	assert.Check(t, is.Contains(se.Message, root), "the message names the roots")
	assert.Check(t, is.Contains(se.Message, "iii call compose::restart worker=sandbox-libkrun"))
	assert.Equal(t, se.DocsURL, contract.DocsURL(contract.S501))

	// A symbolic link inside a root that leads outside is judged by where
	// it leads.
	link := filepath.Join(root, "escape")
	assert.NilError(t, os.Symlink(outside, link))
	start["host_dir"] = link
	_, err = te.Call(t, "sandbox-libkrun::worker::start", start)
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S501)

	// Requests are decoded by the host before they reach the adapter.
	_, err = te.Call(t, "sandbox-libkrun::worker::start", map[string]any{"vm_id": "Bad/Id"})
	se = enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S001)
	assert.Check(t, is.Contains(se.Message, "invalid worker::start request"))
	_, err = te.Call(t, "sandbox-libkrun::worker::status", map[string]any{"vm_id": "never-started"})
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S002)
	rm := te.MustCall(t, "sandbox-libkrun::worker::remove", map[string]any{"vm_id": "never-started"})
	assert.Equal(t, rm["removed"], false)

	// The hostdir example adapter has no worker side: nothing published.
	_, err = te.start(t, map[string]any{"adapter": "sandbox-hostdir", "path": testBins.Path(t, "sandbox-hostdir"), "config": hostdirConfig(t, nil)})
	assert.NilError(t, err)
	_, err = te.Call(t, "sandbox-hostdir::worker::list", nil)
	assert.Equal(t, codeOf(err), protocol.CodeFunctionNotFound)
}

// TestWorkerFunctionsWhileDown: an adapter that does not run still has its
// worker::* functions, answering S301 with the reason, as its other ops.
func TestWorkerFunctionsWhileDown(t *testing.T) {
	te := newEnv(t, Options{})
	cfg := libkrunConfig(t, t.TempDir())
	cfg["host_roots"] = "not a list"
	_, err := te.start(t, map[string]any{"adapter": "sandbox-libkrun", "namespace": "proj", "path": testBins.Path(t, "sandbox-libkrun"), "config": cfg})
	assert.Equal(t, codeOf(err), CodeConfigRejected, "%v", err)
	_, err = te.Call(t, "sandbox-libkrun::worker::list", nil, client.WithNamespace("proj"))
	se := enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S301)
	assert.Check(t, is.Contains(se.Message, "host_roots"))
}

// TestEngineTokenGuardsAdapters: start, stop and restart are privileged:
// a connection without the engine token gets UNAUTHORIZED from the engine
// whatever its payload says (a token field included), and nothing starts;
// the token's holder needs no token field; list stays open to everyone
// and never shows the token.
func TestEngineTokenGuardsAdapters(t *testing.T) {
	const token = "tok-6f1c2a9e8b7d"
	te := newEnv(t, Options{Token: func() string { return token }})
	worker := te.Anonymous(t, "a-worker")
	in := map[string]any{"adapter": "sandbox-hostdir", "path": testBins.Path(t, "sandbox-hostdir"), "config": hostdirConfig(t, nil)}
	call := func(c *client.Client, fn string, payload any) (json.RawMessage, error) {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		return c.Call(ctx, fn, payload)
	}

	for _, tok := range []any{nil, "", "guess", token, te.Token} {
		req := map[string]any{}
		for k, v := range in {
			req[k] = v
		}
		if tok != nil {
			req["token"] = tok
		}
		for _, fn := range []string{FnStart, FnRestart, FnStop} {
			_, err := call(worker, fn, req)
			assert.Equal(t, codeOf(err), engine.CodeUnauthorized, "%s with token %v: %v", fn, tok, err)
			assert.Check(t, !strings.Contains(err.Error(), token), "the error never shows the token")
		}
	}
	assert.Assert(t, !te.host.Hosted("sandbox-hostdir", "default"), "nothing started")

	out, err := call(worker, FnList, map[string]any{})
	assert.NilError(t, err, "list stays open")
	assert.Check(t, !strings.Contains(string(out), token))

	st, err := te.start(t, in)
	assert.NilError(t, err, "the engine token's holder sends no token field")
	assert.Equal(t, st["state"], "running")
	for _, fn := range []string{FnRestart, FnStop} {
		_, err = te.Call(t, fn, map[string]any{"adapter": "sandbox-hostdir"})
		assert.NilError(t, err, fn)
	}
}

// TestAuthorizeKeepsTokenField: the payload's token field, the check older
// engines relied on, still decides for a caller that is not admin; an
// admin caller (Call.CallerAdmin) passes without it.
func TestAuthorizeKeepsTokenField(t *testing.T) {
	const token = "tok-6f1c2a9e8b7d"
	h := &Host{opts: Options{Token: func() string { return token }}}
	for _, tc := range []struct {
		name string
		tok  string
		want string
	}{
		{"no token", "", "needs the engine token"},
		{"wrong token", "tok-6f1c2a9e8b7", "does not match"},
		{"longer token", token + "x", "does not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := h.authorize(FnStart, tc.tok, false)
			assert.Equal(t, codeOf(err), CodeUnauthorized)
			assert.Check(t, is.ErrorContains(err, tc.want))
			assert.Check(t, !strings.Contains(err.Error(), token), "the error never shows the token")
		})
	}
	assert.NilError(t, h.authorize(FnStart, token, false))
	assert.NilError(t, h.authorize(FnStart, "", true))
	assert.NilError(t, (&Host{}).authorize(FnStart, "", false), "no token in force")
}
