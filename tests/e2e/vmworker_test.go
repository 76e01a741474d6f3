package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/flood"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// engineRSSBoundMiB is the engine's documented peak resident memory under
// a flood (docs/security.md, "Memory"; tests/flood holds the same bound).
const engineRSSBoundMiB = 512

// TestComposeVMWorkerAmongHostileNeighbours runs a real `iii compose --up`
// of a project with sandbox-libkrun and a VM worker (a static Go worker,
// internal/testkit/flood/floodworker) while an anonymous local worker
// tries, from the moment the engine listens, to take the adapter's names
// in the project namespace. Every one of its registrations is refused
// FORBIDDEN and no call ever reaches it: Compose's worker::start, with the
// VM worker's engine credential and host directory, goes to the adapter,
// whose gateway forward hands the credential to the engine on the VM's
// behalf (the guest holds no token; the engine's refusal of a call the
// credential does not grant names it). Then the worker floods the engine
// from inside the guest, through that forward: 60 MiB partial frames on
// /otel and channel writers from 10 connections each (1.2 GB promised).
// The engine drops every sender, its peak RSS stays under the documented
// bound, a well-behaved worker's calls all succeed meanwhile, and the VM
// worker itself is still served afterwards.
func TestComposeVMWorkerAmongHostileNeighbours(t *testing.T) {
	t.Parallel()
	s := needVMs(t)

	project := t.TempDir()
	home := dirs.Short(t, "vwh")
	composeState := t.TempDir()
	sbState := dirs.Short(t, "vws")
	assert.NilError(t, os.MkdirAll(filepath.Join(home, ".iii", "cache"), 0o755))
	assert.NilError(t, os.Symlink(s.layout, filepath.Join(home, ".iii", "cache", "oci")))

	floodWorker(t, project)

	port := freePort(t)
	url := fmt.Sprintf("ws://127.0.0.1:%d", port)
	const ns = "shop"
	file := fmt.Sprintf(`namespace: %s
startup_timeout: 600s
engine:
  url: %s
  workers: {}
containers:
  sandbox-libkrun:
    worker: package://sandbox-libkrun
    version: '^0.3'
    config_override:
      image_allowlist: [python]
      state_dir: %s
      boot_timeout_ms: 300000
      worker_disk_mb: 256
  floodworker:
    worker: path://./floodworker
`, ns, url, sbState)
	assert.NilError(t, os.WriteFile(filepath.Join(project, "worker-compose.yaml"), []byte(file), 0o644))

	// The squatter dials from the moment the engine listens, before
	// Compose starts the adapter or the VM worker.
	sq := startSquatter(t, url, ns, []string{
		"sandbox-libkrun::worker::start", "sandbox-libkrun::worker::status", "sandbox-libkrun::worker::stop",
		"sandbox-libkrun::create", "sandbox-libkrun::host::h1::create", "sandbox::create",
	})

	env := []string{"HOME=" + home, "III_COMPOSE_STATE_DIR=" + composeState, "III_REGISTRY=" + s.packages}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "III_") {
			env = append(env, kv)
		}
	}
	var out, errOut syncbuf.Buffer
	compose := exec.Command(s.iii, "compose", "--up")
	compose.Dir, compose.Env, compose.Stdout, compose.Stderr = project, env, &out, &errOut
	assert.NilError(t, compose.Start())
	exited := make(chan error, 1)
	go func() { exited <- compose.Wait() }()
	markers := []string{project, home, composeState, sbState}
	t.Cleanup(func() {
		_ = compose.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(2 * time.Minute):
			_ = compose.Process.Kill()
			waitfor.Recv(t, exited, waitfor.Default, "the killed iii compose to be reaped")
		}
		if t.Failed() {
			t.Logf("iii compose stdout:\n%s\nstderr:\n%s", out.Tail(80), errOut.Tail(60))
			if log, err := os.ReadFile(findEngineLog(composeState)); err == nil {
				t.Logf("engine.log (tail):\n%s", tailLines(string(log), 120))
			}
		}
		for _, p := range procsMarked(markers...) {
			if pid, err := strconv.Atoi(strings.Fields(p)[0]); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})

	waitContainerReady(t, url, ns, "floodworker", exited)
	sq.stop()

	// The squatter got nothing.
	for _, id := range sq.ids {
		assert.Check(t, is.Equal(sq.refusals()[id], engine.CodeForbidden), "registration of %s", id)
	}
	assert.Check(t, is.Len(sq.calls(), 0), "calls reached the squatter: %v", sq.calls())
	assert.Check(t, sq.registeredBeforeAdapter(), "the squatter never registered before the adapter's worker::start")

	cl := dialProbe(t, url)
	call := func(fn string, in any, outv any) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		raw, err := cl.Call(ctx, fn, in, client.WithNamespace(ns))
		if err != nil {
			return err
		}
		return json.Unmarshal(raw, outv)
	}

	// The worker in the guest holds no token, and its connection carries
	// the credential Compose issued for it.
	var who struct {
		TokenEnv []string `json:"token_env"`
		Refusal  string   `json:"refusal"`
		URL      string   `json:"iii_url"`
	}
	assert.NilError(t, call("floodworker::whoami", map[string]any{}, &who))
	assert.Check(t, is.Len(who.TokenEnv, 0), "token variables in the guest: %v", who.TokenEnv)
	assert.Check(t, is.Contains(who.Refusal, `the credential "compose/`+ns+`/floodworker" does not grant it`))
	assert.Check(t, strings.HasPrefix(who.URL, "ws://10.0.2.2:"), "the worker reaches the engine through the gateway: %s", who.URL)

	// The flood from inside the guest.
	pid := managedEnginePID(t, markers)
	assert.NilError(t, os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	prober, err := flood.StartProber(ctx, url)
	assert.NilError(t, err)
	defer prober.Close()
	var started map[string]any
	assert.NilError(t, call("floodworker::flood", map[string]any{"conns": 10}, &started))
	var res struct {
		Running   bool   `json:"running"`
		Offender  string `json:"offender"`
		Violation string `json:"violation"`
	}
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if err := call("floodworker::result", map[string]any{}, &res); err != nil {
			return poll.Error(err)
		}
		if res.Running {
			return poll.Continue("the flood runs")
		}
		return poll.Success()
	}, poll.WithTimeout(8*time.Minute), poll.WithDelay(2*time.Second))
	peak := peakRSSMiB(t, pid)
	lat, fails := prober.Take()
	t.Logf("from the guest: %s; engine peak RSS %d MiB; well-behaved worker: %d calls", res.Offender, peak, len(lat))
	assert.Check(t, res.Violation == "", "the flood from the guest: %s", res.Violation)
	assert.Check(t, peak < engineRSSBoundMiB, "engine peak RSS %d MiB is over the documented %d MiB", peak, engineRSSBoundMiB)
	assert.Check(t, len(fails) == 0, "the well-behaved worker's calls failed: %v", fails)
	assert.Check(t, len(lat) > 0, "no call of the well-behaved worker completed during the flood")

	// The VM worker's own connection was not the one dropped.
	assert.NilError(t, call("floodworker::whoami", map[string]any{}, &who))
	assert.Check(t, is.Len(sq.calls(), 0))
}

