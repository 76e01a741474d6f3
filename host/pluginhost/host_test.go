package pluginhost

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/plugins/sdk"
	"github.com/iii-sandbox/iii/protocol"
)

func TestLifelineEnvMatchesSDK(t *testing.T) {
	assert.Equal(t, EnvLifelineFD, sdk.EnvLifelineFD)
}

func TestAdapterEnv(t *testing.T) {
	env := adapterEnv([]string{"A=1", EnvLifelineFD + "=9", EnvEngineToken + "=secret", "B=2"})
	assert.DeepEqual(t, env, []string{"A=1", "B=2", EnvLifelineFD + "=3"})
}

// A started adapter is a worker of the engine: its functions answer over
// the real WebSocket, with the contract's JSON, errors and schemas.
func TestStartCallStop(t *testing.T) {
	te := newEnv(t, Options{})
	st, err := te.start(t, map[string]any{"adapter": "sandbox-hostdir", "path": testBins.Path(t, "sandbox-hostdir"), "config": hostdirConfig(t, nil)})
	assert.NilError(t, err)
	assert.Equal(t, st["state"], "running")
	assert.Equal(t, st["namespace"], "default")
	assert.Equal(t, st["path"], testBins.Path(t, "sandbox-hostdir"))
	assert.Equal(t, st["adapter_version"], "0.1.0")
	assert.DeepEqual(t, st["contract"], map[string]any{"major": float64(contract.Major), "minor": float64(contract.Minor)})
	pid := int(st["pid"].(float64))
	assert.Assert(t, pid > 0)
	assert.Assert(t, te.host.Hosted("sandbox-hostdir", "default"))

	// Published as worker sandbox-hostdir with its PID.
	wi := te.MustCall(t, engine.FnWorkersInfo, map[string]any{"name": "sandbox-hostdir"})
	w := wi["worker"].(map[string]any)
	assert.Equal(t, w["runtime"], "go-plugin")
	assert.Equal(t, w["pid"], float64(pid))
	assert.Equal(t, w["isolation"], "none")
	assert.Equal(t, len(wi["functions"].([]any)), 19, "16 ops, adapter::info, pause and resume (hostdir announces the pause capability)")
	fi := te.MustCall(t, engine.FnFunctionsInfo, map[string]any{"function_id": "sandbox-hostdir::fs::write"})
	assert.Assert(t, fi["request_schema"] != nil && fi["response_schema"] != nil)

	info := te.MustCall(t, "sandbox-hostdir::adapter::info", map[string]any{})
	assert.Equal(t, info["adapter"], "sandbox-hostdir")
	cat := te.MustCall(t, "sandbox-hostdir::catalog::list", map[string]any{})
	assert.Equal(t, cat["images"].([]any)[0].(map[string]any)["name"], "python")

	run := te.MustCall(t, "sandbox-hostdir::run", map[string]any{"image": "python", "lang": "python", "code": "print(2+2)"})
	assert.Equal(t, run["stdout"], "4\n")
	assert.Equal(t, run["success"], true)

	// Request errors are decoded by the host: S001, S210.
	_, err = te.Call(t, "sandbox-hostdir::run", map[string]any{"image": "python", "code": "1"})
	se := enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S001)
	assert.Check(t, is.Contains(se.Message, `"lang"`))
	_, err = te.Call(t, "sandbox-hostdir::fs::ls", map[string]any{"sandbox_id": "not-a-uuid", "path": "/"})
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S001)
	_, err = te.Call(t, "sandbox-hostdir::fs::write", map[string]any{"sandbox_id": "1b4e6709-f265-4142-9178-3a7d83b46aa5", "path": "/a"})
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S210)
	// The adapter's own errors pass through: S002 for an unknown sandbox.
	_, err = te.Call(t, "sandbox-hostdir::exec", map[string]any{"sandbox_id": "1b4e6709-f265-4142-9178-3a7d83b46aa5", "cmd": "true"})
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S002)

	// Starting it again is refused; restart is the way.
	_, err = te.start(t, map[string]any{"adapter": "sandbox-hostdir", "path": testBins.Path(t, "sandbox-hostdir")})
	assert.Equal(t, codeOf(err), CodeAlreadyStarted)

	out, err := te.Call(t, FnStop, map[string]any{"adapter": "sandbox-hostdir"})
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(out), `"state":"stopped"`))
	assert.Assert(t, !te.host.Hosted("sandbox-hostdir", "default"))
	assert.Equal(t, len(adapterProcesses()), 0, "stop leaves no adapter process")
	_, err = te.Call(t, "sandbox-hostdir::catalog::list", map[string]any{})
	assert.Equal(t, codeOf(err), protocol.CodeFunctionNotFound)

	// Restart brings it back with its last configuration.
	out, err = te.Call(t, FnRestart, map[string]any{"adapter": "sandbox-hostdir"})
	assert.NilError(t, err, "%s", out)
	assert.Check(t, is.Contains(string(out), `"state":"running"`))
	assert.Check(t, is.Contains(string(out), `"restarts":1`))
	run = te.MustCall(t, "sandbox-hostdir::run", map[string]any{"image": "python", "lang": "python", "code": "print(6*7)"})
	assert.Equal(t, run["stdout"], "42\n")
}

