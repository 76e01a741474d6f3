//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/enginetoken"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/netns"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/protocol"
)

// vmHost is one sandbox host of the fleet: sandbox-libkrun serve --fleet
// in a network namespace of its own.
type vmHost struct {
	name string
	ns   *netns.Host
	cmd  *exec.Cmd
	done chan struct{}
	logs *syncbuf.Buffer
}

// TestFleetAcrossNetworkNamespaces: three sandbox hosts, each
// sandbox-libkrun with real VMs in a network namespace of its own that
// reaches the engine (in this namespace) over a veth link only, with its
// own sandbox host credential; the engine binds sandbox: {hosts: '*'}.
// Twelve sandboxes spread over the three, and exec, fs and stop on each
// reach the host that holds it; kill -9 of one host's adapter makes its
// sandboxes answer S301 naming it within a second while the others keep
// working and new creates land on the two that remain; a partition of
// another host (its link down) behaves the same, and healing the link
// brings it back with its sandboxes; a host without a valid credential
// cannot join.
func TestFleetAcrossNetworkNamespaces(t *testing.T) {
	e := needVMs(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	dir := t.TempDir()
	iii := filepath.Join(dir, "iii")
	if out, err := bins.GoBuild(iii, "github.com/iii-sandbox/iii/cmd/iii", nil); err != nil {
		t.Fatalf("build iii: %v\n%s", err, out)
	}
	names := []string{"h1", "h2", "h3"}
	spaces := map[string]*netns.Host{}
	for _, n := range names {
		spaces[n] = netns.Start(t)
	}

	// The engine: a loopback listener for this test, and one on each
	// namespace's link (a listener beyond loopback requires a token or a
	// credential from every connection).
	l, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	assert.NilError(t, l.Close())
	cfg := fmt.Sprintf("workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\n", port)
	for _, n := range names {
		cfg += fmt.Sprintf("  - name: iii-worker-manager#%s\n    config: { host: %s, port: %d }\n", n, spaces[n].Gateway, port)
	}
	// A heartbeat of 200 ms cuts a silent host within 600 ms.
	cfg += "sandbox:\n  adapter: sandbox-libkrun\n  hosts: '*'\n  host_heartbeat_ms: 200\n"
	home := filepath.Join(dir, "home")
	assert.NilError(t, os.MkdirAll(home, 0o700))
	assert.NilError(t, os.WriteFile(filepath.Join(home, "config.yaml"), []byte(cfg), 0o600))
	token, err := enginetoken.New()
	assert.NilError(t, err)
	engLogs := &syncbuf.Buffer{}
	eng := exec.Command(iii, "-c", filepath.Join(home, "config.yaml"))
	eng.Dir, eng.Env = home, append(os.Environ(), "HOME="+home, "III_ENGINE_TOKEN="+token, "III_PLUGIN_PATH=")
	eng.Stdout, eng.Stderr = engLogs, engLogs
	assert.NilError(t, eng.Start())
	engDone := make(chan struct{})
	go func() { _ = eng.Wait(); close(engDone) }()
	t.Cleanup(func() {
		_ = eng.Process.Kill()
		waitfor.Closed(t, engDone, waitfor.Default, "the killed engine to be reaped")
		if t.Failed() {
			t.Logf("engine log:\n%s", engLogs.Tail(80))
		}
	})
	ctx := context.Background()
	var caller *client.Client
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		c, err := client.Dial(dctx, fmt.Sprintf("ws://127.0.0.1:%d", port), client.Options{Name: "fleet-test", IgnoreEnv: true, Token: token,
			Reconnect: client.ReconnectPolicy{Disable: true}, CallTimeout: callTimeout})
		if err != nil {
			return poll.Continue("engine: %v", err)
		}
		caller = c
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(100*time.Millisecond))
	t.Cleanup(func() { _ = caller.Close(context.Background()) })
	call := func(fn string, payload any) (json.RawMessage, error) {
		out, err := caller.Call(ctx, fn, payload)
		var eb *protocol.ErrorBody
		if errors.As(err, &eb) {
			if se, ok := contract.FromErrorBody(eb); ok {
				return nil, se
			}
		}
		return out, err
	}

	hosts := map[string]*vmHost{}
	start := func(name, credential string) *vmHost {
		t.Helper()
		cred := filepath.Join(dir, name+".credential")
		assert.NilError(t, os.WriteFile(cred, []byte(credential), 0o600))
		h := &vmHost{name: name, ns: spaces[name], logs: &syncbuf.Buffer{}, done: make(chan struct{})}
		engineURL := fmt.Sprintf("ws://%s:%d", spaces[name].Gateway, port)
		h.cmd = exec.Command("ip", "netns", "exec", spaces[name].Name, e.bin, "serve", "--engine", engineURL,
			"--credential-file", cred, "--host-name", name, "--fleet", "--config-file", filepath.Join(dir, name+".json"))
		h.cmd.Env = os.Environ()
		h.cmd.Stdout, h.cmd.Stderr = h.logs, h.logs
		assert.NilError(t, h.cmd.Start())
		cmd, done := h.cmd, h.done
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			waitfor.Closed(t, done, waitfor.Default, "the killed host "+name+" to be reaped")
			if t.Failed() {
				t.Logf("host %s log:\n%s", name, h.logs.Tail(60))
			}
		})
		return h
	}
	for _, n := range names {
		raw, err := call("engine::credentials::issue", map[string]any{"label": "fleet/" + n, "namespace": "default",
			"sandbox_host": map[string]any{"adapter": "sandbox-libkrun", "host_name": n}})
		assert.NilError(t, err)
		var issued struct {
			Token string `json:"token"`
		}
		assert.NilError(t, json.Unmarshal(raw, &issued))
		stateDir := dirs.Short(t, n)
		raw, _ = json.Marshal(map[string]any{"image_allowlist": []string{"python"}, "cache_dir": e.cacheDir,
			"default_memory_mb": 256, "max_concurrent_sandboxes": 8, "state_dir": stateDir})
		assert.NilError(t, os.WriteFile(filepath.Join(dir, n+".json"), raw, 0o600))
		hosts[n] = start(n, issued.Token)
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, n := range names {
			if _, err := call(contract.HostFunctionID("sandbox-libkrun", n, contract.OpAdapterInfo), map[string]any{}); err != nil {
				return poll.Continue("host %s: %v", n, err)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(2*time.Minute), poll.WithDelay(100*time.Millisecond))

	// hostOf asks every host for its list: the host holding id.
	hostOf := func(id string) string {
		for _, n := range names {
			raw, err := call(contract.HostFunctionID("sandbox-libkrun", n, contract.OpList), map[string]any{})
			if err != nil {
				continue
			}
			if strings.Contains(string(raw), id) {
				return n
			}
		}
		return ""
	}
	owner := map[string]string{}
	perHost := map[string]int{}
	for range 12 {
		raw, err := call("sandbox::create", map[string]any{"image": "python"})
		assert.NilError(t, err)
		var created contract.CreateResponse
		assert.NilError(t, json.Unmarshal(raw, &created))
		h := hostOf(created.SandboxID)
		assert.Assert(t, h != "", "no host lists %s", created.SandboxID)
		owner[created.SandboxID] = h
		perHost[h]++
	}
	assert.DeepEqual(t, perHost, map[string]int{"h1": 4, "h2": 4, "h3": 4})
	raw, err := call("sandbox::list", map[string]any{})
	assert.NilError(t, err)
	var list contract.ListResponse
	assert.NilError(t, json.Unmarshal(raw, &list))
	assert.Check(t, is.Len(list.Sandboxes, 12))
	withFiles := map[string]bool{}
	for id := range owner {
		withFiles[id] = true
		raw, err := call("sandbox::exec", map[string]any{"sandbox_id": id, "argv": []string{"/bin/sh", "-c", "echo $((6*7))"}})
		assert.NilError(t, err)
		assert.Check(t, is.Contains(string(raw), `"stdout":"42\n"`))
		_, err = call("sandbox::fs::mkdir", map[string]any{"sandbox_id": id, "path": "/root/fleet-" + id[:8]})
		assert.NilError(t, err)
		raw, err = call("sandbox::fs::ls", map[string]any{"sandbox_id": id, "path": "/root"})
		assert.NilError(t, err)
		assert.Check(t, is.Contains(string(raw), "fleet-"+id[:8]))
	}

	// kill -9 of h2's adapter: its sandboxes are S301 naming h2 within a
	// second; the others go on; new creates avoid h2.
	assert.NilError(t, hosts["h2"].cmd.Process.Kill())
	waitfor.Closed(t, hosts["h2"].done, waitfor.Default, "h2's adapter, killed with SIGKILL, to be reaped")
	var h2Sandbox string
	for id, h := range owner {
		if h == "h2" {
			h2Sandbox = id
		}
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		_, err := call("sandbox::exec", map[string]any{"sandbox_id": h2Sandbox, "argv": []string{"true"}})
		if se := contract.AsError(err, ""); err != nil && se.Code == contract.S301 && strings.Contains(se.Message, `sandbox host "h2"`) {
			return poll.Success()
		}
		return poll.Continue("h2's sandbox answers %v", err)
	}, poll.WithTimeout(time.Second), poll.WithDelay(10*time.Millisecond))
	for id, h := range owner {
		if h == "h2" {
			continue
		}
		_, err := call("sandbox::exec", map[string]any{"sandbox_id": id, "argv": []string{"true"}})
		assert.Check(t, err, "a sandbox of %s", h)
	}
	for range 2 {
		raw, err := call("sandbox::create", map[string]any{"image": "python"})
		assert.NilError(t, err)
		var created contract.CreateResponse
		assert.NilError(t, json.Unmarshal(raw, &created))
		assert.Check(t, hostOf(created.SandboxID) != "h2")
		owner[created.SandboxID] = hostOf(created.SandboxID)
	}
	// A partition of h3 (its link down: no FIN, no RST) behaves the
	// same: S301 naming h3 within a second, h1 goes on, creates land on
	// h1. Healing the link brings h3 back with its sandboxes as they were.
	// One of the first twelve, which have a file to find after healing
	// (the two created after the kill have none).
	var h3Sandbox string
	for id := range withFiles {
		if owner[id] == "h3" {
			h3Sandbox = id
		}
	}
	assert.Assert(t, h3Sandbox != "", "no sandbox of h3 among the first twelve")
	spaces["h3"].SetLink(t, false)
	cutAt := time.Now()
	healed := false
	defer func() {
		if !healed {
			spaces["h3"].SetLink(t, true)
		}
	}()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		_, err := call("sandbox::exec", map[string]any{"sandbox_id": h3Sandbox, "argv": []string{"true"}})
		if se := contract.AsError(err, ""); err != nil && se.Code == contract.S301 && strings.Contains(se.Message, `sandbox host "h3"`) {
			return poll.Success()
		}
		return poll.Continue("h3's sandbox answers %v", err)
	}, poll.WithTimeout(time.Second), poll.WithDelay(10*time.Millisecond))
	for id, h := range owner {
		if h == "h1" {
			_, err := call("sandbox::exec", map[string]any{"sandbox_id": id, "argv": []string{"true"}})
			assert.Check(t, err, "a sandbox of h1 during h3's partition")
		}
	}
	raw, err = call("sandbox::create", map[string]any{"image": "python"})
	assert.NilError(t, err)
	var duringPartition contract.CreateResponse
	assert.NilError(t, json.Unmarshal(raw, &duringPartition))
	assert.Check(t, is.Equal(hostOf(duringPartition.SandboxID), "h1"))
	owner[duringPartition.SandboxID] = "h1"
	// Long enough that h3 notices too (it drops its dead connection and
	// retries while the link is down).
	time.Sleep(time.Until(cutAt.Add(6 * time.Second)))
	spaces["h3"].SetLink(t, true)
	healed = true
	healedAt := time.Now()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		raw, err := call("sandbox::fs::ls", map[string]any{"sandbox_id": h3Sandbox, "path": "/root"})
		if err != nil {
			return poll.Continue("h3's sandbox after healing: %v", err)
		}
		if !strings.Contains(string(raw), "fleet-"+h3Sandbox[:8]) {
			return poll.Error(fmt.Errorf("h3's sandbox came back without its files: %s", raw))
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(100*time.Millisecond))
	t.Logf("h3 answered again %v after its link healed", time.Since(healedAt).Round(time.Millisecond))

	// stop reaches the right host (another would answer S002).
	for id, h := range owner {
		if h == "h2" {
			continue
		}
		_, err := call("sandbox::stop", map[string]any{"sandbox_id": id, "wait": true})
		assert.Check(t, err, "stop of a sandbox of %s", h)
	}

	// A host without a valid credential cannot join: the engine refuses
	// it, and it exits 77.
	bad := start("h2", "not-a-credential")
	select {
	case <-bad.done:
	case <-time.After(time.Minute):
		t.Fatal("a host with a bad credential kept running")
	}
	assert.Check(t, is.Equal(bad.cmd.ProcessState.ExitCode(), 77), bad.logs.String())
	_, err = call(contract.HostFunctionID("sandbox-libkrun", "h2", contract.OpAdapterInfo), map[string]any{})
	assert.Check(t, err != nil)
}
