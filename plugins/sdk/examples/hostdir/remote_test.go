package hostdir_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/enginetoken"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/plugins/sdk"
	"github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir"
	"github.com/iii-sandbox/iii/plugins/sdk/sdktest"
	"github.com/iii-sandbox/iii/protocol"
)

// TestRemote runs sandbox-hostdir as a remote adapter: a real engine
// process (iii with config.yaml binding sandbox: {adapter:
// sandbox-hostdir} and nothing installed for the plugin host to start),
// and the adapter binary as a separate process connected to it over
// WebSocket with the engine token in a credential file. The conformance
// suite runs through sandbox::* on the engine, file contents through
// channels; then the adapter is killed (S301) and started again (calls
// work again), and an adapter with a wrong token cannot join.
func TestRemote(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds iii and the adapter and runs the conformance suite through a real engine")
	}
	dir := t.TempDir()
	iii, adapterBin := buildEngineAndAdapter(t, dir)

	token, err := enginetoken.New()
	assert.NilError(t, err)
	engProc := startEngineProcess(t, iii, filepath.Join(dir, "home"), token)
	eng := engProc.url()
	cred := filepath.Join(dir, "credential")
	assert.NilError(t, os.WriteFile(cred, []byte(token+"\n"), 0o600))

	caller := dialCaller(t, eng, token)
	ad := &adapters{t: t, bin: adapterBin, url: eng, cred: cred, caller: caller, state: t.TempDir()}
	t.Cleanup(ad.stop)

	t.Run("conformance through sandbox::*", func(t *testing.T) {
		sdktest.Run(t, sdktest.Target{
			Image: "shell",
			Start: func(t *testing.T, config map[string]any) sdktest.Caller {
				ad.start(t, config)
				return caller
			},
			DenyPath: func(ctx context.Context, t *testing.T, c sdktest.Caller, id string) string {
				_, err := c.Call(ctx, contract.OpExec, map[string]any{"sandbox_id": id, "argv": []string{"ln", "-s", "/", "escape"}})
				if err != nil {
					t.Fatalf("make a symbolic link out of the sandbox: %v", err)
				}
				return "/home/escape/tmp/sdktest-denied"
			},
		})
	})

	t.Run("adapter::info reports the host name", func(t *testing.T) {
		host := ad.start(t, map[string]any{"image_allowlist": []string{"shell"}})
		raw, err := caller.Call(context.Background(), contract.OpAdapterInfo, nil)
		assert.NilError(t, err)
		var info contract.AdapterInfo
		assert.NilError(t, json.Unmarshal(raw, &info))
		assert.Equal(t, info.Facts[sdk.HostNameFactKey], host)
		assert.Equal(t, info.Adapter, hostdir.Name)
	})

	t.Run("kill -9 is S301, a restart serves again", func(t *testing.T) {
		cfg := map[string]any{"image_allowlist": []string{"shell"}}
		ad.start(t, cfg)
		ctx := context.Background()
		_, err := caller.Call(ctx, contract.OpCreate, map[string]any{"image": "shell"})
		assert.NilError(t, err)
		ad.kill9(t)
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			_, err := caller.Call(ctx, contract.OpList, map[string]any{})
			if contract.IsCode(err, contract.S301) {
				return poll.Success()
			}
			return poll.Continue("sandbox::list after kill -9: %v", err)
		}, poll.WithTimeout(10*time.Second), poll.WithDelay(20*time.Millisecond))

		ad.start(t, cfg)
		raw, err := caller.Call(ctx, contract.OpCreate, map[string]any{"image": "shell"})
		assert.NilError(t, err)
		var created contract.CreateResponse
		assert.NilError(t, json.Unmarshal(raw, &created))
		_, err = caller.Call(ctx, contract.OpExec, map[string]any{"sandbox_id": created.SandboxID, "cmd": "true"})
		assert.NilError(t, err)
	})

	t.Run("a sandbox host credential serves as the adapter", func(t *testing.T) {
		raw, err := caller.c.Call(context.Background(), "engine::credentials::issue", map[string]any{
			"label": "hosts/host-cred", "namespace": "default",
			"sandbox_host": map[string]any{"adapter": hostdir.Name, "host_name": "host-cred"}})
		assert.NilError(t, err)
		var issued struct{ Token string }
		assert.NilError(t, json.Unmarshal(raw, &issued))
		hostCred := filepath.Join(t.TempDir(), "credential")
		assert.NilError(t, os.WriteFile(hostCred, []byte(issued.Token), 0o600))
		engineCred := ad.cred
		ad.cred = hostCred
		defer func() { ad.cred = engineCred }()
		ad.start(t, map[string]any{"image_allowlist": []string{"shell"}})
		ctx := context.Background()
		raw, err = caller.Call(ctx, contract.OpCreate, map[string]any{"image": "shell"})
		assert.NilError(t, err)
		var created contract.CreateResponse
		assert.NilError(t, json.Unmarshal(raw, &created))
		_, err = caller.Call(ctx, contract.OpExec, map[string]any{"sandbox_id": created.SandboxID, "cmd": "true"})
		assert.NilError(t, err)
	})

	t.Run("the engine restarts: the adapter reconnects and registers again", func(t *testing.T) {
		host := ad.start(t, map[string]any{"image_allowlist": []string{"shell"}})
		engProc.stop()
		engProc.start(t)
		// The caller does not reconnect (its policy is off); a new one.
		c2 := dialCaller(t, eng, token)
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			raw, err := c2.Call(context.Background(), contract.OpAdapterInfo, nil)
			if err != nil {
				return poll.Continue("adapter::info after the engine restarted: %v", err)
			}
			var info contract.AdapterInfo
			if err := json.Unmarshal(raw, &info); err != nil || info.Facts[sdk.HostNameFactKey] != host {
				return poll.Error(fmt.Errorf("adapter::info answered by another adapter: %s", raw))
			}
			return poll.Success()
		}, poll.WithTimeout(time.Minute), poll.WithDelay(100*time.Millisecond))
		_, err := c2.Call(context.Background(), contract.OpCatalogList, map[string]any{})
		assert.NilError(t, err)
		select {
		case <-ad.done:
			t.Fatal("the adapter exited instead of reconnecting")
		default:
		}
	})

	t.Run("a wrong token cannot join", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "credential")
		assert.NilError(t, os.WriteFile(bad, []byte("not-the-token"), 0o600))
		var logs syncbuf.Buffer
		cmd := exec.Command(adapterBin, "serve", "--engine", eng, "--credential-file", bad, "--host-name", "intruder")
		cmd.Env = append(os.Environ(), hostdir.EnvStateDir+"="+t.TempDir())
		cmd.Stdout, cmd.Stderr = &logs, &logs
		assert.NilError(t, cmd.Start())
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			var ee *exec.ExitError
			assert.Assert(t, errors.As(err, &ee), "the adapter must exit non-zero: %v\n%s", err, logs.String())
			assert.Equal(t, ee.ExitCode(), sdk.ExitAuthRejected, logs.String())
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			waitfor.Recv(t, done, waitfor.Default, "the killed adapter to be reaped")
			t.Fatalf("the adapter with a wrong token did not exit:\n%s", logs.String())
		}
		assert.Assert(t, strings.Contains(logs.String(), "AUTH_ERROR"), logs.String())
	})
}