func TestAdaptersFunctionErrors(t *testing.T) {
	te := newEnv(t, Options{})
	plain := filepath.Join(t.TempDir(), "not-executable")
	assert.NilError(t, os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644))
	notPlugin := filepath.Join(t.TempDir(), "not-a-plugin")
	assert.NilError(t, os.WriteFile(notPlugin, []byte("#!/bin/sh\necho 'I am no plugin' >&2\nexit 3\n"), 0o755))
	for _, tc := range []struct {
		fn   string
		in   any
		code string
	}{
		{FnStart, map[string]any{}, CodeInvalidRequest},
		{FnStart, []int{1}, CodeInvalidRequest},
		{FnStart, map[string]any{"adapter": "Bad Name"}, CodeInvalidRequest},
		{FnStart, map[string]any{"adapter": "x", "namespace": "Dev"}, protocol.CodeInvalidNamespace},
		{FnStart, map[string]any{"adapter": "x", "config": []int{1}}, CodeInvalidRequest},
		{FnStart, map[string]any{"adapter": 7}, CodeInvalidRequest},
		{FnStart, map[string]any{"adapter": "sandbox-nowhere"}, CodeNotFound},
		{FnStart, map[string]any{"adapter": "x", "path": "relative/bin"}, CodeNotFound},
		{FnStart, map[string]any{"adapter": "x", "path": plain}, CodeNotFound},
		{FnStart, map[string]any{"adapter": "y", "path": notPlugin}, CodeStartFailed},
		{FnStop, map[string]any{"adapter": "never-started"}, CodeNotStarted},
		{FnRestart, map[string]any{"adapter": "never-started"}, CodeNotStarted},
	} {
		_, err := te.Call(t, tc.fn, tc.in)
		assert.Equal(t, codeOf(err), tc.code, "%s %v: %v", tc.fn, tc.in, err)
	}
	_, err := te.Call(t, FnStart, map[string]any{"adapter": "sandbox-nowhere"})
	assert.Check(t, is.Contains(err.Error(), ".iii/plugins/sandbox-nowhere"), "the error says where the host looked")

	_, err = te.Call(t, FnStart, map[string]any{"adapter": "y", "path": notPlugin})
	assert.Equal(t, codeOf(err), CodeStartFailed)
	assert.Check(t, is.Contains(err.Error(), "I am no plugin"), "the adapter's last words explain the failure")
	st := te.status(t, "y", "default")
	assert.Equal(t, st["state"], "failed")
	_, err = te.Call(t, "y::catalog::list", nil)
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S301)
}

