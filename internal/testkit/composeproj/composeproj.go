// Package composeproj runs a Compose project the way a user does: a real
// `iii compose --up` with a managed engine in a directory of the test's
// own, its state directory and HOME private, packages coming from the
// default registry beside the iii under test (no $III_* of the test's
// environment leaks in). It is the plumbing of the standard workers'
// acceptance tests (tests/httpworker; tests/stateworker has the same
// shape inline).
package composeproj

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/icmd"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
	"github.com/iii-sandbox/iii/internal/testkit/procscan"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
)

// Deadlines: hang guards, not timings.
const (
	ReadyWait = 2 * time.Minute
	StopWait  = 2 * time.Minute
	CallWait  = time.Minute
)

// Options describe a project.
type Options struct {
	// III is the iii binary; registry/ beside it is the default registry.
	III string
	// Files are written into the project directory (relative paths).
	Files map[string][]byte
	// Compose is the worker-compose.yaml for the engine's port.
	Compose func(enginePort int) string
	// Env is added to the project's environment (e.g. III_SDK_URL).
	Env []string
}

// Project is a running `iii compose --up`.
type Project struct {
	III                 string
	Dir, Home, StateDir string
	Port                int // the engine's
	Env                 []string
	Out, ErrOut         syncbuf.Buffer
	cmd                 *exec.Cmd
	exited              chan error
}

// Start writes the project and runs `iii compose --up` in it; clean-up
// stops it (SIGTERM, then SIGKILL past StopWait), logs the project's logs
// when the test failed, and kills anything of it left behind.
func Start(t *testing.T, o Options) *Project {
	t.Helper()
	port, err := loopback.FreePort()
	assert.NilError(t, err)
	p := &Project{III: o.III, Dir: t.TempDir(), Home: t.TempDir(), StateDir: t.TempDir(), Port: port, exited: make(chan error, 1)}
	for name, b := range o.Files {
		f := filepath.Join(p.Dir, name)
		assert.NilError(t, os.MkdirAll(filepath.Dir(f), 0o755))
		assert.NilError(t, os.WriteFile(f, b, 0o644))
	}
	assert.NilError(t, os.WriteFile(filepath.Join(p.Dir, "worker-compose.yaml"), []byte(o.Compose(port)), 0o644))
	p.Env = append([]string{"HOME=" + p.Home, "III_COMPOSE_STATE_DIR=" + p.StateDir}, o.Env...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "III_") {
			p.Env = append(p.Env, kv)
		}
	}
	p.launch(t)
	return p
}

// Restart runs `iii compose --up` again in the project's directory, with
// its HOME, state directory and engine port, after Stop: the engine and
// every worker start anew on what the last run left on disk.
func (p *Project) Restart(t *testing.T) *Project {
	t.Helper()
	n := &Project{III: p.III, Dir: p.Dir, Home: p.Home, StateDir: p.StateDir, Port: p.Port, Env: p.Env, exited: make(chan error, 1)}
	n.launch(t)
	return n
}

// launch starts `iii compose --up`; clean-up stops it.
func (p *Project) launch(t *testing.T) {
	t.Helper()
	p.cmd = exec.Command(p.III, "compose", "--up")
	p.cmd.Dir, p.cmd.Env, p.cmd.Stdout, p.cmd.Stderr = p.Dir, p.Env, &p.Out, &p.ErrOut
	assert.NilError(t, p.cmd.Start())
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case err := <-p.exited:
			p.exited <- err
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(StopWait):
				_ = p.cmd.Process.Kill()
				select {
				case <-p.exited:
				case <-time.After(StopWait):
					t.Errorf("iii compose did not exit after SIGKILL")
				}
			}
		}
		if t.Failed() {
			t.Logf("iii compose stdout:\n%s\nstderr:\n%s", p.Out.Tail(60), p.ErrOut.Tail(60))
			for _, f := range p.LogFiles() {
				if b, err := os.ReadFile(f); err == nil {
					t.Logf("%s:\n%s", f, Tail(string(b), 40))
				}
			}
		}
		for _, marker := range []string{p.Dir, p.StateDir} {
			for _, pid := range procscan.Naming(marker) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
}