// floodWorker puts the floodworker VM worker (internal/testkit/flood/
// floodworker) in project/floodworker: a static binary, so the image needs
// nothing.
func floodWorker(t *testing.T, project string) {
	t.Helper()
	workerDir := filepath.Join(project, "floodworker")
	assert.NilError(t, os.MkdirAll(workerDir, 0o755))
	if out, err := bins.GoBuild(filepath.Join(workerDir, "floodworker"), "github.com/iii-sandbox/iii/internal/testkit/flood/floodworker",
		[]string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64"}); err != nil {
		t.Fatalf("build floodworker: %v\n%s", err, out)
	}
	assert.NilError(t, os.WriteFile(filepath.Join(workerDir, "iii.worker.yaml"),
		[]byte("name: floodworker\nruntime:\n  base_image: python\nscripts:\n  start: exec /workspace/floodworker\n"), 0o644))
}

// waitContainerReady waits until compose::status (in ns) reports container
// ready.
func waitContainerReady(t *testing.T, url, ns, container string, exited chan error) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		select {
		case err := <-exited:
			exited <- err
			return poll.Error(fmt.Errorf("iii compose --up exited: %v", err))
		default:
		}
		st, err := containerState(url, ns, container)
		if err != nil {
			return poll.Continue("compose::status: %v", err)
		}
		if st != "ready" {
			return poll.Continue("%s is %q", container, st)
		}
		return poll.Success()
	}, poll.WithTimeout(2*composeWait), poll.WithDelay(500*time.Millisecond))
}