// engineProc is iii run as a process on a fixed loopback port with
// sandbox: bound to sandbox-hostdir.
type engineProc struct {
	t                *testing.T
	iii, home, token string
	addr             string
	cmd              *exec.Cmd
	done             chan struct{}
	logs             *syncbuf.Buffer
}

// startEngineProcess runs iii on a free loopback port and stops it when
// the test ends.
// buildEngineAndAdapter builds iii and sandbox-hostdir into dir, each in a
// directory of its own: the engine's plugin host finds no adapter beside
// it (and HOME is empty), so a binding is served by remote adapters only.
func buildEngineAndAdapter(t *testing.T, dir string) (iii, adapterBin string) {
	t.Helper()
	iii = filepath.Join(dir, "engine", "iii")
	adapterBin = filepath.Join(dir, "adapter", "sandbox-hostdir")
	var wg sync.WaitGroup
	var errs [2]error
	var outs [2][]byte
	for i, b := range []struct{ out, pkg string }{{iii, "github.com/iii-sandbox/iii/cmd/iii"}, {adapterBin, "./cmd/sandbox-hostdir"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = bins.GoBuild(b.out, b.pkg, nil)
		}()
	}
	wg.Wait()
	for i := range errs {
		assert.NilError(t, errs[i], string(outs[i]))
	}
	return iii, adapterBin
}

