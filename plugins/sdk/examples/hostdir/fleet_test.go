package hostdir_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/enginetoken"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir"
)

// fleetHost is one sandbox-hostdir process serving as a fleet host.
type fleetHost struct {
	name, state string
	cmd         *exec.Cmd
	done        chan struct{}
	logs        *syncbuf.Buffer
}

// TestRemoteFleet runs three sandbox-hostdir processes as the hosts of a
// fleet (--fleet, each with its own sandbox host credential) behind a
// real engine process bound with sandbox: {hosts: '*'}: twelve sandboxes
// spread over the three, every call reaches the host that holds its
// sandbox, list merges them; kill -9 of one host makes its sandboxes
// answer S301 naming it within a second while the others keep working
// and new creates go to the two that remain.
func TestRemoteFleet(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds iii and the adapter and runs three adapter processes")
	}
	dir := t.TempDir()
	iii, adapterBin := buildEngineAndAdapter(t, dir)
	token, err := enginetoken.New()
	assert.NilError(t, err)
	engProc := startEngineProcess(t, iii, filepath.Join(dir, "home"), token, "hosts: '*'")
	caller := dialCaller(t, engProc.url(), token)
	ctx := context.Background()

	call := func(op string, payload any) (json.RawMessage, error) { return caller.Call(ctx, op, payload) }
	hosts := map[string]*fleetHost{}
	for _, name := range []string{"h1", "h2", "h3"} {
		hosts[name] = startFleetHost(t, caller, dir, adapterBin, engProc.url(), name, "--fleet")
	}
	// All three serve: a create lands somewhere and catalog::list works.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, h := range hosts {
			if _, err := caller.c.Call(ctx, contract.HostFunctionID(hostdir.Name, h.name, contract.OpAdapterInfo), map[string]any{}); err != nil {
				return poll.Continue("host %s: %v", h.name, err)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(50*time.Millisecond))

	// where reads which host holds a sandbox from its working directory,
	// which is under that host's state directory.
	where := func(id string) (string, error) {
		raw, err := call(contract.OpExec, map[string]any{"sandbox_id": id, "argv": []string{"pwd"}})
		if err != nil {
			return "", err
		}
		var res contract.ExecResponse
		if err := json.Unmarshal(raw, &res); err != nil {
			return "", err
		}
		for name, h := range hosts {
			if strings.HasPrefix(strings.TrimSpace(res.Stdout), h.state) {
				return name, nil
			}
		}
		return "", fmt.Errorf("sandbox %s runs in %q, under no host's state directory", id, res.Stdout)
	}
	owner := map[string]string{}
	perHost := map[string]int{}
	for range 12 {
		raw, err := call(contract.OpCreate, map[string]any{"image": "shell"})
		assert.NilError(t, err)
		var created contract.CreateResponse
		assert.NilError(t, json.Unmarshal(raw, &created))
		host, err := where(created.SandboxID)
		assert.NilError(t, err)
		owner[created.SandboxID] = host
		perHost[host]++
	}
	assert.DeepEqual(t, perHost, map[string]int{"h1": 4, "h2": 4, "h3": 4})
	raw, err := call(contract.OpList, map[string]any{})
	assert.NilError(t, err)
	var list contract.ListResponse
	assert.NilError(t, json.Unmarshal(raw, &list))
	assert.Check(t, is.Len(list.Sandboxes, 12))
	// Every entry names the host that holds it.
	for _, e := range list.Sandboxes {
		assert.Check(t, is.Equal(e.HostName, owner[e.SandboxID]), "sandbox %s", e.SandboxID)
	}
	// fs reaches the right host too.
	for id := range owner {
		_, err := call(contract.OpFsMkdir, map[string]any{"sandbox_id": id, "path": "/tmp/fleet-" + id[:8], "parents": true})
		assert.NilError(t, err)
		raw, err := call(contract.OpFsLs, map[string]any{"sandbox_id": id, "path": "/tmp"})
		assert.NilError(t, err)
		assert.Check(t, is.Contains(string(raw), "fleet-"+id[:8]))
	}

	// kill -9 of h2.
	assert.NilError(t, hosts["h2"].cmd.Process.Kill())
	waitfor.Closed(t, hosts["h2"].done, waitfor.Default, "h2, killed with SIGKILL, to be reaped")
	var h2Sandbox string
	for id, h := range owner {
		if h == "h2" {
			h2Sandbox = id
		}
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		_, err := call(contract.OpExec, map[string]any{"sandbox_id": h2Sandbox, "argv": []string{"true"}})
		if se := contract.AsError(err, ""); err != nil && se.Code == contract.S301 && strings.Contains(se.Message, `sandbox host "h2"`) {
			return poll.Success()
		}
		return poll.Continue("h2's sandbox answers %v", err)
	}, poll.WithTimeout(time.Second), poll.WithDelay(10*time.Millisecond))
	for id, h := range owner {
		if h == "h2" {
			continue
		}
		got, err := where(id)
		assert.NilError(t, err)
		assert.Check(t, is.Equal(got, h))
	}
	for range 4 {
		raw, err := call(contract.OpCreate, map[string]any{"image": "shell"})
		assert.NilError(t, err)
		var created contract.CreateResponse
		assert.NilError(t, json.Unmarshal(raw, &created))
		host, err := where(created.SandboxID)
		assert.NilError(t, err)
		assert.Check(t, host != "h2")
	}

	// h2 comes back: a new adapter process, so its sandboxes died with
	// the old one, and the old id says so instead of "never created".
	hosts["h2"] = startFleetHost(t, caller, dir, adapterBin, engProc.url(), "h2", "--fleet")
	// adapter::info is the last function a host registers.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := caller.c.Call(ctx, contract.HostFunctionID(hostdir.Name, "h2", contract.OpAdapterInfo), map[string]any{}); err != nil {
			return poll.Continue("h2: %v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(20*time.Millisecond))
	_, err = call(contract.OpExec, map[string]any{"sandbox_id": h2Sandbox, "argv": []string{"true"}})
	se := contract.AsError(err, "")
	assert.Assert(t, err != nil, "the sandbox of the killed h2 answered")
	assert.Check(t, is.Equal(se.Code, contract.S002), "%v", err)
	assert.Check(t, is.Contains(se.Message, "restarted"))
	// Asked again, once the router has forgotten where it was.
	_, err = call(contract.OpFsLs, map[string]any{"sandbox_id": h2Sandbox, "path": "/tmp"})
	se = contract.AsError(err, "")
	assert.Assert(t, err != nil)
	assert.Check(t, is.Equal(se.Code, contract.S002), "%v", err)
	assert.Check(t, is.Contains(se.Message, `sandbox host "h2" of adapter "sandbox-hostdir", whose adapter process restarted`))
	assert.Check(t, is.Contains(se.Message, "lost with the old process"))
	assert.Check(t, !strings.Contains(se.Message, "never created"), "%s", se.Message)
}

