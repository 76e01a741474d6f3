package hostdir

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var ctx = context.Background()

func configured(t *testing.T) (*Provider, string) {
	t.Helper()
	dir := t.TempDir()
	p := NewProvider(hclog.NewNullLogger())
	raw, _ := json.Marshal(dir)
	assert.NilError(t, p.Configure(ctx, map[string]json.RawMessage{KeyStateDir: raw}))
	return p, dir
}

func boot(t *testing.T, p *Provider, image string) *sandbox {
	t.Helper()
	var img contract.CatalogImage
	for _, c := range p.Presets() {
		if c.Name == image {
			img = c
		}
	}
	sb, err := p.Boot(ctx, sandboxkit.BootSpec{ID: uuid.NewString(), Image: img, Env: []string{"BOOT=1"}})
	assert.NilError(t, err)
	s := sb.(*sandbox)
	t.Cleanup(func() { _ = s.Stop(ctx, true) })
	return s
}

func code(t *testing.T, err error) contract.Code {
	t.Helper()
	var se *contract.Error
	assert.Assert(t, errors.As(err, &se), "want a sandbox error, got %v", err)
	return se.Code
}

func TestConfigure(t *testing.T) {
	t.Parallel()
	p := NewProvider(nil)
	for _, bad := range []string{`"relative/dir"`, `""`, `42`} {
		err := p.Configure(ctx, map[string]json.RawMessage{KeyStateDir: json.RawMessage(bad)})
		assert.ErrorContains(t, err, KeyStateDir, bad)
	}
	dir := filepath.Join(t.TempDir(), "state")
	p.getenv = func(k string) string {
		if k == EnvStateDir {
			return dir
		}
		return ""
	}
	assert.NilError(t, p.Configure(ctx, nil))
	st, err := os.Stat(dir)
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o700))
	info := p.Info(ctx)
	assert.Equal(t, info["isolation"], "none")
	assert.Equal(t, info["state_dir"], dir)
	assert.Check(t, is.Contains(info["warning"].(string), "NO isolation"))
}

func TestBoot(t *testing.T) {
	t.Parallel()
	p, state := configured(t)
	s := boot(t, p, "shell")
	st, err := os.Stat(s.dir)
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o700))
	assert.Equal(t, filepath.Dir(s.dir), state)
	for _, d := range []string{"home", "tmp"} {
		_, err := os.Stat(filepath.Join(s.dir, d))
		assert.NilError(t, err)
	}

	_, err = p.Boot(ctx, sandboxkit.BootSpec{ID: uuid.NewString(), Image: contract.CatalogImage{Name: "mine", OCIRef: "docker.io/library/alpine"}})
	assert.Equal(t, code(t, err), contract.S101)
	_, err = p.Boot(ctx, sandboxkit.BootSpec{ID: uuid.NewString(), Image: contract.CatalogImage{Name: "mine", OCIRef: "host:sdktest-no-such-program"}})
	assert.Equal(t, code(t, err), contract.S101)
	assert.Check(t, is.Contains(err.Error(), "not installed on this host"))

	assert.NilError(t, s.Stop(ctx, true))
	_, err = os.Stat(s.dir)
	assert.Check(t, os.IsNotExist(err), "the sandbox directory is removed on stop")
	select {
	case <-s.Done():
	default:
		t.Fatal("Done is not closed after Stop")
	}
	assert.NilError(t, s.Stop(ctx, false), "a second Stop is harmless")
}

func TestMapArg(t *testing.T) {
	t.Parallel()
	p, _ := configured(t)
	s := boot(t, p, "shell")
	assert.NilError(t, os.Mkdir(filepath.Join(s.dir, "work"), 0o755))
	tests := []struct{ in, want string }{
		{"/tmp/run.py", filepath.Join(s.dir, "tmp/run.py")},
		{"/home", filepath.Join(s.dir, "home")},
		{"/work/a/../b/", filepath.Join(s.dir, "work/b") + "/"},
		{"/bin/sh", "/bin/sh"},
		{"/usr/bin/python3", "/usr/bin/python3"},
		{"/", "/"},
		{"relative/path", "relative/path"},
		{"-c", "-c"},
		{"--out=/tmp/x", "--out=/tmp/x"},
		{"/../tmp/x", filepath.Join(s.dir, "tmp/x")},
	}
	for _, tc := range tests {
		assert.Equal(t, s.mapArg(tc.in), tc.want, tc.in)
	}
}

func FuzzMapArg(f *testing.F) {
	for _, s := range []string{"/tmp/x", "/../..", "/home/../../etc", "x", "/\x00"} {
		f.Add(s)
	}
	dir := f.TempDir()
	p := NewProvider(hclog.NewNullLogger())
	raw, _ := json.Marshal(dir)
	if err := p.Configure(ctx, map[string]json.RawMessage{KeyStateDir: raw}); err != nil {
		f.Fatal(err)
	}
	sb, err := p.Boot(ctx, sandboxkit.BootSpec{ID: uuid.NewString(), Image: p.Presets()[2]})
	if err != nil {
		f.Fatal(err)
	}
	s := sb.(*sandbox)
	defer func() {
		if err := s.Stop(ctx, true); err != nil {
			f.Error(err)
		}
	}()
	f.Fuzz(func(t *testing.T, arg string) {
		got := s.mapArg(arg)
		if got != arg && !strings.HasPrefix(got, s.dir+"/") {
			t.Fatalf("mapArg(%q) = %q, outside the sandbox %s", arg, got, s.dir)
		}
	})
}

func TestMergeEnv(t *testing.T) {
	t.Parallel()
	got := mergeEnv([]string{"PATH=/bin", "HOME=/h"}, []string{"A=1", "HOME=/boot"}, []string{"A=2", "B=x=y"})
	assert.DeepEqual(t, got, []string{"PATH=/bin", "HOME=/boot", "A=2", "B=x=y"})
	assert.Equal(t, pathOf(got), "/bin")
}