// A bad configuration value fails closed: the adapter exits at start,
// callers get S301 with its reason, and a restart with a valid value
// recovers.
func TestConfigRejected(t *testing.T) {
	te := newEnv(t, Options{})
	bad := hostdirConfig(t, map[string]any{"max_concurrent_sandboxes": "many"})
	_, err := te.start(t, map[string]any{"adapter": "sandbox-hostdir", "namespace": "tools", "path": testBins.Path(t, "sandbox-hostdir"), "config": bad})
	assert.Equal(t, codeOf(err), CodeConfigRejected, "%v", err)
	assert.Check(t, is.Contains(err.Error(), "max_concurrent_sandboxes"))

	st := te.status(t, "sandbox-hostdir", "tools")
	assert.Equal(t, st["state"], "failed")
	assert.Check(t, is.Contains(st["last_error"].(string), "max_concurrent_sandboxes"))
	assert.Check(t, st["pid"] == nil)
	assert.Equal(t, len(adapterProcesses()), 0, "the adapter exited")

	_, err = te.Call(t, "sandbox-hostdir::catalog::list", map[string]any{}, client.WithNamespace("tools"))
	se := enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S301)
	assert.Check(t, is.Contains(se.Message, "max_concurrent_sandboxes"), "callers get the reason")
	assert.Check(t, is.Contains(se.Message, `namespace "tools"`))
	assert.Check(t, is.Contains(se.Message, "engine::adapters::restart"))
	// An operator must fix the configuration: no retry helps, and the
	// error says which key, not "start or install the adapter".
	assert.Check(t, !se.Retryable, "a rejected configuration is not retryable")
	assert.Check(t, is.Equal(se.Type, contract.TypeConfig))
	assert.Check(t, is.Contains(se.Message, "sandbox.config"))
	assert.Check(t, is.Contains(se.FixNote, "sandbox.config"))
	assert.Check(t, !strings.Contains(se.Message+se.FixNote, "then retry"))
	assert.Check(t, !strings.Contains(se.Message+se.FixNote, "start or install"))
	assert.Check(t, !strings.Contains(se.Message+se.FixNote, "sandbox::catalog::list"), "catalog::list answers this same S301")

	// An allowlist naming an image the adapter lacks names those it has:
	// sandbox::catalog::list cannot be asked while the adapter is down.
	_, err = te.Call(t, FnRestart, map[string]any{"adapter": "sandbox-hostdir", "namespace": "tools",
		"config": hostdirConfig(t, map[string]any{"image_allowlist": []string{"ruby"}})})
	assert.Equal(t, codeOf(err), CodeConfigRejected)
	_, err = te.Call(t, "sandbox-hostdir::catalog::list", map[string]any{}, client.WithNamespace("tools"))
	se = enginetest.SandboxError(t, err)
	assert.Check(t, is.Contains(se.Message, `"ruby" is neither a preset nor a custom_images key: the presets are python, node, shell`))
	assert.Check(t, !strings.Contains(se.Message, "see sandbox::catalog::list"))
	assert.Check(t, !se.Retryable)

	// Restart without config keeps the bad value: still refused.
	_, err = te.Call(t, FnRestart, map[string]any{"adapter": "sandbox-hostdir", "namespace": "tools"})
	assert.Equal(t, codeOf(err), CodeConfigRejected)

	good := hostdirConfig(t, map[string]any{"max_concurrent_sandboxes": 4})
	out, err := te.Call(t, FnRestart, map[string]any{"adapter": "sandbox-hostdir", "namespace": "tools", "config": good})
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(out), `"state":"running"`))
	cat := te.MustCall(t, "sandbox-hostdir::catalog::list", map[string]any{}, client.WithNamespace("tools"))
	assert.Assert(t, len(cat["images"].([]any)) > 0)
}

// A plugin whose go-plugin protocol version (the contract major) differs,
// and one whose adapter::info reports another major, are refused: state
// incompatible, calls fail with S302.
func TestIncompatibleMajorPlugin(t *testing.T) {
	for _, name := range []string{"sandbox-major2", "sandbox-infomajor"} {
		t.Run(name, func(t *testing.T) {
			te := newEnv(t, Options{})
			_, err := te.start(t, map[string]any{"adapter": name, "path": testBins.Path(t, name), "config": hostdirConfig(t, nil)})
			assert.Equal(t, codeOf(err), CodeIncompatible, "%v", err)
			st := te.status(t, name, "default")
			assert.Equal(t, st["state"], "incompatible")
			assert.Check(t, is.Contains(st["last_error"].(string), "install an adapter release for contract major 1"))
			_, err = te.Call(t, name+"::exec", map[string]any{"sandbox_id": "1b4e6709-f265-4142-9178-3a7d83b46aa5", "cmd": "true"})
			se := enginetest.SandboxError(t, err)
			assert.Equal(t, se.Code, contract.S302)
			assert.Equal(t, se.Retryable, false)
			assert.Equal(t, len(adapterProcesses()), 0)
		})
	}
}