func startEngineProcess(t *testing.T, iii, home, token string, sandboxExtra ...string) *engineProc {
	t.Helper()
	assert.NilError(t, os.MkdirAll(home, 0o700))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	assert.NilError(t, l.Close())
	cfg := fmt.Sprintf("workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\nsandbox:\n  adapter: %s\n", port, hostdir.Name)
	for _, line := range sandboxExtra {
		cfg += "  " + line + "\n"
	}
	assert.NilError(t, os.WriteFile(filepath.Join(home, "config.yaml"), []byte(cfg), 0o644))
	e := &engineProc{t: t, iii: iii, home: home, token: token, addr: fmt.Sprintf("127.0.0.1:%d", port)}
	t.Cleanup(func() {
		if t.Failed() && e.logs != nil {
			t.Logf("engine log:\n%s", e.logs.Tail(200))
		}
		e.stop()
	})
	e.start(t)
	return e
}

func (e *engineProc) url() string { return "ws://" + e.addr }

// start runs the engine and waits until it accepts connections.
func (e *engineProc) start(t *testing.T) {
	t.Helper()
	e.logs = &syncbuf.Buffer{}
	e.cmd = exec.Command(e.iii, "-c", filepath.Join(e.home, "config.yaml"))
	e.cmd.Dir = e.home
	e.cmd.Env = append(os.Environ(), "HOME="+e.home, "III_ENGINE_TOKEN="+e.token, "III_PLUGIN_PATH=")
	e.cmd.Stdout, e.cmd.Stderr = e.logs, e.logs
	assert.NilError(t, e.cmd.Start())
	e.done = make(chan struct{})
	cmd, done, logs := e.cmd, e.done, e.logs
	go func() { _ = cmd.Wait(); close(done) }()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case <-done:
			return poll.Error(fmt.Errorf("the engine exited:\n%s", logs.String()))
		default:
		}
		c, err := net.Dial("tcp", e.addr)
		if err != nil {
			return poll.Continue("%v", err)
		}
		_ = c.Close()
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(20*time.Millisecond))
}

// stop interrupts the engine and waits for it.
func (e *engineProc) stop() {
	if e.cmd == nil {
		return
	}
	_ = e.cmd.Process.Signal(os.Interrupt)
	select {
	case <-e.done:
	case <-time.After(15 * time.Second):
		_ = e.cmd.Process.Kill()
		waitfor.Closed(e.t, e.done, waitfor.Default, "the killed engine to be reaped")
	}
	e.cmd = nil
}

// adapters runs the remote adapter process, one at a time.
type adapters struct {
	t           *testing.T
	bin, url    string
	cred, state string
	caller      *engineCaller

	n    int
	cmd  *exec.Cmd
	done chan struct{}
	logs *syncbuf.Buffer
}

