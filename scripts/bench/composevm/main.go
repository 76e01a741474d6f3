// Command composevm measures `iii compose --up` of a project with one VM
// worker, from the moment the command starts until the worker is ready,
// beside its floor measured in the same run: a raw sandbox::create of the
// same image through the same engine and adapter (a VM booted to its guest
// agent, nothing copied, installed or registered).
//
//	first the first --up on a fresh state and cache: the managed engine,
//	      the adapter package installed from a directory registry, the
//	      adapter started, the image unpacked and its root file system
//	      built, the initramfs built, then what cold does; printed, not
//	      the row's figure: the floor does not pay the image either
//	cold  --up after the worker's state directory was deleted (Compose
//	      stopped): a new worker, whose disk is a copy of the one the
//	      first --up kept in the adapter's install cache right after its
//	      install step (same project, worker and install inputs), its
//	      directory copied in, its command until the worker registers in
//	      the project namespace
//	cold, install cache empty
//	      as cold with the install cache deleted too: a fresh disk, the
//	      install step (the Node SDK laid out), the disk kept in the
//	      cache; printed beside cold
//	warm  --up again (Compose stopped in between): the disk keeps the
//	      install step's result, so boot, copy and the command remain
//	floor sandbox::create {image: <the worker's image>} until it returns
//
// The worker is the Node iii-sdk worker of the Compose tests
// (compose/daemon/testdata/vmworker) on the Debian-built node image: run
// scripts/build-images.sh and make setup-test first. From the repository
// root:
//
//	go run ./scripts/bench/composevm [-runs 3]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/adapter"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/runner"
)

// image is the preset the worker and the floor boot.
const image = "docker.io/iiidev/node:latest"

// readyWait bounds one --up; a cold one installs the package and the image.
const readyWait = 10 * time.Minute

// installCacheDir is the adapter's install cache in its state_dir
// (workervm's diskCacheDirName).
const installCacheDir = "worker-disks"

func main() {
	runs := flag.Int("runs", 3, "warm --up runs and floor creates; the median is printed")
	flag.Parse()
	if err := run(*runs); err != nil {
		fmt.Fprintln(os.Stderr, "composevm bench:", err)
		os.Exit(1)
	}
}

type bench struct {
	iii, project, port string
	// stateDir is the adapter's state_dir.
	stateDir string
	env      []string
}

// forgetWorkers deletes the worker VMs' state directories (disk, log,
// record) while Compose, and with it the adapter, is stopped: the next
// --up starts the worker as a new one.
func (b *bench) forgetWorkers() error {
	dir := filepath.Join(b.stateDir, runner.WorkersDirName)
	des, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("the worker state directories: %w", err)
	}
	if len(des) == 0 {
		return fmt.Errorf("no worker state directory in %s after the first --up", dir)
	}
	for _, de := range des {
		if err := os.RemoveAll(filepath.Join(dir, de.Name())); err != nil {
			return fmt.Errorf("delete the worker's state: %w", err)
		}
	}
	return nil
}