// startFleetHost issues a sandbox host credential for name and runs a
// sandbox-hostdir serving the engine at url as that host, with extra
// flags (--fleet, or none). It waits for nothing.
func startFleetHost(t *testing.T, caller *engineCaller, dir, adapterBin, url, name string, extra ...string) *fleetHost {
	t.Helper()
	ctx := context.Background()
	raw, err := caller.c.Call(ctx, "engine::credentials::issue", map[string]any{"label": "fleet/" + name, "namespace": "default",
		"sandbox_host": map[string]any{"adapter": hostdir.Name, "host_name": name}})
	assert.NilError(t, err)
	var issued struct {
		Token string `json:"token"`
	}
	assert.NilError(t, json.Unmarshal(raw, &issued))
	cred := filepath.Join(dir, name+".credential")
	assert.NilError(t, os.WriteFile(cred, []byte(issued.Token), 0o600))
	cfg := filepath.Join(dir, name+".json")
	assert.NilError(t, os.WriteFile(cfg, []byte(`{"image_allowlist":["shell"]}`), 0o600))
	h := &fleetHost{name: name, state: filepath.Join(dir, "state-"+name), logs: &syncbuf.Buffer{}, done: make(chan struct{})}
	args := append([]string{"serve", "--engine", url, "--credential-file", cred, "--host-name", name, "--config-file", cfg}, extra...)
	h.cmd = exec.Command(adapterBin, args...)
	h.cmd.Env = append(os.Environ(), hostdir.EnvStateDir+"="+h.state)
	h.cmd.Stdout, h.cmd.Stderr = h.logs, h.logs
	assert.NilError(t, h.cmd.Start())
	cmd, done := h.cmd, h.done
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		waitfor.Closed(t, done, waitfor.Default, "the killed host "+name+" to be reaped")
		if t.Failed() {
			t.Logf("host %s log:\n%s", h.name, h.logs.Tail(60))
		}
	})
	return h
}