// dialProbe is a host caller of the test's own.
func dialProbe(t *testing.T, url string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, url, client.Options{Name: "e2e-caller", IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}})
	assert.NilError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// managedEnginePID is the pid of the engine Compose started.
func managedEnginePID(t *testing.T, markers []string) int {
	t.Helper()
	for _, p := range procsMarked(markers...) {
		f := strings.Fields(p)
		if len(f) > 1 && strings.Contains(p, "engine-config.yaml") && !strings.Contains(p, "compose") {
			pid, err := strconv.Atoi(f[0])
			assert.NilError(t, err)
			return pid
		}
	}
	t.Fatalf("no managed engine among:\n%s", strings.Join(procsMarked(markers...), "\n"))
	return 0
}

// peakRSSMiB is a process's resident high-water mark (VmHWM).
func peakRSSMiB(t *testing.T, pid int) int {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	assert.NilError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			assert.NilError(t, err)
			return kb / 1024
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}

// squatter is an anonymous local worker that keeps trying to register a
// sandbox adapter's names.
type squatter struct {
	ids  []string
	done chan struct{}
	quit context.CancelFunc

	mu       sync.Mutex
	refused  map[string]string
	received []string
	// early: a registration was refused while the adapter was not yet
	// running (sandbox-libkrun::adapter::info unknown).
	early bool
}

func startSquatter(t *testing.T, url, ns string, ids []string) *squatter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &squatter{ids: ids, done: make(chan struct{}), quit: cancel, refused: map[string]string{}}
	go s.run(ctx, url, ns)
	t.Cleanup(s.stop)
	return s
}

func (s *squatter) run(ctx context.Context, url, ns string) {
	defer close(s.done)
	for ctx.Err() == nil {
		s.attempt(ctx, url, ns)
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// attempt dials once, registers every id, waits for the refusals and for
// anything that reaches it, and leaves.
func (s *squatter) attempt(ctx context.Context, url, ns string) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	refusals := make(chan *client.RejectionError, len(s.ids))
	c, err := client.Dial(dctx, url, client.Options{Name: "squatter", Namespace: ns, IgnoreEnv: true,
		ConfirmRegistration: true, Reconnect: client.ReconnectPolicy{Disable: true},
		OnRegistrationError: func(err error) {
			var re *client.RejectionError
			if errors.As(err, &re) {
				refusals <- re
			}
		}})
	if err != nil {
		return
	}
	defer c.Close(context.Background())
	// Was the adapter already up? Asked before registering, so "no" means
	// the refusals below came before Compose's worker::start.
	_, infoErr := c.Call(dctx, "sandbox-libkrun::adapter::info", map[string]any{}, client.WithNamespace(ns))
	for _, id := range s.ids {
		_, _ = c.RegisterFunction(client.FunctionDef{ID: id}, func(_ context.Context, inv *client.Invocation) (any, error) {
			s.mu.Lock()
			s.received = append(s.received, inv.FunctionID+" "+string(inv.Data))
			s.mu.Unlock()
			return map[string]any{"stolen": true}, nil
		})
	}
	got := 0
	for got < len(s.ids) {
		select {
		case re := <-refusals:
			got++
			s.mu.Lock()
			s.refused[re.FunctionID] = re.Code
			if infoErr != nil {
				s.early = true
			}
			s.mu.Unlock()
		case <-c.Done():
			return
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
			// Whatever was not refused stays registered a while: a call
			// would reach it now if the engine let it through.
			return
		}
	}
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
	}
}

func (s *squatter) stop() {
	s.quit()
	<-s.done
}

func (s *squatter) refusals() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for k, v := range s.refused {
		out[k] = v
	}
	return out
}

func (s *squatter) calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.received...)
}

func (s *squatter) registeredBeforeAdapter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.early
}