// start stops the running adapter, starts a new one with config, and
// waits until the engine routes sandbox::* to it. It returns the new
// adapter's host name.
func (a *adapters) start(t *testing.T, config map[string]any) string {
	t.Helper()
	a.stop()
	a.n++
	host := fmt.Sprintf("host-%d", a.n)
	raw, err := json.Marshal(config)
	assert.NilError(t, err)
	cfgFile := filepath.Join(t.TempDir(), "config.json")
	assert.NilError(t, os.WriteFile(cfgFile, raw, 0o600))
	a.logs = &syncbuf.Buffer{}
	a.cmd = exec.Command(a.bin, "serve", "--engine", a.url, "--credential-file", a.cred, "--host-name", host, "--config-file", cfgFile)
	a.cmd.Env = append(os.Environ(), hostdir.EnvStateDir+"="+a.state)
	a.cmd.Stdout, a.cmd.Stderr = a.logs, a.logs
	assert.NilError(t, a.cmd.Start())
	a.done = make(chan struct{})
	cmd, done, logs := a.cmd, a.done, a.logs
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("adapter %s log:\n%s", host, logs.Tail(100))
		}
	})
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case <-done:
			return poll.Error(fmt.Errorf("the adapter exited:\n%s", logs.String()))
		default:
		}
		raw, err := a.caller.Call(context.Background(), contract.OpAdapterInfo, nil)
		if err != nil {
			return poll.Continue("adapter::info: %v", err)
		}
		var info contract.AdapterInfo
		if err := json.Unmarshal(raw, &info); err != nil || info.Facts[sdk.HostNameFactKey] != host {
			return poll.Continue("adapter::info answered by another adapter: %s", raw)
		}
		if _, err := a.caller.Call(context.Background(), contract.OpCatalogList, map[string]any{}); err != nil {
			return poll.Continue("sandbox::catalog::list: %v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(50*time.Millisecond))
	return host
}

// stop ends the running adapter with SIGTERM, as a supervisor would.
func (a *adapters) stop() {
	if a.cmd == nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
		if code := a.cmd.ProcessState.ExitCode(); code != sdk.ExitOK {
			a.t.Errorf("the adapter exited with %d after SIGTERM, want %d:\n%s", code, sdk.ExitOK, a.logs.Tail(50))
		}
	case <-time.After(20 * time.Second):
		a.t.Errorf("the adapter did not stop on SIGTERM:\n%s", a.logs.Tail(50))
		_ = a.cmd.Process.Kill()
		waitfor.Closed(a.t, a.done, waitfor.Default, "the killed adapter to be reaped")
	}
	a.cmd = nil
}

func (a *adapters) kill9(t *testing.T) {
	t.Helper()
	assert.NilError(t, a.cmd.Process.Kill())
	waitfor.Closed(t, a.done, waitfor.Default, "the adapter killed with SIGKILL to be reaped")
	a.cmd = nil
}

// engineCaller is the suite's Caller through the engine: sandbox::<op>
// (adapter::info straight to the adapter's own function, which the router
// does not forward), file contents through the engine's channels.
type engineCaller struct {
	c  *client.Client
	mu sync.Mutex
	// writers still feeding channels nobody read, closed at the end.
	writers []*client.ChannelWriter
}

var (
	_ sdktest.Caller   = (*engineCaller)(nil)
	_ sdktest.Channels = (*engineCaller)(nil)
)

func dialCaller(t *testing.T, url, token string) *engineCaller {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The caller holds the engine token: it issues the host credential.
	c, err := client.Dial(ctx, url, client.Options{Name: "remote-test-caller", IgnoreEnv: true, Token: token,
		Reconnect: client.ReconnectPolicy{Disable: true}, CallTimeout: 5 * time.Minute})
	assert.NilError(t, err)
	ec := &engineCaller{c: c}
	t.Cleanup(func() {
		ec.mu.Lock()
		for _, w := range ec.writers {
			_ = w.Close()
		}
		ec.mu.Unlock()
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		_ = c.Close(cctx)
	})
	return ec
}

func (e *engineCaller) Call(ctx context.Context, op string, payload any) (json.RawMessage, error) {
	fn := contract.RouterFunctionID(op)
	if op == contract.OpAdapterInfo {
		fn = contract.AdapterFunctionID(hostdir.Name, op)
	}
	if payload == nil {
		payload = map[string]any{}
	}
	raw, err := e.c.Call(ctx, fn, payload)
	var eb *protocol.ErrorBody
	if errors.As(err, &eb) {
		if se, ok := contract.FromErrorBody(eb); ok {
			return nil, se
		}
	}
	return raw, err
}

func (e *engineCaller) ReadChannel(ctx context.Context, ref protocol.StreamChannelRef) ([]byte, error) {
	r, err := e.c.OpenChannelReader(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

func (e *engineCaller) WriteChannel(ctx context.Context, data []byte) (protocol.StreamChannelRef, error) {
	wref, rref, err := e.c.CreateChannel(ctx, 0)
	if err != nil {
		return rref, err
	}
	w, err := e.c.OpenChannelWriter(ctx, wref)
	if err != nil {
		return rref, err
	}
	e.mu.Lock()
	e.writers = append(e.writers, w)
	e.mu.Unlock()
	go func() {
		if _, err := w.Write(data); err == nil {
			_ = w.Close()
		}
	}()
	return rref, nil
}