func run(runs int) error {
	if runs < 1 {
		return errors.New("-runs must be at least 1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	// Short: the adapter keeps unix sockets under its state directory.
	work, err := os.MkdirTemp("/tmp", "cvmb")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	b, err := setup(work)
	if err != nil {
		return err
	}

	first, firstStages, err := b.up(ctx)
	if err != nil {
		return fmt.Errorf("first --up: %w", err)
	}
	// The image and the initramfs stay made; only the worker starts
	// afresh: a new disk, the install step again.
	if err := b.forgetWorkers(); err != nil {
		return err
	}
	cold, coldStages, err := b.up(ctx)
	if err != nil {
		return fmt.Errorf("cold --up: %w", err)
	}
	// A new worker with nothing cached: the install step runs again, and
	// its disk is kept in the cache (for the same key as before).
	if err := b.forgetWorkers(); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(b.stateDir, installCacheDir)); err != nil {
		return fmt.Errorf("delete the install cache: %w", err)
	}
	coldMiss, coldMissStages, err := b.up(ctx)
	if err != nil {
		return fmt.Errorf("cold --up, install cache empty: %w", err)
	}
	var warm, floor []time.Duration
	var warmStages []stage
	for i := range runs {
		d, st, err := b.up(ctx)
		if err != nil {
			return fmt.Errorf("warm --up run %d: %w", i+1, err)
		}
		warm = append(warm, d)
		warmStages = st
	}
	// The floor runs on an engine and adapter Compose started, left up.
	stop, err := b.start(ctx)
	if err != nil {
		return err
	}
	defer stop()
	c, err := client.Dial(ctx, "ws://127.0.0.1:"+b.port, client.Options{Name: "composevm-bench", IgnoreEnv: true,
		Reconnect: client.ReconnectPolicy{Disable: true}})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(context.Background()) }()
	var hv string
	if raw, err := c.Call(ctx, "sandbox-libkrun::adapter::info", nil); err == nil {
		var info struct{ Hypervisor, Accel string }
		if json.Unmarshal(raw, &info) == nil {
			hv = info.Hypervisor + " with " + info.Accel
		}
	}
	for i := range runs {
		d, err := create(ctx, c)
		if err != nil {
			return fmt.Errorf("floor run %d: %w", i+1, err)
		}
		floor = append(floor, d)
	}

	fmt.Printf("host: %s/%s, %d CPUs, load average %s; VM: %s, %s; median of %d runs\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), benchstat.LoadAvg(), hv, image, runs)
	f := benchstat.Median(floor)
	fmt.Printf("  %-44s %9s\n", "floor: sandbox::create of the same image", f.Round(time.Millisecond))
	fmt.Printf("  %-44s %9s   %.1f× the floor (once)\n", "first --up (image, initramfs, then as cold)", first.Round(time.Millisecond), ratio(first, f))
	fmt.Printf("  %-44s %9s   %.1f× the floor (once)\n", "iii compose --up, cold (new worker, cached disk)", cold.Round(time.Millisecond), ratio(cold, f))
	fmt.Printf("  %-44s %9s   %.1f× the floor (once)\n", "cold, install cache empty (fresh disk, install)", coldMiss.Round(time.Millisecond), ratio(coldMiss, f))
	fmt.Printf("  %-44s %9s   %.1f× the floor\n", "iii compose --up, warm (disk kept)", benchstat.Median(warm).Round(time.Millisecond), ratio(benchstat.Median(warm), f))
	printStages("first", firstStages)
	printStages("cold", coldStages)
	printStages("cold, install cache empty", coldMissStages)
	printStages("warm (the last run)", warmStages)
	return nil
}

// stage is one of the adapter's notes in the worker's log (worker.log,
// JSON lines), at its time since `iii compose --up` started.
type stage struct {
	at   time.Duration
	note string
}

// stages reads the notes the adapter wrote into the worker's log since
// start: where a start's time goes (the VM's start, the copy, the install,
// the command), beside when Compose reported the worker ready.
func stages(logPath string, start time.Time) []stage {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return nil
	}
	var out []stage
	for _, line := range strings.Split(string(data), "\n") {
		var e struct {
			Time, Stream, Message string
		}
		if json.Unmarshal([]byte(line), &e) != nil || e.Stream != "system" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, e.Time)
		if err != nil || t.Before(start) {
			continue
		}
		out = append(out, stage{at: t.Sub(start), note: e.Message})
	}
	return out
}

func printStages(which string, st []stage) {
	if len(st) == 0 {
		return
	}
	fmt.Printf("  %s: the adapter's notes, since `iii compose --up` started\n", which)
	for _, s := range st {
		note := s.note
		// The step timings are the point of the breakdown: whole.
		if len(note) > 100 && !strings.HasPrefix(note, "boot steps:") {
			note = note[:100] + "…"
		}
		fmt.Printf("    %9s  %s\n", s.at.Round(time.Millisecond), note)
	}
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

// setup builds iii, the adapter and its guest agent, publishes the adapter
// into a directory registry, and lays out the project.
func setup(work string) (*bench, error) {
	bin := filepath.Join(work, "bin")
	for _, b := range []struct {
		out, pkg string
		env      []string
	}{
		{"iii", "./cmd/iii", nil},
		{"sandbox-libkrun", "./plugins/sandbox-libkrun/cmd/sandbox-libkrun", nil},
		{adapter.AgentName(runtime.GOARCH), "./plugins/sandbox-libkrun/cmd/iii-guest-agent", []string{"CGO_ENABLED=0", "GOOS=linux"}},
	} {
		cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(bin, b.out), b.pkg)
		cmd.Env = append(os.Environ(), b.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build %s (run from the repository root): %v\n%s", b.out, err, out)
		}
	}
	reg := filepath.Join(work, "registry")
	if _, err := registry.Publish(reg, registry.Publication{
		Name: "sandbox-libkrun", Kind: registry.KindBinary, Version: adapter.Version, Target: registry.HostPlatform().Target(),
		Files: []registry.PublishFile{{Path: filepath.Join(bin, "sandbox-libkrun")}, {Path: filepath.Join(bin, adapter.AgentName(runtime.GOARCH))}},
		Tags:  []string{registry.TagLatest}, Now: time.Now(),
	}); err != nil {
		return nil, err
	}
	root, err := images.DefaultRoot()
	if err != nil {
		return nil, err
	}
	// The adapter reads the presets from the local OCI layout.
	cache := filepath.Join(work, "cache")
	if err := dirs.ImageCache(cache, filepath.Join(root, "oci")); err != nil {
		return nil, err
	}
	sdk, err := nodesdk.Modules(".")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	project := filepath.Join(work, "p")
	wdir := filepath.Join(project, "w")
	if err := os.MkdirAll(wdir, 0o755); err != nil {
		return nil, err
	}
	stateDir := filepath.Join(work, "s")
	file := fmt.Sprintf(`engine:
  url: ws://127.0.0.1:%s
  workers: {}
containers:
  sandbox-libkrun:
    worker: package://sandbox-libkrun
    version: '%s'
    config_override:
      image_allowlist: [node]
      state_dir: %s
      cache_dir: %s
      worker_disk_mb: 1024
      boot_timeout_ms: 300000
  w:
    worker: path://./w
    startup_timeout: 8m
`, port, adapter.Version, stateDir, cache)
	files := map[string]string{
		filepath.Join(project, "worker-compose.yaml"): file,
		filepath.Join(wdir, "iii.worker.yaml"):        "name: w\nruntime:\n  base_image: " + image + "\nscripts:\n  install: node unpack.mjs\n  start: node worker.mjs\n",
	}
	data, err := os.ReadFile(filepath.Join("compose", "daemon", "testdata", "vmworker", "worker.mjs"))
	if err != nil {
		return nil, err
	}
	files[filepath.Join(wdir, "worker.mjs")] = string(data)
	for p, content := range files {
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	if err := nodesdk.WriteWorkerFiles(wdir, sdk); err != nil {
		return nil, err
	}
	home := filepath.Join(work, "h")
	if err := os.MkdirAll(home, 0o755); err != nil {
		return nil, err
	}
	env := []string{"HOME=" + home, "III_REGISTRY=" + reg}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "III_") {
			env = append(env, kv)
		}
	}
	return &bench{iii: filepath.Join(bin, "iii"), project: project, port: port, stateDir: stateDir, env: env}, nil
}

