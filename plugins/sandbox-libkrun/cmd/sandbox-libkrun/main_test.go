package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/adapter"
	"github.com/iii-sandbox/iii/plugins/sdk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestServe runs `sandbox-libkrun serve --engine … --credential-file …
// --host-name … --config-file …` against a real engine: the adapter
// connects as a worker, serves its functions (adapter::info with its host
// name; not worker::* without --worker-ops), and stops on SIGTERM with 0.
func TestServe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the adapter")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "sandbox-libkrun")
	out, err := bins.GoBuild(bin, ".", nil)
	assert.NilError(t, err, string(out))

	env := enginetest.Start(t, enginetest.Options{ClientName: "caller", CallTimeout: time.Minute, Wait: 30 * time.Second})
	cred := filepath.Join(dir, "token")
	assert.NilError(t, os.WriteFile(cred, []byte(env.Token), 0o600))
	cfg, _ := json.Marshal(map[string]any{"state_dir": filepath.Join(dir, "state"), "cache_dir": filepath.Join(dir, "cache")})
	cfgFile := filepath.Join(dir, "config.json")
	assert.NilError(t, os.WriteFile(cfgFile, cfg, 0o600))

	var logs syncbuf.Buffer
	cmd := exec.Command(bin, "serve", "--engine", env.URL, "--credential-file", cred, "--host-name", "host-a", "--config-file", cfgFile)
	cmd.Env = append(os.Environ(), "HOME="+dir)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	// A child that inherited stderr must not hold Wait up.
	cmd.WaitDelay = 5 * time.Second
	assert.NilError(t, cmd.Start())
	var waitErr error
	done := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("adapter log:\n%s", logs.String())
		}
	})

	ctx := context.Background()
	var info contract.AdapterInfo
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		raw, err := env.Client.Call(ctx, contract.AdapterFunctionID(adapter.Name, contract.OpAdapterInfo), map[string]any{})
		if err != nil {
			return poll.Continue("adapter::info: %v", err)
		}
		if err := json.Unmarshal(raw, &info); err != nil {
			return poll.Error(err)
		}
		return poll.Success()
	}, poll.WithTimeout(time.Minute), poll.WithDelay(50*time.Millisecond))
	assert.Equal(t, info.Adapter, adapter.Name)
	assert.Equal(t, info.Facts[sdk.HostNameFactKey], "host-a")

	_, err = env.Client.Call(ctx, contract.AdapterFunctionID(adapter.Name, contract.OpCatalogList), map[string]any{})
	assert.NilError(t, err)
	// worker::* is served, privileged as the plugin host publishes it.
	_, err = env.Client.Call(ctx, contract.AdapterFunctionID(adapter.Name, contract.OpWorkerList), map[string]any{})
	assert.NilError(t, err)
	_, err = env.Anonymous(t, "anonymous").Call(ctx, contract.AdapterFunctionID(adapter.Name, contract.OpWorkerList), map[string]any{})
	assert.Equal(t, client.CodeOf(err), engine.CodeUnauthorized, "%v", err)

	assert.NilError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-done:
		assert.NilError(t, waitErr, "exit status after SIGTERM")
	case <-time.After(30 * time.Second):
		t.Fatal("the adapter did not stop on SIGTERM")
	}
	assert.Assert(t, strings.Contains(logs.String(), "SIGTERM") || strings.Contains(logs.String(), "terminated"), logs.String())
}

// TestServeUsage: serve without an engine address says what is missing.
func TestServeUsage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the adapter")
	}
	bin := filepath.Join(t.TempDir(), "sandbox-libkrun")
	out, err := bins.GoBuild(bin, ".", nil)
	assert.NilError(t, err, string(out))
	cmd := exec.Command(bin, "serve", "--credential-file", "/nonexistent")
	cmd.Env = append(os.Environ(), sdk.EnvEngineURL+"=")
	msg, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	assert.Assert(t, errors.As(err, &ee), "%v: %s", err, msg)
	assert.Equal(t, ee.ExitCode(), sdk.ExitFailed)
	assert.Assert(t, strings.Contains(string(msg), "--engine"), string(msg))
}
