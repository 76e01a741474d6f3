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
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/internal/testkit/procscan"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// The engine assembled from config.yaml carries the plugin host and the
// router: the sandbox: section binds the router and is followed across
// reloads, engine::adapters::start runs an adapter, and stopping the
// engine stops the adapter first.
func TestSandboxRouterFollowsConfig(t *testing.T) {
	t.Parallel()
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
	s, err := Start(ctx, Options{ConfigPath: path, Logger: hclog.NewNullLogger(), Version: "0.26.0", LookupEnv: lookupIn(engineEnv(t))})
	assert.NilError(t, err)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			waitfor.Recv(t, served, waitfor.Default, "the server to stop")
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
	assert.NilError(t, waitfor.Recv(t, served, waitfor.Default, "the server to stop"))
	stopped = true
	assert.Equal(t, len(procscan.Naming(bins+"/")), 0, "no adapter process outlives the engine")
}

// A bare engine starts the adapter its sandbox: section binds, found by
// name where the plugin host looks, with sandbox.config: sandbox::run works
// with no other call. A reload that changes only what the running adapter
// can change live applies it in place; one that changes more restarts it; an
// explicit engine::adapters::start (Compose's) takes it over, and the
// engine then leaves it alone; an adapter that is not installed is no
// error, its calls answer S301 with how to install and start it. The
// adapter stops with the engine.
func TestBoundAdapterIsStartedByTheEngine(t *testing.T) {
	t.Parallel()
	bins := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bins, "sandbox-hostdir"), "github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir/cmd/sandbox-hostdir")
	build.Stderr = os.Stderr
	assert.NilError(t, build.Run())
	home := t.TempDir()
	finder := pluginhost.Finder{
		Getenv: func(k string) string {
			if k == pluginhost.EnvPluginPath {
				return bins
			}
			return ""
		},
		HomeDir:    func() (string, error) { return home, nil },
		Executable: func() (string, error) { return filepath.Join(home, "iii"), nil },
	}

	path := filepath.Join(t.TempDir(), "config.yaml")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	assert.NilError(t, l.Close())
	state := t.TempDir()
	file := func(sandbox string) string {
		return fmt.Sprintf("workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\n%s", port, sandbox)
	}
	write := func(content string) {
		assert.NilError(t, os.WriteFile(path+".tmp", []byte(content), 0o644))
		assert.NilError(t, os.Rename(path+".tmp", path))
	}
	bound := func(adapter, images string) string {
		return fmt.Sprintf("sandbox:\n  adapter: %s\n  config:\n    image_allowlist: [%s]\n    state_dir: %s\n", adapter, images, state)
	}
	write(file(bound("sandbox-hostdir", "python")))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A comeback delay short enough to wait past, long enough for a stop
	// followed by a start to be well within it.
	const comeback = 2 * time.Second
	s, err := Start(ctx, Options{ConfigPath: path, Logger: hclog.NewNullLogger(), Version: "0.26.0", Finder: finder, comebackDelay: comeback, LookupEnv: lookupIn(engineEnv(t))})
	assert.NilError(t, err)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	invoke := func(fn, payload string) (json.RawMessage, error) {
		return s.Engine().Invoke(ctx, "", fn, json.RawMessage(payload))
	}
	type status struct {
		Adapter   string `json:"adapter"`
		State     string `json:"state"`
		PID       int    `json:"pid"`
		StartedBy string `json:"started_by"`
	}
	list := func() []status {
		out, err := invoke("engine::adapters::list", `{}`)
		assert.NilError(t, err)
		var l struct {
			Adapters []status `json:"adapters"`
		}
		assert.NilError(t, json.Unmarshal(out, &l))
		return l.Adapters
	}
	// The engine applies a reload once it has read the file: wait for it.
	applied := func(want string) {
		t.Helper()
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if c := s.Sandbox(); c != nil && c.Config == want {
				return poll.Success()
			}
			return poll.Continue("config.yaml not applied yet")
		}, poll.WithTimeout(30*time.Second), poll.WithDelay(50*time.Millisecond))
	}

	// No other call: the engine runs it.
	out, err := invoke("sandbox::run", `{"image":"python","lang":"python","code":"print(2+2)"}`)
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(out), `"stdout":"4\n"`))
	first := list()
	assert.Assert(t, is.Len(first, 1))
	assert.Check(t, is.Equal(first[0].State, "running"))
	assert.Check(t, is.Equal(first[0].StartedBy, "config.yaml"))

	// Its configuration is the in-memory entry <namespace>-<adapter>:
	// readable, never stored with configuration::set.
	out, err = invoke("configuration::get", `{"id":"default-sandbox-hostdir","raw":true}`)
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(out), `"image_allowlist":["python"]`))
	_, err = invoke("configuration::set", `{"id":"default-sandbox-hostdir","value":{}}`)
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, "NOT_REGISTERED")

	// A changed config the adapter can take live (a limit, the
	// allowlist) is applied to the running adapter: the same process, a
	// sandbox created before is still there, and the new limit applies.
	appliedWith := func(sub string) {
		t.Helper()
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if c := s.Sandbox(); c != nil && strings.Contains(c.Config, sub) {
				return poll.Success()
			}
			return poll.Continue("config.yaml not applied yet")
		}, poll.WithTimeout(30*time.Second), poll.WithDelay(50*time.Millisecond))
	}
	write(file(bound("sandbox-hostdir", "python") + "    max_concurrent_sandboxes: 1\n"))
	appliedWith(`"max_concurrent_sandboxes":1`)
	out, err = invoke("sandbox::create", `{"image":"python"}`)
	assert.NilError(t, err)
	var created struct {
		SandboxID string `json:"sandbox_id"`
	}
	assert.NilError(t, json.Unmarshal(out, &created))
	_, err = invoke("sandbox::create", `{"image":"python"}`)
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, "S400")
	write(file(bound("sandbox-hostdir", "python, node") + "    max_concurrent_sandboxes: 2\n"))
	appliedWith(`"max_concurrent_sandboxes":2`)
	second := list()
	assert.Assert(t, is.Len(second, 1))
	assert.Check(t, second[0].State == "running" && second[0].PID == first[0].PID, "reloaded in place: %+v", second[0])
	out, err = invoke("sandbox::exec", fmt.Sprintf(`{"sandbox_id":%q,"cmd":"echo","args":["kept"]}`, created.SandboxID))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(out), "kept"))
	_, err = invoke("sandbox::create", `{"image":"node"}`)
	assert.NilError(t, err, "the raised limit and the new allowlist apply")
	out, err = invoke("configuration::get", `{"id":"default-sandbox-hostdir","raw":true}`)
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(out), `"image_allowlist":["python","node"]`))

	// A changed key the adapter cannot take live (hostdir's state_dir)
	// restarts it with the new configuration; still one adapter.
	state = t.TempDir()
	write(file(bound("sandbox-hostdir", "python, node")))
	applied(fmt.Sprintf(`{"image_allowlist":["python","node"],"state_dir":%q}`, state))
	second = list()
	assert.Assert(t, is.Len(second, 1))
	assert.Check(t, second[0].State == "running" && second[0].PID != first[0].PID, "%+v", second[0])

	// A changed heartbeat is the engine's business: the adapter runs on.
	write(file(bound("sandbox-hostdir", "python, node") + "  host_heartbeat_ms: 1000\n"))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if c := s.Sandbox(); c != nil && c.HostHeartbeatMS == 1000 {
			return poll.Success()
		}
		return poll.Continue("config.yaml not applied yet")
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(50*time.Millisecond))
	third := list()
	assert.Assert(t, is.Len(third, 1))
	assert.Check(t, third[0].State == "running" && third[0].PID == second[0].PID, "%+v", third[0])

	// Another namespace: the old adapter stops and leaves the list.
	write(file(strings.Replace(bound("sandbox-hostdir", "python"), "sandbox:\n", "sandbox:\n  namespace: other\n", 1)))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if c := s.Sandbox(); c != nil && c.Namespace == "other" {
			return poll.Success()
		}
		return poll.Continue("config.yaml not applied yet")
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(50*time.Millisecond))
	moved := list()
	assert.Assert(t, is.Len(moved, 1), "%+v", moved)
	assert.Check(t, moved[0].State == "running" && moved[0].PID != second[0].PID, "%+v", moved[0])
	_, err = invoke("sandbox::catalog::list", `{}`)
	assert.NilError(t, err)
	write(file(bound("sandbox-hostdir", "python, node")))
	applied(fmt.Sprintf(`{"image_allowlist":["python","node"],"state_dir":%q}`, state))
	assert.Assert(t, is.Len(list(), 1))

	// An explicit start (what Compose does) takes it over, with no
	// ADAPTER_ALREADY_STARTED; the engine leaves it alone from then on.
	out, err = invoke("engine::adapters::start", fmt.Sprintf(`{"adapter":"sandbox-hostdir","config":{"image_allowlist":["node"],"state_dir":%q}}`, state))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(out), `"started_by":"call"`))
	taken := list()
	assert.Assert(t, is.Len(taken, 1))
	write(file(bound("sandbox-hostdir", "python")))
	applied(fmt.Sprintf(`{"image_allowlist":["python"],"state_dir":%q}`, state))
	assert.DeepEqual(t, list(), taken)

	// A stop followed by a start (compose::restart) is left alone.
	_, err = invoke("engine::adapters::stop", `{"adapter":"sandbox-hostdir"}`)
	assert.NilError(t, err)
	_, err = invoke("engine::adapters::start", fmt.Sprintf(`{"adapter":"sandbox-hostdir","config":{"image_allowlist":["node"],"state_dir":%q}}`, state))
	assert.NilError(t, err)
	// Nothing to await: what is checked is that nothing happens, so wait
	// past the comeback delay that would make it happen.
	time.Sleep(comeback + time.Second)
	assert.Check(t, is.Equal(list()[0].StartedBy, "call"), "a restart was taken back")

	// When the one that took it over stops for good (Compose's --down),
	// the engine starts config.yaml's again, with config.yaml's config.
	_, err = invoke("engine::adapters::stop", `{"adapter":"sandbox-hostdir"}`)
	assert.NilError(t, err)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		l := list()
		if len(l) == 1 && l[0].State == "running" && l[0].StartedBy == "config.yaml" {
			return poll.Success()
		}
		return poll.Continue("adapters %+v", l)
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(50*time.Millisecond))
	out, err = invoke("sandbox::run", `{"image":"python","lang":"python","code":"print(2+2)"}`)
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(out), `"stdout":"4\n"`))
	// Stopping the engine's own leaves it stopped.
	_, err = invoke("engine::adapters::stop", `{"adapter":"sandbox-hostdir"}`)
	assert.NilError(t, err)
	// As above: past the delay after which a comeback would have started it.
	time.Sleep(comeback + time.Second)
	assert.Check(t, is.Equal(list()[0].State, "stopped"), "the engine's own adapter, stopped, was started again")

	// Not installed: no error, S301 saying how to install and start it.
	write(file(bound("sandbox-missing", "python")))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if c := s.Sandbox(); c != nil && c.Adapter == "sandbox-missing" {
			return poll.Success()
		}
		return poll.Continue("config.yaml not applied yet")
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(50*time.Millisecond))
	_, err = invoke("sandbox::catalog::list", `{}`)
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, "S301")
	assert.Check(t, is.Contains(eb.Message, "is not installed"))
	assert.Check(t, is.Contains(eb.Message, filepath.Join(bins, "sandbox-missing")), "it says where it looked")
	assert.Check(t, is.Contains(eb.Message, `iii call engine::adapters::start --json '{\"adapter\":\"sandbox-missing\",\"namespace\":\"default\",\"config\":{`))

	cancel()
	assert.NilError(t, waitfor.Recv(t, served, waitfor.Default, "the server to stop"))
	assert.Equal(t, len(procscan.Naming(bins+"/")), 0, "no adapter process outlives the engine")
}