func run(t *testing.T, s *sandbox, spec sandboxkit.ExecSpec) sandboxkit.ExecResult {
	t.Helper()
	if spec.Timeout == 0 {
		spec.Timeout = time.Minute
	}
	res, err := s.Exec(ctx, spec)
	assert.NilError(t, err)
	return res
}

func TestExec(t *testing.T) {
	t.Parallel()
	p, _ := configured(t)
	s := boot(t, p, "shell")

	res := run(t, s, sandboxkit.ExecSpec{Argv: []string{"/bin/sh", "-c", `printf '%s|%s|%s|%s' "$HOME" "$TMPDIR" "$BOOT$X" "$(pwd)"`}, Env: []string{"X=2"}})
	assert.Equal(t, string(res.Stdout), strings.Join([]string{
		filepath.Join(s.dir, "home"), filepath.Join(s.dir, "tmp"), "12", filepath.Join(s.dir, "home"),
	}, "|"))
	assert.Equal(t, *res.ExitCode, 0)

	assert.NilError(t, os.WriteFile(filepath.Join(s.dir, "tmp", "run.sh"), []byte("cat; exit 5"), 0o644))
	res = run(t, s, sandboxkit.ExecSpec{Argv: []string{"/bin/sh", "/tmp/run.sh"}, Stdin: []byte("piped"), Workdir: "/tmp"})
	assert.Equal(t, string(res.Stdout), "piped")
	assert.Equal(t, *res.ExitCode, 5)

	res = run(t, s, sandboxkit.ExecSpec{Argv: []string{"sdktest-no-such-program"}})
	assert.Equal(t, *res.ExitCode, 127)
	assert.Check(t, is.Contains(string(res.Stderr), "command not found"))
	res = run(t, s, sandboxkit.ExecSpec{Argv: []string{"/tmp/run.sh"}})
	assert.Equal(t, *res.ExitCode, 126, "a file without the exec bit")
	res = run(t, s, sandboxkit.ExecSpec{Argv: []string{"/tmp/nothing.sh"}})
	assert.Equal(t, *res.ExitCode, 127)

	_, err := s.Exec(ctx, sandboxkit.ExecSpec{Argv: []string{"true"}, Workdir: "/nowhere", Timeout: time.Minute})
	assert.Equal(t, code(t, err), contract.S211)
	res = run(t, s, sandboxkit.ExecSpec{Argv: []string{"/bin/sh", "-c", "kill -9 $$"}})
	assert.Check(t, res.ExitCode == nil, "killed by a signal: no exit code")
}

func TestExecTimeoutKillsTheGroup(t *testing.T) {
	t.Parallel()
	p, _ := configured(t)
	s := boot(t, p, "shell")
	pidFile := filepath.Join(s.dir, "tmp", "child.pid")
	res := run(t, s, sandboxkit.ExecSpec{
		Argv:    []string{"/bin/sh", "-c", "sleep 300 & echo $! > $TMPDIR/child.pid; wait"},
		Timeout: 200 * time.Millisecond,
	})
	assert.Check(t, res.TimedOut)
	assert.Check(t, res.ExitCode == nil)
	b, err := os.ReadFile(pidFile)
	assert.NilError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	assert.NilError(t, err)
	waitGone(t, pid)
}

func TestStopKillsBackgroundProcesses(t *testing.T) {
	t.Parallel()
	p, _ := configured(t)
	s := boot(t, p, "shell")
	res := run(t, s, sandboxkit.ExecSpec{Argv: []string{"/bin/sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"}})
	pid, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	assert.NilError(t, err)
	res = run(t, s, sandboxkit.ExecSpec{Argv: []string{"/bin/sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!"}})
	escaped, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	assert.NilError(t, err)
	assert.NilError(t, syscall.Kill(pid, 0), "the background process runs until the sandbox stops")
	assert.NilError(t, s.Stop(ctx, true))
	waitGone(t, pid)
	waitGone(t, escaped)
}

func TestExecOutputCap(t *testing.T) {
	t.Parallel()
	p, _ := configured(t)
	s := boot(t, p, "shell")
	big := strings.Repeat("y", 3<<20)
	res := run(t, s, sandboxkit.ExecSpec{Argv: []string{"cat"}, Stdin: []byte(big)})
	assert.Equal(t, len(res.Stdout), contract.ExecOutputCap)
	assert.Check(t, res.StdoutTruncated && !res.StderrTruncated)
}

func TestExecAfterStop(t *testing.T) {
	t.Parallel()
	p, _ := configured(t)
	s := boot(t, p, "shell")
	assert.NilError(t, s.Stop(ctx, true))
	_, err := s.Exec(ctx, sandboxkit.ExecSpec{Argv: []string{"true"}, Timeout: time.Minute})
	assert.ErrorContains(t, err, "stopped")
}

func TestExecCancelled(t *testing.T) {
	t.Parallel()
	p, _ := configured(t)
	s := boot(t, p, "shell")
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		time.Sleep(100 * time.Millisecond)
		cancel()
	}()
	_, err := s.Exec(cctx, sandboxkit.ExecSpec{Argv: []string{"sleep", "300"}, Timeout: time.Hour})
	assert.Check(t, errors.Is(err, context.Canceled))
}

// waitGone waits for a process to be gone (or a zombie our test cannot
// reap, which counts: it no longer runs).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return poll.Success()
		}
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && strings.Contains(string(b), ") Z ") {
			return poll.Success()
		}
		return poll.Continue("process %d still runs", pid)
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(10*time.Millisecond))
}
