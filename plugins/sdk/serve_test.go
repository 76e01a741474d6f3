package sdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/adapterproc"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/plugins/sdk"
	"github.com/iii-sandbox/iii/plugins/sdk/sdktest"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/icmd"
	"gotest.tools/v3/poll"
)

// These tests build testdata/tinyadapter and drive it as a real go-plugin
// subprocess, the way the engine's plugin host does.

// plug is one running tinyadapter.
type plug struct {
	client *plugin.Client
	cmd    *exec.Cmd
	stderr *syncbuf.Buffer
	stdout *syncbuf.Buffer // go-plugin's synced stdout after the handshake
}

func buildTiny(t *testing.T) string {
	t.Helper()
	return sdktest.BuildPlugin(t, "./testdata/tinyadapter")
}

func newPlug(t *testing.T, bin string, env []string, extra ...*os.File) *plug {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	cmd.ExtraFiles = extra
	p := &plug{cmd: cmd, stderr: &syncbuf.Buffer{}, stdout: &syncbuf.Buffer{}}
	p.client = adapterproc.NewClient(adapterproc.Options{Cmd: cmd, Stderr: p.stderr, SyncStdout: p.stdout,
		Logger: hclog.New(&hclog.LoggerOptions{Output: &testWriter{t: t}, Level: hclog.Debug})})
	t.Cleanup(p.client.Kill)
	return p
}

// testWriter sends the host-side go-plugin log to the test's log.
type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (p *plug) adapter(t *testing.T) contract.Adapter {
	t.Helper()
	a, err := adapterproc.Dispense(p.client)
	assert.NilError(t, err, "stderr:\n%s", p.stderr.String())
	return a
}

// exitCode waits for the process to exit and returns its status.
func (p *plug) exitCode(t *testing.T) int {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if p.client.Exited() {
			return poll.Success()
		}
		return poll.Continue("the adapter is still running")
	}, poll.WithTimeout(time.Minute), poll.WithDelay(20*time.Millisecond))
	// go-plugin sets Exited only after Wait returned, under its lock.
	return p.cmd.ProcessState.ExitCode()
}

func (p *plug) waitStderr(t *testing.T, want string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if strings.Contains(p.stderr.String(), want) {
			return poll.Success()
		}
		return poll.Continue("stderr has no %q yet", want)
	}, poll.WithTimeout(time.Minute), poll.WithDelay(20*time.Millisecond))
}