// up times one `iii compose --up` until the worker is ready, then stops
// it; it also returns the adapter's notes of that start (stages).
func (b *bench) up(ctx context.Context) (time.Duration, []stage, error) {
	start := time.Now()
	stop, err := b.start(ctx)
	if err != nil {
		return 0, nil, err
	}
	d := time.Since(start)
	_, logPath, _ := status(ctx, b.port)
	st := append(stages(logPath, start), stage{at: d, note: "compose::status says ready"})
	stop()
	return d, st, nil
}

// start runs `iii compose --up` until the worker is ready; stop sends
// SIGINT and waits for Compose to exit.
func (b *bench) start(ctx context.Context) (stop func(), err error) {
	cmd := exec.CommandContext(ctx, b.iii, "compose", "--up")
	cmd.Dir, cmd.Env = b.project, b.env
	out, err := os.Create(filepath.Join(filepath.Dir(b.project), "compose.out"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(2 * time.Minute):
			_ = cmd.Process.Kill()
			<-exited
		}
		out.Close()
	}
	deadline := time.Now().Add(readyWait)
	for {
		select {
		case err := <-exited:
			exited <- err
			stop()
			log, _ := os.ReadFile(out.Name())
			return nil, fmt.Errorf("iii compose --up exited (%v):\n%s", err, tail(string(log), 30))
		default:
		}
		if st, _, _ := status(ctx, b.port); st == "ready" {
			return stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			log, _ := os.ReadFile(out.Name())
			return nil, fmt.Errorf("the worker was not ready within %s:\n%s", readyWait, tail(string(log), 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// status is the state compose::status gives the worker w, and its log.
func status(ctx context.Context, port string) (state, logPath string, err error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := client.Dial(cctx, "ws://127.0.0.1:"+port, client.Options{Name: "composevm-probe-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		IgnoreEnv: true, Reconnect: client.ReconnectPolicy{Disable: true}, DialTimeout: 2 * time.Second})
	if err != nil {
		return "", "", err
	}
	defer func() { _ = c.Close(cctx) }()
	raw, err := c.Call(cctx, "compose::status", nil)
	if err != nil {
		return "", "", err
	}
	var st struct {
		Containers []struct {
			Container, State string
			Owned            bool
			LogPath          string `json:"log_path"`
		} `json:"containers"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return "", "", err
	}
	for _, c := range st.Containers {
		if c.Container == "w" && c.Owned {
			return c.State, c.LogPath, nil
		}
	}
	return "", "", nil
}

// create times one sandbox::create of the image, then stops the sandbox.
func create(ctx context.Context, c *client.Client) (time.Duration, error) {
	start := time.Now()
	raw, err := c.Call(ctx, "sandbox::create", map[string]any{"image": "node"}, client.WithTimeout(readyWait))
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	var created struct {
		SandboxID string `json:"sandbox_id"`
	}
	if err := json.Unmarshal(raw, &created); err != nil {
		return 0, err
	}
	_, err = c.Call(ctx, "sandbox::stop", map[string]any{"sandbox_id": created.SandboxID, "wait": true})
	return d, err
}

func freePort() (string, error) {
	p, err := loopback.FreePort()
	return strconv.Itoa(p), err
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
