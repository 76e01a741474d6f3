package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/procscan"
	"github.com/iii-sandbox/iii/protocol"
)

// The engine assembled from config.yaml carries the plugin host and the
// router: the sandbox: section binds the router and is followed across
// reloads, engine::adapters::start runs an adapter, and stopping the
// engine stops the adapter first.
func TestSandboxRouterFollowsConfig(t *testing.T) {
	bins := t.TempDir()
	hostdir := filepath.Join(bins, "sandbox-hostdir")
	build := exec.Command("go", "build", "-o", hostdir, "github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir/cmd/sandbox-hostdir")
	build.Stderr = os.Stderr
	assert.NilError(t, build.Run())

	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	assert.NilError(t, l.Close())
	listener := fmt.Sprintf("workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\n", port)
	write := func(content string) {
		assert.NilError(t, os.WriteFile(path+".tmp", []byte(content), 0o644))
		assert.NilError(t, os.Rename(path+".tmp", path))
	}
	write(listener + "sandbox:\n  adapter: sandbox-hostdir\n  namespace: tools\n")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := Start(ctx, Options{ConfigPath: path, Logger: hclog.NewNullLogger(), Version: "0.26.0"})
	assert.NilError(t, err)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			<-served
		}
	})

	url := "ws://127.0.0.1:" + strconv.Itoa(port)
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	cl, err := client.Dial(cctx, url, client.Options{Name: "sbx-test", IgnoreEnv: true, Token: s.engineToken(), Reconnect: client.ReconnectPolicy{Disable: true}})
	assert.NilError(t, err)
	defer cl.Close(context.Background())
	code := func(fn string, payload any) (string, string) {
		_, err := cl.Call(cctx, fn, payload)
		var eb *protocol.ErrorBody
		if !errors.As(err, &eb) {
			return "", fmt.Sprint(err)
		}
		se, ok := contract.FromErrorBody(eb)
		if !ok {
			return eb.Code, eb.Message
		}
		return string(se.Code), se.Message
	}

	c, msg := code("sandbox::list", map[string]any{})
	assert.Equal(t, c, "S301")
	assert.Check(t, is.Contains(msg, `namespace "tools"`))
	assert.Check(t, is.Contains(msg, "--engine "+url), "the hint names this engine")

	cfg := map[string]any{"image_allowlist": []string{"python"}, "state_dir": t.TempDir()}
	out, err := cl.Call(cctx, "engine::adapters::start", map[string]any{"adapter": "sandbox-hostdir", "namespace": "tools", "path": hostdir, "config": cfg})
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(out), `"state":"running"`))
	assert.Assert(t, s.PluginHost().Hosted("sandbox-hostdir", "tools"))
	out, err = cl.Call(cctx, "sandbox::run", map[string]any{"image": "python", "lang": "python", "code": "print(2+2)"})
	assert.NilError(t, err)
	var run map[string]any
	assert.NilError(t, json.Unmarshal(out, &run))
	assert.Equal(t, run["stdout"], "4\n")

	waitCode := func(want, in string) {
		t.Helper()
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			c, msg := code("sandbox::list", map[string]any{})
			if c == want && bytes.Contains([]byte(msg), []byte(in)) {
				return poll.Success()
			}
			return poll.Continue("sandbox::list gives %s %s", c, msg)
		}, poll.WithTimeout(30*time.Second), poll.WithDelay(50*time.Millisecond))
	}
	write(listener + "sandbox:\n  adapter: sandbox-hostdir\n  namespace: other\n")
	waitCode("S301", `namespace "other"`)
	write(listener)
	waitCode("S303", "sandbox:")
	// Compose's API wins over the file.
	assert.NilError(t, s.Router().Bind("sandbox-hostdir", "tools"))
	_, err = cl.Call(cctx, "sandbox::list", map[string]any{})
	assert.NilError(t, err)

	cancel()
	assert.NilError(t, <-served)
	stopped = true
	assert.Equal(t, len(procscan.Naming(bins+"/")), 0, "no adapter process outlives the engine")
}

// A bare engine never starts the adapter its sandbox: section binds, even
// when the binary is installed where the plugin host looks: until someone
// starts it there (Compose, or engine::adapters::start), sandbox::* calls
// fail with S301 naming the namespace, as the 0.26 upgrade guide says. The
// adapter stops with the engine.
func TestBoundAdapterIsNotStartedByTheEngine(t *testing.T) {
	bins := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bins, "sandbox-hostdir"), "github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir/cmd/sandbox-hostdir")
	build.Stderr = os.Stderr
	assert.NilError(t, build.Run())
	t.Setenv("III_PLUGIN_PATH", bins)
	t.Setenv("III_STATE_DIR", t.TempDir()) // hostdir's sandboxes, with no state_dir configured

	path := filepath.Join(t.TempDir(), "config.yaml")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	assert.NilError(t, l.Close())
	content := fmt.Sprintf("workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\nsandbox:\n  adapter: sandbox-hostdir\n", port)
	assert.NilError(t, os.WriteFile(path, []byte(content), 0o644))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := Start(ctx, Options{ConfigPath: path, Logger: hclog.NewNullLogger(), Version: "0.26.0"})
	assert.NilError(t, err)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()

	// Nothing starts it: the call fails S301 and names the namespace.
	time.Sleep(500 * time.Millisecond)
	_, err = s.Engine().Invoke(ctx, "", "sandbox::catalog::list", json.RawMessage(`{}`))
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, "S301")
	assert.Check(t, is.Contains(eb.Message, "default"))
	_, started := s.PluginHost().Lookup("sandbox-hostdir", "default")
	assert.Check(t, !started, "the engine started the adapter by itself")

	// Started explicitly, it serves the router.
	_, err = s.Engine().Invoke(ctx, "", "engine::adapters::start", json.RawMessage(`{"adapter":"sandbox-hostdir","namespace":"default","config":{"image_allowlist":["python"]}}`))
	assert.NilError(t, err)
	out, err := s.Engine().Invoke(ctx, "", "sandbox::catalog::list", json.RawMessage(`{}`))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(out), `"python"`))

	// Its configuration is the in-memory entry <namespace>-<adapter>:
	// readable, never stored with configuration::set.
	out, err = s.Engine().Invoke(ctx, "", "configuration::get", json.RawMessage(`{"id":"default-sandbox-hostdir","raw":true}`))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(out), `"image_allowlist":["python"]`))
	_, err = s.Engine().Invoke(ctx, "", "configuration::set", json.RawMessage(`{"id":"default-sandbox-hostdir","value":{}}`))
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, "NOT_REGISTERED")

	cancel()
	assert.NilError(t, <-served)
	assert.Equal(t, len(procscan.Naming(bins+"/")), 0, "no adapter process outlives the engine")
}