// LogFiles are the containers' logs and the engine's.
func (p *Project) LogFiles() []string {
	logs, _ := filepath.Glob(filepath.Join(p.StateDir, "*", "*", "logs", "*.log"))
	eng, _ := filepath.Glob(filepath.Join(p.StateDir, "*", "*", "engine.log"))
	return append(logs, eng...)
}

// Log is a container's log so far ("" when none yet).
func (p *Project) Log(container string) string {
	var out strings.Builder
	files, _ := filepath.Glob(filepath.Join(p.StateDir, "*", "*", "logs", container+"*.log"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		out.Write(b)
	}
	return out.String()
}

// Tail is the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Call runs `iii call` in the project's directory (which holds the
// project token) with fn resolved in namespace default.
func (p *Project) Call(fn string, args ...string) *icmd.Result {
	return p.CallNS("default", fn, args...)
}

// CallNS is Call in namespace ns.
func (p *Project) CallNS(ns, fn string, args ...string) *icmd.Result {
	argv := append([]string{"call", "-n", ns, "--port", strconv.Itoa(p.Port), fn}, args...)
	return icmd.RunCmd(icmd.Command(p.III, argv...), icmd.WithEnv(p.Env...), icmd.Dir(p.Dir), icmd.WithTimeout(CallWait))
}

// MustCall is Call that must succeed; its stdout.
func (p *Project) MustCall(t *testing.T, fn string, args ...string) string {
	t.Helper()
	res := p.Call(fn, args...)
	res.Assert(t, icmd.Success)
	return res.Stdout()
}

// Exited reports whether iii compose has exited (and how).
func (p *Project) Exited() (error, bool) {
	select {
	case err := <-p.exited:
		p.exited <- err
		return err, true
	default:
		return nil, false
	}
}

// WaitReady waits until compose::status says every named container is ready.
func (p *Project) WaitReady(t *testing.T, containers ...string) {
	t.Helper()
	p.WaitReadyNS(t, "default", ReadyWait, 200*time.Millisecond, containers...)
}

// WaitReadyNS is WaitReady for a Compose serving in namespace ns, waiting
// up to timeout and polling every delay (VM workers under TCG take
// minutes).
func (p *Project) WaitReadyNS(t *testing.T, ns string, timeout, delay time.Duration, containers ...string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if err, ok := p.Exited(); ok {
			return poll.Error(fmt.Errorf("iii compose exited: %v", err))
		}
		res := p.CallNS(ns, "compose::status")
		if res.ExitCode != 0 {
			return poll.Continue("compose::status: %s", res.Combined())
		}
		var st struct {
			Containers []struct{ Container, State string } `json:"containers"`
		}
		if err := json.Unmarshal([]byte(res.Stdout()), &st); err != nil {
			return poll.Continue("compose::status: %v", err)
		}
		ready := map[string]bool{}
		for _, c := range st.Containers {
			ready[c.Container] = c.State == "ready"
		}
		for _, c := range containers {
			if !ready[c] {
				return poll.Continue("%s not ready: %s", c, res.Stdout())
			}
		}
		return poll.Success()
	}, poll.WithTimeout(timeout), poll.WithDelay(delay))
}

// Stop sends SIGTERM to Compose and waits for a clean exit.
func (p *Project) Stop(t *testing.T) {
	t.Helper()
	assert.NilError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-p.exited:
		p.exited <- err
		assert.NilError(t, err, "iii compose after SIGTERM")
	case <-time.After(StopWait):
		t.Fatalf("iii compose did not stop within %s of SIGTERM", StopWait)
	}
}

// Package is a registry worker built from this repository.
type Package struct {
	Name, Version, GoPackage, DefaultConfig string
}