// TestRemoteFleetHostWithoutFleetFlag: under a fleet binding, a real
// sandbox-hostdir started without --fleet (as the old hint said) serves
// <adapter>::* that the router never uses. The engine logs a warning
// naming --fleet, engine::adapters::list shows it under warnings, and
// sandbox::create's S301 says so; once a host with --fleet joins, the
// create works.
func TestRemoteFleetHostWithoutFleetFlag(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds iii and the adapter and runs adapter processes")
	}
	dir := t.TempDir()
	iii, adapterBin := buildEngineAndAdapter(t, dir)
	token, err := enginetoken.New()
	assert.NilError(t, err)
	engProc := startEngineProcess(t, iii, filepath.Join(dir, "home"), token, "hosts: '*'")
	caller := dialCaller(t, engProc.url(), token)
	ctx := context.Background()

	stray := startFleetHost(t, caller, dir, adapterBin, engProc.url(), "h1")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if strings.Contains(engProc.logs.String(), "serves a fleet-bound adapter without --fleet") {
			return poll.Success()
		}
		return poll.Continue("no warning in the engine's log yet")
	}, poll.WithTimeout(time.Minute), poll.WithDelay(50*time.Millisecond))
	assert.Check(t, is.Contains(engProc.logs.String(), "--fleet --host-name h1"))
	assert.Check(t, is.Contains(stray.logs.String(), "connected to the engine; serving"))

	raw, err := caller.c.Call(ctx, "engine::adapters::list", map[string]any{})
	assert.NilError(t, err)
	var listed struct {
		Warnings []string `json:"warnings"`
	}
	assert.NilError(t, json.Unmarshal(raw, &listed))
	assert.Assert(t, is.Len(listed.Warnings, 1), "%s", raw)
	assert.Check(t, is.Contains(listed.Warnings[0], `sandbox host "h1"`))
	assert.Check(t, is.Contains(listed.Warnings[0], "without --fleet"))
	assert.Check(t, is.Contains(listed.Warnings[0], "sandbox-hostdir::host::h1::*"))

	_, err = caller.Call(ctx, contract.OpCreate, map[string]any{"image": "shell"})
	se := contract.AsError(err, "")
	assert.Assert(t, err != nil)
	assert.Check(t, is.Equal(se.Code, contract.S301))
	assert.Check(t, is.Contains(se.Message, "--fleet"))
	assert.Check(t, is.Contains(se.Message, "without --fleet"))

	// A host that does it right is used; the stray still is not.
	startFleetHost(t, caller, dir, adapterBin, engProc.url(), "h2", "--fleet")
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if _, err := caller.Call(ctx, contract.OpCreate, map[string]any{"image": "shell"}); err != nil {
			return poll.Continue("create: %v", err)
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(50*time.Millisecond))
	raw, err = caller.Call(ctx, contract.OpList, map[string]any{})
	assert.NilError(t, err)
	var list contract.ListResponse
	assert.NilError(t, json.Unmarshal(raw, &list))
	assert.Assert(t, is.Len(list.Sandboxes, 1))
	assert.Check(t, is.Equal(list.Sandboxes[0].HostName, "h2"))
}