// fs::write takes inline text, base64 or a channel a WebSocket peer
// streams into; fs::read always answers with a channel, plus body when
// the file is small UTF-8. A large file streams through.
func TestFsStreaming(t *testing.T) {
	te := newEnv(t, Options{})
	_, err := te.start(t, map[string]any{"adapter": "sandbox-hostdir", "path": testBins.Path(t, "sandbox-hostdir"), "config": hostdirConfig(t, nil)})
	assert.NilError(t, err)
	sb := te.MustCall(t, "sandbox-hostdir::create", map[string]any{"image": "shell"})
	id := sb["sandbox_id"].(string)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	readFile := func(path string) (map[string]any, []byte) {
		t.Helper()
		res := te.MustCall(t, "sandbox-hostdir::fs::read", map[string]any{"sandbox_id": id, "path": path})
		var ref protocol.StreamChannelRef
		b, _ := json.Marshal(res["content"])
		assert.NilError(t, json.Unmarshal(b, &ref))
		r, err := te.Client.OpenChannelReader(ctx, ref)
		assert.NilError(t, err)
		defer r.Close()
		data, err := io.ReadAll(r)
		assert.NilError(t, err)
		return res, data
	}

	te.MustCall(t, "sandbox-hostdir::fs::write", map[string]any{"sandbox_id": id, "path": "/home/a.txt", "content": "héllo\n"})
	res, data := readFile("/home/a.txt")
	assert.Equal(t, res["body"], "héllo\n")
	assert.Equal(t, string(data), "héllo\n")
	assert.Equal(t, res["size"], float64(len("héllo\n")))

	te.MustCall(t, "sandbox-hostdir::fs::write", map[string]any{"sandbox_id": id, "path": "/home/b.bin", "content_b64": "AAEC/w=="})
	res, data = readFile("/home/b.bin")
	assert.Check(t, res["body"] == nil, "binary is never inlined")
	assert.DeepEqual(t, data, []byte{0, 1, 2, 0xff})

	// 3 MiB streamed in through a channel from a WebSocket writer.
	big := make([]byte, 3<<20+123)
	_, _ = rand.Read(big)
	wref, rref, err := te.Client.CreateChannel(ctx, 0)
	assert.NilError(t, err)
	done := make(chan error, 1)
	go func() {
		w, err := te.Client.OpenChannelWriter(ctx, wref)
		if err != nil {
			done <- err
			return
		}
		if _, err := w.Write(big); err != nil {
			done <- err
			return
		}
		done <- w.Close()
	}()
	wr := te.MustCall(t, "sandbox-hostdir::fs::write", map[string]any{"sandbox_id": id, "path": "/home/big.bin", "content": rref})
	assert.NilError(t, waitfor.Recv(t, done, waitFor, "the channel writer to finish"))
	assert.Equal(t, wr["bytes_written"], float64(len(big)))
	res, data = readFile("/home/big.bin")
	assert.Check(t, res["body"] == nil)
	assert.Equal(t, res["size"], float64(len(big)))
	assert.Assert(t, bytes.Equal(data, big), "the large file streams back intact")

	// A text file just under the inline limit is inlined; at the limit it
	// is not.
	under := strings.Repeat("x", contract.InlineBodyLimit-1)
	te.MustCall(t, "sandbox-hostdir::fs::write", map[string]any{"sandbox_id": id, "path": "/home/under.txt", "content": under})
	res, data = readFile("/home/under.txt")
	assert.Equal(t, res["body"], under)
	assert.Equal(t, len(data), len(under))
	te.MustCall(t, "sandbox-hostdir::fs::write", map[string]any{"sandbox_id": id, "path": "/home/at.txt", "content": under + "x"})
	res, data = readFile("/home/at.txt")
	assert.Check(t, res["body"] == nil)
	assert.Equal(t, len(data), contract.InlineBodyLimit)

	// A channel ref that cannot be read is the request's fault: S210.
	_, err = te.Call(t, "sandbox-hostdir::fs::write", map[string]any{"sandbox_id": id, "path": "/home/x", "content": rref})
	se := enginetest.SandboxError(t, err)
	assert.Equal(t, se.Code, contract.S210)
	assert.Check(t, is.Contains(se.Message, "cannot be read"))

	// A missing file is the adapter's S211.
	_, err = te.Call(t, "sandbox-hostdir::fs::read", map[string]any{"sandbox_id": id, "path": "/home/missing"})
	assert.Equal(t, enginetest.SandboxError(t, err).Code, contract.S211)
}