// BuildRegistry builds iii and pkgs into dir and publishes pkgs into
// dir/registry, the default registry of dir/iii; it returns dir/iii.
// Acceptance tests use it when $III_BIN_DIR (make test's bin/) is unset.
func BuildRegistry(dir string, pkgs ...Package) (string, error) {
	iii := filepath.Join(dir, "iii")
	if b, err := bins.GoBuild(iii, "github.com/iii-sandbox/iii/cmd/iii", nil); err != nil {
		return "", fmt.Errorf("build iii: %v\n%s", err, b)
	}
	for _, pk := range pkgs {
		bin := filepath.Join(dir, pk.Name)
		if b, err := bins.GoBuild(bin, pk.GoPackage, nil); err != nil {
			return "", fmt.Errorf("build %s: %v\n%s", pk.GoPackage, err, b)
		}
		if _, err := registry.Publish(filepath.Join(dir, "registry"), registry.Publication{
			Name: pk.Name, Version: pk.Version, Kind: registry.KindBinary,
			Target:        registry.HostPlatform().Target(),
			Files:         []registry.PublishFile{{Path: bin}},
			DefaultConfig: []byte(pk.DefaultConfig),
			Tags:          []string{registry.TagLatest},
		}); err != nil {
			return "", fmt.Errorf("publish %s: %w", pk.Name, err)
		}
	}
	return iii, nil
}

// EnvBinDir names the directory `make build` filled (make test sets it):
// its iii, and registry/ beside it.
const EnvBinDir = "III_BIN_DIR"

// Main is the TestMain of an acceptance test of registry workers: it sets
// *iii to the binary under test and runs m. Under $III_BIN_DIR that is its
// iii, whose registry must hold every package of pkgs (make build
// publishes them); otherwise it builds iii and pkgs from this tree into a
// temporary directory and publishes them there (BuildRegistry). With
// -short, or while fuzzing, it only runs m.
func Main(m *testing.M, iii *string, pkgs ...Package) int {
	if testing.Short() || bins.Fuzzing() {
		return m.Run()
	}
	if dir := os.Getenv(EnvBinDir); dir != "" {
		*iii = filepath.Join(dir, "iii")
		for _, pk := range pkgs {
			if _, err := os.Stat(filepath.Join(dir, "registry", "packages", pk.Name, "index.json")); err != nil {
				fmt.Fprintf(os.Stderr, "%s: the %s package is not published (%v): run make build\n", EnvBinDir, pk.Name, err)
				return 1
			}
		}
		return m.Run()
	}
	work, err := os.MkdirTemp("", "iii-accept-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(work)
	if *iii, err = BuildRegistry(work, pkgs...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// StartNodeApp runs the standard workers' acceptance project: the test's
// Node app (testdata/app/app.mjs, on the pinned iii-sdk 0.22.1, which it
// imports from $III_SDK_URL) as container `app`, and containers (the
// containers: block's further entries, indented by two), in the default
// namespace: that SDK knows no namespaces, so its calls resolve in
// "default" (docs/standard-workers.md).
func StartNodeApp(t *testing.T, iii, containers string) *Project {
	t.Helper()
	sdk := nodesdk.Find(t)
	app, err := os.ReadFile(filepath.Join("testdata", "app", "app.mjs"))
	assert.NilError(t, err)
	return Start(t, Options{
		III:   iii,
		Files: map[string][]byte{"app/app.mjs": app},
		Env:   []string{"III_SDK_URL=" + sdk.URL},
		Compose: func(port int) string {
			return fmt.Sprintf(`stop_timeout: 5s
engine:
  url: ws://127.0.0.1:%d
  workers: {}
containers:
  app:
    worker: path://./app
    scripts: { run: '%s app.mjs' }
    environment: { III_SDK_URL: '${III_SDK_URL}' }
%s`, port, sdk.Node, containers)
		},
	})
}
