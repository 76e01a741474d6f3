package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// nobodyUID is the uid the other user's commands run as.
const nobodyUID = 65534

// TestEngineTokenAcrossUsers runs the real iii as two users against one
// engine: its owner, with no token given anywhere, calls privileged
// functions (engine::adapters::stop, configuration::set, compose::stop) and
// runs `iii compose`; another uid (nobody), pointed at the owner's home,
// cannot read the 0600 token file and gets UNAUTHORIZED for each, while open
// functions still answer; its `iii compose` cannot serve compose::*.
func TestEngineTokenAcrossUsers(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts an engine and a Compose daemon")
	}
	if os.Getuid() != 0 {
		t.Skip("needs root: it runs iii as another user (nobody) with setpriv")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("needs setpriv (util-linux) to run iii as another user")
	}

	// This test binary is iii under that name (TestMain); copied where
	// nobody may run it.
	bin := mkdirMode(t, 0o755)
	iii := filepath.Join(bin, "iii")
	exe, err := os.Executable()
	assert.NilError(t, err)
	copyFile(t, exe, iii, 0o755)

	// The owner's home is readable by all, and so is ~/.iii: only the
	// token file's own mode keeps nobody out.
	home := mkdirMode(t, 0o755)
	assert.NilError(t, os.Mkdir(filepath.Join(home, ".iii"), 0o755))
	work := mkdirMode(t, 0o777)
	port, err := freePort()
	assert.NilError(t, err)
	cfg := filepath.Join(work, "config.yaml")
	assert.NilError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(
		"workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %s }\n", port)), 0o644))
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "III_LOG_LEVEL=warn"}

	engine := exec.Command(iii, "-c", cfg, "--no-update-check")
	engine.Dir, engine.Env, engine.WaitDelay = work, env, 10*time.Second
	var engineLog bytes.Buffer
	engine.Stdout, engine.Stderr = &engineLog, &engineLog
	assert.NilError(t, engine.Start())
	t.Cleanup(func() {
		_ = engine.Process.Signal(syscall.SIGINT)
		waitfor.Func(t, waitfor.Default, "the engine to exit on SIGINT", func() { _ = engine.Wait() })
		if t.Failed() {
			t.Logf("engine log:\n%s", engineLog.String())
		}
	})
	waitListening(t, "127.0.0.1:"+port)

	tokenFile := filepath.Join(home, ".iii", "engine-token")
	st, err := os.Stat(tokenFile)
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o600), "the token file is owner-only")
	data, err := os.ReadFile(tokenFile)
	assert.NilError(t, err)
	assert.Check(t, regexp.MustCompile(`^[0-9a-f]{64}\n$`).Match(data))

	run := func(asNobody bool, args ...string) (code int, stdout, stderr string) {
		t.Helper()
		argv := append([]string{iii}, args...)
		if asNobody {
			argv = append([]string{setpriv, fmt.Sprintf("--reuid=%d", nobodyUID), fmt.Sprintf("--regid=%d", nobodyUID), "--clear-groups", "--"}, argv...)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Dir, cmd.Env = work, env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			assert.NilError(t, err)
		}
		return code, out.String(), errb.String()
	}
	call := func(asNobody bool, args ...string) (int, string, string) {
		return run(asNobody, append([]string{"call", "--port", port}, args...)...)
	}

	// Nobody cannot read the file, even knowing where it is.
	code, _, stderr := run(true, "call", "--port", port, "engine::adapters::list", "--token", "x")
	assert.Equal(t, code, 1, "with a wrong explicit token: %s", stderr)
	assert.Check(t, is.Contains(stderr, "AUTH_ERROR"))
	c := exec.Command(setpriv, fmt.Sprintf("--reuid=%d", nobodyUID), fmt.Sprintf("--regid=%d", nobodyUID), "--clear-groups", "--", "cat", tokenFile)
	out, err := c.CombinedOutput()
	assert.Check(t, err != nil, "nobody read the token file: %s", out)

	for _, tc := range []struct {
		name string
		args []string
		// ownerCode is the code the owner's call ends with: past the gate.
		ownerCode string
	}{
		{"adapters stop", []string{"engine::adapters::stop", "adapter=sandbox-nope"}, "ADAPTER_NOT_STARTED"},
		{"adapters start", []string{"engine::adapters::start", "adapter=sandbox-nope", "path=/nonexistent/adapter"}, ""},
		{"configuration set", []string{"configuration::set", "--json", `{"id":"nothing","value":1}`}, "NOT_REGISTERED"},
		{"configuration register", []string{"configuration::register", "--json", `{"schema":{}}`}, "INVALID_ID"},
		{"credentials issue", []string{"engine::credentials::issue", "namespace=BAD"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := call(true, tc.args...)
			assert.Equal(t, code, 1, stderr)
			assert.Check(t, is.Contains(stderr, `"code": "UNAUTHORIZED"`))
			assert.Check(t, is.Contains(stderr, "hint: this call presented no engine token"))

			code, _, stderr = call(false, tc.args...)
			assert.Check(t, !strings.Contains(stderr, "UNAUTHORIZED"), "the owner, no token given: %s", stderr)
			if tc.ownerCode != "" {
				assert.Equal(t, code, 1, stderr)
				assert.Check(t, is.Contains(stderr, `"code": "`+tc.ownerCode+`"`))
			}
		})
	}
	for _, asNobody := range []bool{false, true} {
		code, stdout, stderr := call(asNobody, "engine::adapters::list")
		assert.Equal(t, code, 0, "open to every user: %s", stderr)
		assert.Check(t, is.Contains(stdout, `"adapters"`))
	}

	// The owner's iii compose attaches and serves compose::*; nobody may
	// read its status but not stop it; the owner may.
	compose := exec.Command(iii, "compose", "--engine", "ws://127.0.0.1:"+port, "-n", "tk")
	compose.Dir, compose.Env, compose.WaitDelay = work, env, 10*time.Second
	var composeLog bytes.Buffer
	compose.Stdout, compose.Stderr = &composeLog, &composeLog
	assert.NilError(t, compose.Start())
	var composeErr error
	composeDone := make(chan struct{})
	go func() {
		composeErr = compose.Wait()
		close(composeDone)
	}()
	t.Cleanup(func() {
		select {
		case <-composeDone:
		default:
			_ = compose.Process.Signal(syscall.SIGINT)
			select {
			case <-composeDone:
			case <-time.After(30 * time.Second):
				_ = compose.Process.Kill()
				<-composeDone
			}
		}
		if t.Failed() {
			t.Logf("compose log:\n%s", composeLog.String())
		}
	})
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if code, _, stderr := call(false, "compose::list", "-n", "tk"); code != 0 {
			return poll.Continue("compose::list: %s", stderr)
		}
		return poll.Success()
	}, poll.WithTimeout(60*time.Second), poll.WithDelay(100*time.Millisecond))
	code, _, stderr = call(true, "compose::list", "-n", "tk")
	assert.Equal(t, code, 0, stderr)
	code, _, stderr = call(true, "compose::stop", "-n", "tk")
	assert.Equal(t, code, 1, stderr)
	assert.Check(t, is.Contains(stderr, `"code": "UNAUTHORIZED"`))

	// Nobody's own iii compose cannot serve compose::* on this engine.
	code, _, stderr = run(true, "compose", "--engine", "ws://127.0.0.1:"+port, "-n", "other")
	assert.Equal(t, code, 1, stderr)
	assert.Check(t, is.Contains(stderr, "compose::* may be served only by a connection that holds the engine token"))

	code, _, stderr = call(false, "compose::stop", "-n", "tk")
	assert.Equal(t, code, 0, stderr)
	select {
	case <-composeDone:
		assert.NilError(t, composeErr, "the owner's compose::stop stops the daemon cleanly")
	case <-time.After(60 * time.Second):
		t.Fatal("compose::stop did not stop the daemon")
	}
}

// mkdirMode makes a temporary directory with mode (beyond the umask).
func mkdirMode(t *testing.T, mode os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "iii-token-")
	assert.NilError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	assert.NilError(t, os.Chmod(dir, mode))
	return dir
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(from)
	assert.NilError(t, err)
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	assert.NilError(t, err)
	_, err = io.Copy(out, in)
	assert.NilError(t, err)
	assert.NilError(t, out.Close())
}

func waitListening(t *testing.T, addr string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return poll.Continue("%v", err)
		}
		c.Close()
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(50*time.Millisecond))
}
