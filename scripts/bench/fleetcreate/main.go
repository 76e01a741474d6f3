// Command fleetcreate measures how sandbox creates scale over the hosts of
// a fleet (issue 14, figure R2): one engine (iii built from this tree)
// bound to sandbox: {adapter: sandbox-libkrun, hosts: '*'}, and one, two,
// then three sandbox-libkrun hosts (`serve --fleet`, real VMs under QEMU)
// connected to it over WebSocket on loopback. For each fleet size, 2 ×
// hosts callers loop create → stop through the engine for -duration, and
// the creates completed per second are printed beside the one-host figure
// of the same run (the floor).
//
// Each host is warmed first (calls straight to its own
// <adapter>::host::<name>::sandbox::create until its snapshot template of
// the python image is recorded), so every round measures the creates users
// get once a host has run a while; -cold turns templates off and measures
// cold boots instead.
//
// The VMs run under TCG on this machine's two cores: a second and a third
// host add adapters and QEMUs, not CPUs, so the figure shows what the
// fleet layer lets through, and on real hosts (one machine each) the rate
// grows with the hosts.
//
//	go run ./scripts/bench/fleetcreate [-duration 40s] [-cold]
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
	"sync"
	"sync/atomic"
	"time"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/enginetoken"
	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/adapter"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images"
)

const adapterName = "sandbox-libkrun"

func main() {
	duration := flag.Duration("duration", 40*time.Second, "measuring time per fleet size")
	cold := flag.Bool("cold", false, "turn snapshot templates off: every create boots")
	maxHosts := flag.Int("hosts", 3, "largest fleet")
	keep := flag.Bool("keep", false, "keep the work directory (logs, state) and print its path")
	flag.Parse()
	if err := run(*duration, *cold, *maxHosts, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "fleetcreate bench:", err)
		os.Exit(1)
	}
}

type bench struct {
	work, bin, iii, cache, token, credFile, url string
	cold                                        bool
	caller                                      *client.Client
	stops                                       []func()
}

func run(duration time.Duration, cold bool, maxHosts int, keep bool) (err error) {
	if maxHosts < 1 || duration <= 0 {
		return errors.New("-hosts must be at least 1 and -duration positive")
	}
	work, err := os.MkdirTemp("/tmp", "flc") // short: unix sockets live in the state dirs
	if err != nil {
		return err
	}
	if keep {
		fmt.Println("work directory (kept):", work)
	} else {
		defer os.RemoveAll(work)
	}
	b := &bench{work: work, bin: filepath.Join(work, "bin"), cold: cold}
	defer func() {
		for i := len(b.stops) - 1; i >= 0; i-- {
			b.stops[i]()
		}
	}()
	defer func() {
		if err != nil {
			// The logs say why a host went away.
			for _, name := range []string{"engine", "h1", "h2", "h3"} {
				if raw, rerr := os.ReadFile(filepath.Join(work, name+".log")); rerr == nil {
					fmt.Fprintf(os.Stderr, "--- %s.log (tail)\n%s\n", name, tail(raw, 30))
				}
			}
		}
	}()
	if err := b.setup(); err != nil {
		return err
	}
	ctx := context.Background()
	rates := []float64{}
	for n := 1; n <= maxHosts; n++ {
		name := fmt.Sprintf("h%d", n)
		if err := b.startHost(ctx, name); err != nil {
			return err
		}
		if err := b.warm(ctx, name); err != nil {
			return err
		}
		busy0, total0 := cpuTimes()
		creates, elapsed, err := b.measure(ctx, 2*n, duration)
		if err != nil {
			return err
		}
		busy1, total1 := cpuTimes()
		rate := float64(creates) / elapsed.Seconds()
		rates = append(rates, rate)
		cpu := 0.0
		if total1 > total0 {
			cpu = 100 * float64(busy1-busy0) / float64(total1-total0)
		}
		fmt.Printf("  %d host(s), %d callers: %d creates in %s = %.2f creates/s (machine CPU busy %.0f%% of %d cores) | floor (1 host, same run) %.2f/s | ratio %.2fx\n",
			n, 2*n, creates, elapsed.Round(time.Millisecond), rate, cpu, runtime.NumCPU(), rates[0], rate/rates[0])
	}
	return nil
}