func TestServe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs an adapter binary")
	}
	bin := buildTiny(t)
	ctx := context.Background()

	t.Run("handshake, calls and graceful kill", func(t *testing.T) {
		p := newPlug(t, bin, nil)
		a := p.adapter(t)
		info, err := a.Info(ctx)
		assert.NilError(t, err)
		assert.Equal(t, info.Adapter, "tinyadapter")
		assert.Equal(t, info.AdapterVersion, "0.0.1-test")
		assert.Equal(t, info.Contract, contract.Current())
		assert.Check(t, info.Facts["pid"] != nil)
		rt, _ := info.Facts[sdk.RuntimeFactKey].(map[string]any)
		assert.Check(t, rt["goroutines"] != nil && rt["open_fds"] != nil && rt["rss_bytes"] != nil, "runtime block: %v", info.Facts)
		assert.NilError(t, a.Configure(ctx, []byte(`{"image_allowlist":["python"]}`)))
		_, err = a.List(ctx, &contract.ListRequest{})
		assert.NilError(t, err)
		_, err = a.Exec(ctx, &contract.ExecRequest{SandboxID: "1b4e6709-f265-4142-9178-3a7d83b46aa5", Argv: []string{"true"}})
		assert.Check(t, contract.IsCode(err, contract.S300), "got %v", err)

		p.client.Kill()
		assert.Equal(t, p.exitCode(t), sdk.ExitOK)
		assert.Check(t, is.Contains(p.stderr.String(), "tiny adapter shutdown called"))
	})

	t.Run("stray stdout does not break the handshake", func(t *testing.T) {
		p := newPlug(t, bin, []string{"TINY_STRAY=1"})
		a := p.adapter(t)
		_, err := a.Info(ctx)
		assert.NilError(t, err)
		// Before the handshake: the os.Stdout variable goes to the log,
		// a raw fd 1 write goes to stderr.
		p.waitStderr(t, "stray println before the handshake")
		p.waitStderr(t, "stray write on fd 1 before the handshake")
		assert.Check(t, is.Contains(p.stderr.String(), "stdout output redirected to the log"))
		// After the handshake go-plugin relays os.Stdout to the host.
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if strings.Contains(p.stdout.String(), "stray println during a call") {
				return poll.Success()
			}
			return poll.Continue("no relayed stdout yet")
		}, poll.WithTimeout(time.Minute))
	})

	t.Run("configure rejection exits with the reason in the log", func(t *testing.T) {
		p := newPlug(t, bin, nil)
		a := p.adapter(t)
		err := a.Configure(ctx, []byte(`{"reject":"max_widgets must be a number"}`))
		var rej *contract.ConfigRejectedError
		assert.Assert(t, errors.As(err, &rej), "got %v", err)
		assert.Check(t, is.Contains(rej.Reason, "max_widgets must be a number"))
		assert.Equal(t, p.exitCode(t), sdk.ExitConfigRejected)
		stderr := p.stderr.String()
		assert.Check(t, is.Contains(stderr, "configuration rejected"))
		assert.Check(t, is.Contains(stderr, "max_widgets must be a number"))
		assert.Check(t, is.Contains(stderr, "tiny adapter shutdown called"))
	})

	t.Run("a refused reload leaves the adapter running", func(t *testing.T) {
		p := newPlug(t, bin, nil)
		a := p.adapter(t)
		assert.NilError(t, a.Configure(ctx, []byte(`{"image_allowlist":["python"]}`)))
		err := a.Configure(ctx, []byte(`{"reject":"max_widgets must be a number"}`))
		var rej *contract.ConfigRejectedError
		assert.Assert(t, errors.As(err, &rej), "got %v", err)
		_, err = a.List(ctx, &contract.ListRequest{})
		assert.NilError(t, err, "the adapter still serves after a refused reload")
		p.waitStderr(t, "configuration reload refused")
		p.client.Kill()
		assert.Equal(t, p.exitCode(t), sdk.ExitOK)
	})

	t.Run("lifeline EOF exits the adapter", func(t *testing.T) {
		r, w, err := os.Pipe()
		assert.NilError(t, err)
		defer w.Close()
		p := newPlug(t, bin, []string{sdk.EnvLifelineFD + "=3"}, r)
		a := p.adapter(t)
		_, err = a.Info(ctx)
		assert.NilError(t, err)
		assert.NilError(t, r.Close()) // the child holds its own copy
		assert.NilError(t, w.Close())
		assert.Equal(t, p.exitCode(t), sdk.ExitOK)
		stderr := p.stderr.String()
		assert.Check(t, is.Contains(stderr, "lifeline closed"))
		assert.Check(t, is.Contains(stderr, "tiny adapter shutdown called"))
	})

	t.Run("SIGTERM shuts the adapter down", func(t *testing.T) {
		p := newPlug(t, bin, nil)
		a := p.adapter(t)
		_, err := a.Info(ctx)
		assert.NilError(t, err)
		assert.NilError(t, p.cmd.Process.Signal(syscall.SIGTERM))
		assert.Equal(t, p.exitCode(t), sdk.ExitOK)
		assert.Check(t, is.Contains(p.stderr.String(), "tiny adapter shutdown called"))
	})

	t.Run("a panic becomes an S-code and the adapter lives on", func(t *testing.T) {
		p := newPlug(t, bin, []string{"TINY_PANIC=1"})
		a := p.adapter(t)
		_, err := a.Create(ctx, &contract.CreateRequest{Image: "python"})
		var se *contract.Error
		assert.Assert(t, errors.As(err, &se), "got %v", err)
		assert.Equal(t, se.Code, contract.S300)
		assert.Check(t, is.Contains(se.Message, "internal error"))
		_, err = a.Info(ctx)
		assert.NilError(t, err)
		assert.Check(t, is.Contains(p.stderr.String(), "the adapter panicked"))
	})

	startFails := []struct {
		name   string
		env    []string
		stderr string
	}{
		{"lifeline fd is not a number", []string{sdk.EnvLifelineFD + "=three"}, "not a file descriptor number"},
		{"lifeline fd is not open", []string{sdk.EnvLifelineFD + "=9"}, "fd 9 is not open"},
		{"lifeline fd is not a pipe", []string{sdk.EnvLifelineFD + "=0"}, "is one of stdin"},
		{"the adapter's New fails", []string{"TINY_NEW_FAIL=no backend on this host"}, "no backend on this host"},
	}
	for _, tc := range startFails {
		t.Run(tc.name, func(t *testing.T) {
			p := newPlug(t, bin, tc.env)
			_, err := p.client.Client()
			assert.Assert(t, err != nil)
			assert.Equal(t, p.exitCode(t), sdk.ExitFailed)
			p.waitStderr(t, tc.stderr)
		})
	}

	t.Run("run by hand", func(t *testing.T) {
		env := withoutCookie(os.Environ())
		res := icmd.RunCmd(icmd.Cmd{Command: []string{bin}, Env: env})
		res.Assert(t, icmd.Expected{ExitCode: sdk.ExitFailed, Err: "tinyadapter 0.0.1-test is an iii sandbox adapter plugin"})
		assert.Check(t, is.Contains(res.Stderr(), "It is started by the iii engine, not by hand"))
		assert.Equal(t, res.Stdout(), "")

		res = icmd.RunCmd(icmd.Cmd{Command: []string{bin, "--version"}, Env: env})
		res.Assert(t, icmd.Expected{ExitCode: 0, Out: "tinyadapter 0.0.1-test (iii sandbox adapter, sandbox contract 1.1)"})
	})
}

func withoutCookie(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, contract.HandshakeMagicCookieKey+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// TestServeConfigReachesAdapter checks the configuration JSON is handed to
// the adapter untouched.
func TestServeConfigReachesAdapter(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs an adapter binary")
	}
	bin := buildTiny(t)
	p := newPlug(t, bin, []string{sdk.EnvLogLevel + "=debug"})
	a := p.adapter(t)
	cfg, err := json.Marshal(map[string]any{"a": 1, "b": []string{"x"}, "c": map[string]any{}})
	assert.NilError(t, err)
	assert.NilError(t, a.Configure(context.Background(), cfg))
	p.waitStderr(t, `"keys":3`)
}