// A crashed adapter is relaunched and republished with its new PID.
func TestCrashRelaunch(t *testing.T) {
	te := newEnv(t, Options{})
	st, err := te.start(t, map[string]any{"adapter": "sandbox-hostdir", "path": testBins.Path(t, "sandbox-hostdir"), "config": hostdirConfig(t, nil)})
	assert.NilError(t, err)
	pid := int(st["pid"].(float64))
	assert.NilError(t, syscall.Kill(pid, syscall.SIGKILL))
	pollUntil(t, "relaunched", waitFor, func() bool {
		s, _ := te.host.Lookup("sandbox-hostdir", "default")
		return s.State == StateRunning && s.PID != pid && s.PID != 0
	})
	s, _ := te.host.Lookup("sandbox-hostdir", "default")
	assert.Equal(t, s.Restarts, 1)
	assert.Equal(t, s.LastError, "", "last_error is cleared once running")
	wi := te.MustCall(t, engine.FnWorkersInfo, map[string]any{"name": "sandbox-hostdir"})
	assert.Equal(t, wi["worker"].(map[string]any)["pid"], float64(s.PID), "republished with the new PID")
	run := te.MustCall(t, "sandbox-hostdir::run", map[string]any{"image": "python", "lang": "python", "code": "print(2+2)"})
	assert.Equal(t, run["stdout"], "4\n")
	assert.Check(t, is.Contains(te.Logs.String(), "sandbox adapter died; relaunching"))
}

// An adapter that stops answering (SIGSTOP) fails its health checks and
// is killed and relaunched.
func TestHungAdapterRelaunched(t *testing.T) {
	te := newEnv(t, Options{PingInterval: 100 * time.Millisecond})
	st, err := te.start(t, map[string]any{"adapter": "sandbox-hostdir", "path": testBins.Path(t, "sandbox-hostdir"), "config": hostdirConfig(t, nil)})
	assert.NilError(t, err)
	pid := int(st["pid"].(float64))
	assert.NilError(t, syscall.Kill(pid, syscall.SIGSTOP))
	pollUntil(t, "relaunched after failed health checks", waitFor, func() bool {
		s, _ := te.host.Lookup("sandbox-hostdir", "default")
		return s.State == StateRunning && s.PID != pid && s.PID != 0
	})
	assert.Check(t, is.Contains(te.Logs.String(), "health check failed"))
	run := te.MustCall(t, "sandbox-hostdir::catalog::list", map[string]any{})
	assert.Assert(t, run["images"] != nil)
}

// Close stops adapters in every state and leaves no process behind; the
// Go API reports the same states as engine::adapters::list.
func TestCloseStopsEverything(t *testing.T) {
	te := newEnv(t, Options{})
	for _, ns := range []string{"a", "b"} {
		_, err := te.host.Start(context.Background(), StartRequest{Adapter: "sandbox-hostdir", Namespace: ns, Path: testBins.Path(t, "sandbox-hostdir"),
			Config: mustJSON(t, hostdirConfig(t, nil))})
		assert.NilError(t, err)
	}
	_, err := te.host.Start(context.Background(), StartRequest{Adapter: "sandbox-althost", Path: testBins.Path(t, "sandbox-althost"),
		Config: json.RawMessage(`{"image_allowlist":["python"],"state_dir":"` + t.TempDir() + `"}`)})
	assert.NilError(t, err)
	list := te.host.List()
	assert.Equal(t, len(list), 3)
	assert.Equal(t, list[0].Namespace+"/"+list[0].Adapter, "a/sandbox-hostdir", "sorted by namespace, then name")
	assert.Equal(t, len(adapterProcesses()), 3)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	assert.NilError(t, te.host.Close(ctx))
	assert.Equal(t, len(adapterProcesses()), 0)
	for _, s := range te.host.List() {
		assert.Equal(t, s.State, StateStopped)
	}
	_, err = te.host.Start(ctx, StartRequest{Adapter: "sandbox-hostdir", Path: testBins.Path(t, "sandbox-hostdir")})
	assert.Equal(t, codeOf(err), CodeStopping)
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	assert.NilError(t, err)
	return b
}

// The second test adapter really runs code through its own interpreter
// directory, so swapping adapters by name changes which binary runs it.
func TestAltHostInterpreter(t *testing.T) {
	te := newEnv(t, Options{})
	_, err := te.start(t, map[string]any{"adapter": "sandbox-althost", "path": testBins.Path(t, "sandbox-althost"), "config": hostdirConfig(t, nil)})
	assert.NilError(t, err)
	info := te.MustCall(t, "sandbox-althost::adapter::info", nil)
	dir := info["interpreter_dir"].(string)
	run := te.MustCall(t, "sandbox-althost::run", map[string]any{"image": "python", "lang": "python", "code": "import os; print(os.environ['ALTHOST_VIA'])"})
	assert.Equal(t, run["stdout"], filepath.Join(dir, "python3")+"\n")
}