// setup builds the binaries, links the image store and starts the engine.
func (b *bench) setup() error {
	if _, err := bins.SandboxLibkrun(".", b.bin, adapter.AgentName(runtime.GOARCH)); err != nil {
		return err
	}
	b.iii = filepath.Join(b.bin, "iii")
	if out, err := bins.GoBuild(b.iii, "./cmd/iii", nil); err != nil {
		return fmt.Errorf("build iii (run from the repository root): %v\n%s", err, out)
	}
	root, err := images.DefaultRoot()
	if err != nil {
		return err
	}
	b.cache = filepath.Join(b.work, "cache")
	if err := dirs.ImageCache(b.cache, filepath.Join(root, "oci")); err != nil {
		return err
	}
	if b.token, err = enginetoken.New(); err != nil {
		return err
	}
	b.credFile = filepath.Join(b.work, "token")
	if err := os.WriteFile(b.credFile, []byte(b.token), 0o600); err != nil {
		return err
	}
	port, err := loopback.FreePort()
	if err != nil {
		return err
	}
	home := filepath.Join(b.work, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	cfg := fmt.Sprintf("workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\nsandbox:\n  adapter: %s\n  hosts: '*'\n", port, adapterName)
	if err := os.WriteFile(filepath.Join(home, "config.yaml"), []byte(cfg), 0o600); err != nil {
		return err
	}
	eng := exec.Command(b.iii, "-c", filepath.Join(home, "config.yaml"))
	eng.Dir, eng.Env = home, append(os.Environ(), "HOME="+home, "III_ENGINE_TOKEN="+b.token, "III_PLUGIN_PATH=")
	engLog, err := os.Create(filepath.Join(b.work, "engine.log"))
	if err != nil {
		return err
	}
	eng.Stdout, eng.Stderr = engLog, engLog
	if err := eng.Start(); err != nil {
		return err
	}
	b.stops = append(b.stops, func() { _ = eng.Process.Kill(); _ = eng.Wait() })
	b.url = fmt.Sprintf("ws://127.0.0.1:%d", port)
	deadline := time.Now().Add(time.Minute)
	for {
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := client.Dial(dctx, b.url, client.Options{Name: "fleetcreate-bench", IgnoreEnv: true, Token: b.token,
			Reconnect: client.ReconnectPolicy{Disable: true}, CallTimeout: 10 * time.Minute})
		cancel()
		if err == nil {
			b.caller = c
			b.stops = append(b.stops, func() { _ = c.Close(context.Background()) })
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("engine: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startHost starts one sandbox host and waits for it to serve.
func (b *bench) startHost(ctx context.Context, name string) error {
	cfg := map[string]any{"image_allowlist": []string{"python"}, "cache_dir": b.cache, "state_dir": filepath.Join(b.work, name),
		"default_memory_mb": 256, "max_concurrent_sandboxes": 16, "boot_timeout_ms": 600_000}
	if b.cold {
		cfg["snapshot_templates"] = false
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	cfgFile := filepath.Join(b.work, name+".json")
	if err := os.WriteFile(cfgFile, raw, 0o600); err != nil {
		return err
	}
	host := exec.Command(filepath.Join(b.bin, adapterName), "serve", "--engine", b.url, "--credential-file", b.credFile,
		"--host-name", name, "--fleet", "--config-file", cfgFile)
	log, err := os.Create(filepath.Join(b.work, name+".log"))
	if err != nil {
		return err
	}
	host.Stdout, host.Stderr = log, log
	if err := host.Start(); err != nil {
		return err
	}
	b.stops = append(b.stops, func() { _ = host.Process.Kill(); _ = host.Wait(); _ = log.Close() })
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := b.caller.Call(ctx, contract.HostFunctionID(adapterName, name, contract.OpAdapterInfo), map[string]any{}); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("host %s did not come up: %w", name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// warm creates and stops sandboxes straight on one host until its python
// template is recorded (templates on), or once (cold).
func (b *bench) warm(ctx context.Context, host string) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		raw, err := b.caller.Call(ctx, contract.HostFunctionID(adapterName, host, contract.OpCreate), map[string]any{"image": "python"})
		if err != nil {
			return fmt.Errorf("warm %s: %w", host, err)
		}
		var created contract.CreateResponse
		if err := json.Unmarshal(raw, &created); err != nil {
			return err
		}
		if _, err := b.caller.Call(ctx, contract.HostFunctionID(adapterName, host, contract.OpStop), map[string]any{"sandbox_id": created.SandboxID, "wait": true}); err != nil {
			return fmt.Errorf("warm %s: stop: %w", host, err)
		}
		if b.cold {
			return nil
		}
		info, err := b.caller.Call(ctx, contract.HostFunctionID(adapterName, host, contract.OpAdapterInfo), map[string]any{})
		if err != nil {
			return err
		}
		if templates(info) > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("host %s recorded no template in 5 minutes", host)
		}
		time.Sleep(2 * time.Second)
	}
}

// templates counts the recorded templates in adapter::info, wherever its
// snapshot_templates block sits.
func templates(info json.RawMessage) int {
	var v any
	if json.Unmarshal(info, &v) != nil {
		return 0
	}
	var walk func(any) int
	walk = func(v any) int {
		m, ok := v.(map[string]any)
		if !ok {
			return 0
		}
		if st, ok := m["snapshot_templates"].(map[string]any); ok {
			if l, ok := st["templates"].([]any); ok {
				return len(l)
			}
		}
		for _, c := range m {
			if n := walk(c); n > 0 {
				return n
			}
		}
		return 0
	}
	return walk(v)
}

// measure runs callers create → stop loops through the engine's router
// for d and counts the creates that completed.
func (b *bench) measure(ctx context.Context, callers int, d time.Duration) (int64, time.Duration, error) {
	var creates atomic.Int64
	var firstErr error
	var once sync.Once
	end := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				raw, err := b.caller.Call(ctx, "sandbox::create", map[string]any{"image": "python"})
				if err != nil {
					once.Do(func() { firstErr = fmt.Errorf("create: %w", err) })
					return
				}
				creates.Add(1)
				var created contract.CreateResponse
				if err := json.Unmarshal(raw, &created); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				if _, err := b.caller.Call(ctx, "sandbox::stop", map[string]any{"sandbox_id": created.SandboxID, "wait": true}); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("stop: %w", err) })
					return
				}
			}
		}()
	}
	wg.Wait()
	return creates.Load(), time.Since(start), firstErr
}

// tail is the last n lines of b.
func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// cpuTimes reads the machine's busy and total CPU ticks from /proc/stat
// (0, 0 where there is none).
func cpuTimes() (busy, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0
	}
	for i, f := range fields[1:] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, 0
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}
