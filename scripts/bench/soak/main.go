// Command soak runs many sandboxes through the real engine for minutes
// and checks that nothing is lost and nothing grows: the `iii` binary
// built from this tree, bare (a listener and a config.yaml whose sandbox:
// block binds sandbox-libkrun with a warm pool), and the Go client
// (package client, with the engine token found as `iii call` finds it).
//
// Each of -sandboxes workers loops until -duration has passed:
// sandbox::create (python image, the default shape, so it may claim a
// pooled VM), -execs concurrent sandbox::exec that each print a token of
// their own, checked to come back exactly (anything else, or an error, is
// a LOST result), now and then one of them through python3
// (-python-every) and a sandbox::fs::write + fs::read of a file checked
// byte for byte (-fs-every), then sandbox::stop {wait: true}. The round
// under way when the time is up finishes.
//
// At start (pool full, before any worker), every -sample (1m) and at the
// end (every sandbox stopped, pool full again) it samples the engine and
// the adapter (the engine's child): open fds (/proc/<pid>/fd), RSS
// (VmRSS), and goroutines (engine::runtime::stats; adapter::info's
// runtime block), beside the live QEMU processes and the host's
// MemAvailable. It prints the totals, the lost results (must be 0), the
// table, a "flat" verdict per figure (the last sample against the first
// one after warm-up, within the tolerance it prints), and how many
// creates claimed a pooled VM (the adapter's "warm pool VM claimed" log
// lines; creates under 1 s are shown beside them) against cold boots.
//
// Guest memory: the adapter's default_memory_mb (512 MiB) unless -memory
// sets it (it is set as the adapter's default, so creates still claim from
// the pool). Up to -sandboxes + -pool VMs are up at once; see
// BENCHMARKS.md for what they took on the host.
//
// It builds iii, the adapter and the guest agent from this tree. Run
// scripts/build-images.sh first (the python image), then, from the
// repository root:
//
//	go run ./scripts/bench/soak [-sandboxes 32] [-execs 4] [-duration 5m] [-pool 4]
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/loopback"
	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/adapter"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images"
	"github.com/iii-sandbox/iii/protocol"
)

type options struct {
	sandboxes, execs, pool, memoryMB int
	duration, sample                 time.Duration
	pythonEvery, fsEvery             int
	keepLog                          string
	minAvailable                     int64
}

func main() {
	var o options
	flag.IntVar(&o.sandboxes, "sandboxes", 32, "workers, each with one sandbox at a time")
	flag.IntVar(&o.execs, "execs", 4, "concurrent execs per sandbox and round")
	flag.DurationVar(&o.duration, "duration", 5*time.Minute, "how long workers start new rounds")
	flag.IntVar(&o.pool, "pool", 4, "warm_pool: {python: N} (0: no pool)")
	flag.IntVar(&o.memoryMB, "memory", 0, "the adapter's default_memory_mb (0: the adapter's own default, 512)")
	flag.DurationVar(&o.sample, "sample", time.Minute, "time between samples")
	flag.IntVar(&o.pythonEvery, "python-every", 5, "every Nth round one exec runs python3 instead of echo (0: never)")
	flag.IntVar(&o.fsEvery, "fs-every", 3, "every Nth round writes and reads a file (0: never)")
	flag.StringVar(&o.keepLog, "log", "", "copy the engine's log (with the adapter's) to this file at the end")
	minAvail := flag.Int("min-available-mb", 1536, "stop the soak (an error) when the host's MemAvailable falls below this")
	flag.Parse()
	o.minAvailable = int64(*minAvail) << 20
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

const adapterName = "sandbox-libkrun"

// Timeouts of the calls: under TCG with dozens of VMs on two cores one
// boot or python3 start can take minutes.
const (
	createTimeout = 15 * time.Minute
	execTimeout   = 10 * time.Minute
	execGuestMS   = 300_000 // the contract's max_exec_timeout_ms default
	stopTimeout   = 5 * time.Minute
	fsTimeout     = 5 * time.Minute
)

// Flat tolerances: the last sample may exceed the one after warm-up by
// this fraction or this many units, whichever is larger.
const (
	tolFraction   = 0.10
	tolFDs        = 16
	tolGoroutines = 20
	tolRSSBytes   = 32 << 20
	tolRSSFrac    = 0.25 // RSS: the Go heap breathes with the GC
)

func run(o options) (err error) {
	if o.sandboxes < 1 || o.execs < 1 || o.pool < 0 || o.duration <= 0 || o.sample <= 0 {
		return errors.New("-sandboxes and -execs must be at least 1, -pool at least 0, -duration and -sample positive")
	}
	work, err := os.MkdirTemp("/tmp", "soak") // short: the adapter keeps unix sockets in its state dir
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	// Builds and the image store first, with the caller's HOME (the Go
	// cache, the image layout).
	bin := filepath.Join(work, "bin")
	if _, err := bins.SandboxLibkrun(".", bin, adapter.AgentName(runtime.GOARCH)); err != nil {
		return err
	}
	iii := filepath.Join(bin, "iii")
	if out, err := bins.GoBuild(iii, "./cmd/iii", nil); err != nil {
		return fmt.Errorf("build iii (run from the repository root): %v\n%s", err, out)
	}
	root, err := images.DefaultRoot()
	if err != nil {
		return err
	}
	cache := filepath.Join(work, "cache")
	if err := dirs.ImageCache(cache, filepath.Join(root, "oci")); err != nil {
		return err
	}
	// The engine and this process share a HOME of their own: the engine
	// makes its token there, the client finds it there, and the plugin
	// host finds no other sandbox-libkrun before the one beside iii.
	home := filepath.Join(work, "h")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	if err := os.Setenv("HOME", home); err != nil {
		return err
	}
	_ = os.Unsetenv(client.EnvEngineToken)

	port, err := loopback.FreePort()
	if err != nil {
		return err
	}
	cfg := map[string]any{
		"image_allowlist":                 []string{"python"},
		"state_dir":                       filepath.Join(work, "s"),
		"cache_dir":                       cache,
		"max_concurrent_sandboxes":        o.sandboxes,
		"max_concurrent_exec_per_sandbox": o.execs,
		"boot_timeout_ms":                 600_000,
	}
	if o.pool > 0 {
		cfg["warm_pool"] = map[string]any{"python": o.pool}
	}
	if o.memoryMB > 0 {
		cfg["default_memory_mb"] = o.memoryMB
	}
	cfgJSON, err := json.Marshal(cfg) // JSON is YAML
	if err != nil {
		return err
	}
	config := fmt.Sprintf("workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: %d }\nsandbox:\n  adapter: %s\n  namespace: default\n  config: %s\n",
		port, adapterName, cfgJSON)
	if err := os.WriteFile(filepath.Join(work, "config.yaml"), []byte(config), 0o644); err != nil {
		return err
	}
	logPath := filepath.Join(work, "engine.log")
	eng, err := startEngine(iii, work, logPath, port)
	if err != nil {
		return err
	}
	defer func() {
		eng.stop()
		if o.keepLog != "" {
			if b, err := os.ReadFile(logPath); err == nil {
				_ = os.WriteFile(o.keepLog, b, 0o644)
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "the engine's log, its end:\n%s\n", tail(logPath, 3000))
		}
	}()

	ctx := context.Background()
	url := fmt.Sprintf("ws://127.0.0.1:%d", port)
	token, err := client.DiscoverToken(url)
	if err != nil {
		return err
	}
	if token == "" {
		return errors.New("no engine token found under the engine's HOME")
	}
	c, err := client.Dial(ctx, url, client.Options{Name: "soak", IgnoreEnv: true, Token: token,
		Reconnect: client.ReconnectPolicy{Disable: true}})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close(context.Background()) }()

	s := &soak{o: o, c: c, eng: eng, work: work}
	s.adapterPID, err = s.findAdapter()
	if err != nil {
		return err
	}
	mem := o.memoryMB
	if mem == 0 {
		mem = 512
	}
	fmt.Printf("soak: %d sandboxes × %d concurrent execs for %s, warm_pool {python: %d}, %d MiB per VM (at most %d VMs: %.1f GiB of guest RAM if every page were touched)\n",
		o.sandboxes, o.execs, o.duration, o.pool, mem, o.sandboxes+o.pool, float64((o.sandboxes+o.pool)*mem)/1024)

	// The first boot installs the image (and records its snapshot
	// template); the soak starts once the pool is full.
	t0 := time.Now()
	if err := s.waitPool(ctx, 20*time.Minute); err != nil {
		return err
	}
	if o.pool > 0 {
		fmt.Printf("pool full after %s\n", time.Since(t0).Round(time.Second))
	}
	info, err := s.adapterInfo(ctx)
	if err != nil {
		return err
	}
	backend := ""
	if hv, ok := info["hypervisor"].(string); ok {
		backend = fmt.Sprintf(" (%s with %v)", hv, info["accel"])
	}
	fmt.Printf("host: %s/%s, %d CPUs, load average %s, MemAvailable %s; engine pid %d, adapter pid %d%s\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), benchstat.LoadAvg(), mib(memAvailable()), eng.pid(), s.adapterPID, backend)
	if err := s.sampleNow(ctx, "start"); err != nil {
		return err
	}

	start := time.Now()
	deadline := start.Add(o.duration)
	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	var wg sync.WaitGroup
	for w := range o.sandboxes {
		wg.Go(func() { s.worker(ctx, wctx.Done(), w, deadline) })
	}
	// A guard for the host: dozens of VMs must not push it out of memory.
	var lowMem int64 // MemAvailable when the guard stopped the workers
	guard := time.NewTicker(2 * time.Second)
	defer guard.Stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(o.sample)
	var sampleErr error
loop:
	for {
		select {
		case <-done:
			break loop
		case <-tick.C:
			if err := s.sampleNow(ctx, fmt.Sprintf("%dm%02ds", int(time.Since(start).Minutes()), int(time.Since(start).Seconds())%60)); err != nil && sampleErr == nil {
				sampleErr = err
			}
		case <-guard.C:
			if a := memAvailable(); a > 0 && a < o.minAvailable && lowMem == 0 {
				lowMem = a
				fmt.Printf("  MemAvailable %s is below -min-available-mb: stopping the workers\n", mib(a))
				stopWorkers()
			}
		case <-eng.done:
			return errors.New("the engine exited during the soak")
		}
	}
	tick.Stop()
	ran := time.Since(start)
	if err := s.waitPool(ctx, 20*time.Minute); err != nil {
		return err
	}
	// Let stopped VMs' goroutines and descriptors wind down.
	time.Sleep(3 * time.Second)
	if err := s.sampleNow(ctx, "end"); err != nil {
		return err
	}
	if sampleErr != nil {
		return sampleErr
	}
	rerr := s.report(ctx, ran, logPath)
	if lowMem > 0 {
		return fmt.Errorf("stopped early: the host's MemAvailable fell to %s", mib(lowMem))
	}
	return rerr
}

type soak struct {
	o          options
	c          *client.Client
	eng        *engine
	work       string
	adapterPID int

	creates, execs, pyExecs, fsRounds, stops atomic.Int64
	lost, failed                             atomic.Int64

	mu        sync.Mutex
	createDur []time.Duration
	execDur   []time.Duration
	failures  []string
	samples   []sample
}

func (s *soak) fail(what string, err error) {
	s.failed.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failures) < 20 {
		s.failures = append(s.failures, fmt.Sprintf("%s: %v", what, err))
	}
}

func (s *soak) loseResult(what string) {
	s.lost.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failures) < 20 {
		s.failures = append(s.failures, "LOST "+what)
	}
}

// worker runs rounds until the deadline or quit (the round under way
// finishes). A failed create or stop ends nothing: it is counted, and the
// next round starts.
func (s *soak) worker(ctx context.Context, quit <-chan struct{}, w int, deadline time.Time) {
	for round := 1; time.Now().Before(deadline) && !closed(quit); round++ {
		t := time.Now()
		raw, err := s.c.Call(ctx, "sandbox::create", map[string]any{"image": "python"}, client.WithTimeout(createTimeout))
		if err != nil {
			s.fail(fmt.Sprintf("worker %d round %d: create", w, round), err)
			time.Sleep(time.Second)
			continue
		}
		d := time.Since(t)
		var cr struct {
			SandboxID string `json:"sandbox_id"`
		}
		if err := json.Unmarshal(raw, &cr); err != nil || cr.SandboxID == "" {
			s.fail(fmt.Sprintf("worker %d round %d: create reply", w, round), fmt.Errorf("%s", raw))
			continue
		}
		s.creates.Add(1)
		s.mu.Lock()
		s.createDur = append(s.createDur, d)
		s.mu.Unlock()
		id := cr.SandboxID

		var wg sync.WaitGroup
		for e := range s.o.execs {
			py := e == 0 && s.o.pythonEvery > 0 && round%s.o.pythonEvery == 0
			wg.Go(func() { s.exec(ctx, id, fmt.Sprintf("w%02d-r%d-e%d", w, round, e), py) })
		}
		wg.Wait()
		if s.o.fsEvery > 0 && round%s.o.fsEvery == 0 {
			s.fs(ctx, id, fmt.Sprintf("w%02d-r%d", w, round))
		}
		if _, err := s.c.Call(ctx, "sandbox::stop", map[string]any{"sandbox_id": id, "wait": true}, client.WithTimeout(stopTimeout)); err != nil {
			s.fail(fmt.Sprintf("worker %d round %d: stop %s", w, round, id), err)
			continue
		}
		s.stops.Add(1)
	}
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// exec runs one command that prints a fresh token and checks the reply
// carries exactly that token.
func (s *soak) exec(ctx context.Context, id, label string, python bool) {
	token := "soak-" + label + "-" + randHex(8)
	argv := []string{"echo", token}
	if python {
		argv = []string{"python3", "-c", "import sys; sys.stdout.write(sys.argv[1] + '\\n')", token}
	}
	t := time.Now()
	raw, err := s.c.Call(ctx, "sandbox::exec", map[string]any{"sandbox_id": id, "argv": argv, "timeout_ms": execGuestMS},
		client.WithTimeout(execTimeout))
	d := time.Since(t)
	s.execs.Add(1)
	if python {
		s.pyExecs.Add(1)
	}
	if err != nil {
		s.loseResult(fmt.Sprintf("%s (%s): %v", label, id, err))
		return
	}
	var out struct {
		Stdout   string `json:"stdout"`
		ExitCode *int   `json:"exit_code"`
		Success  bool   `json:"success"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || !out.Success || out.Stdout != token+"\n" {
		s.loseResult(fmt.Sprintf("%s (%s): want stdout %q, got %s", label, id, token+"\n", raw))
		return
	}
	s.mu.Lock()
	s.execDur = append(s.execDur, d)
	s.mu.Unlock()
}

// fs writes a file with a fresh body, reads it back through its channel
// (and the inline body) and compares.
func (s *soak) fs(ctx context.Context, id, label string) {
	body := "soak file " + label + " " + randHex(32) + "\n"
	path := "/tmp/soak-" + label + ".txt"
	if _, err := s.c.Call(ctx, "sandbox::fs::write", map[string]any{"sandbox_id": id, "path": path, "content": body},
		client.WithTimeout(fsTimeout)); err != nil {
		s.loseResult(fmt.Sprintf("fs::write %s (%s): %v", label, id, err))
		return
	}
	raw, err := s.c.Call(ctx, "sandbox::fs::read", map[string]any{"sandbox_id": id, "path": path}, client.WithTimeout(fsTimeout))
	if err != nil {
		s.loseResult(fmt.Sprintf("fs::read %s (%s): %v", label, id, err))
		return
	}
	var out struct {
		Content protocol.StreamChannelRef `json:"content"`
		Body    *string                   `json:"body"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		s.loseResult(fmt.Sprintf("fs::read %s (%s): reply %s", label, id, raw))
		return
	}
	rctx, cancel := context.WithTimeout(ctx, fsTimeout)
	defer cancel()
	r, err := s.c.OpenChannelReader(rctx, out.Content)
	if err != nil {
		s.loseResult(fmt.Sprintf("fs::read %s (%s): open channel: %v", label, id, err))
		return
	}
	got, err := io.ReadAll(r)
	_ = r.Close()
	switch {
	case err != nil:
		s.loseResult(fmt.Sprintf("fs::read %s (%s): channel: %v", label, id, err))
	case string(got) != body:
		s.loseResult(fmt.Sprintf("fs::read %s (%s): channel carried %q, want %q", label, id, got, body))
	case out.Body != nil && *out.Body != body:
		s.loseResult(fmt.Sprintf("fs::read %s (%s): body %q, want %q", label, id, *out.Body, body))
	default:
		s.fsRounds.Add(1)
	}
}

// ── samples ────────────────────────────────────────────────────────────

type procSample struct {
	fds, goroutines int
	rss             int64
}

type sample struct {
	label           string
	at              time.Time
	engine, adapter procSample
	vms             int
	poolReady       int
	memAvailable    int64
	creates, execs  int64
}

func (s *soak) sampleNow(ctx context.Context, label string) error {
	sm := sample{label: label, at: time.Now(), creates: s.creates.Load(), execs: s.execs.Load(), memAvailable: memAvailable()}
	var err error
	if sm.engine, err = procFigures(s.eng.pid()); err != nil {
		return fmt.Errorf("sample the engine: %w", err)
	}
	if sm.adapter, err = procFigures(s.adapterPID); err != nil {
		return fmt.Errorf("sample the adapter (pid %d): %w", s.adapterPID, err)
	}
	raw, err := s.c.Call(ctx, "engine::runtime::stats", nil, client.WithTimeout(time.Minute))
	if err != nil {
		return fmt.Errorf("engine::runtime::stats: %w", err)
	}
	var es struct {
		Goroutines int `json:"goroutines"`
	}
	if err := json.Unmarshal(raw, &es); err != nil {
		return err
	}
	sm.engine.goroutines = es.Goroutines
	info, err := s.adapterInfo(ctx)
	if err != nil {
		return err
	}
	rt, _ := info["runtime"].(map[string]any)
	g, ok := rt["goroutines"].(float64)
	if !ok {
		return fmt.Errorf("adapter::info has no runtime block: %v", info)
	}
	sm.adapter.goroutines = int(g)
	sm.poolReady = poolReady(info)
	sm.vms = s.countQEMU()
	s.mu.Lock()
	s.samples = append(s.samples, sm)
	s.mu.Unlock()
	fmt.Printf("  sample %-6s creates %5d execs %6d | engine fds %4d gor %4d rss %s | adapter fds %4d gor %5d rss %s | VMs %2d pool %d | MemAvailable %s\n",
		label, sm.creates, sm.execs, sm.engine.fds, sm.engine.goroutines, mib(sm.engine.rss),
		sm.adapter.fds, sm.adapter.goroutines, mib(sm.adapter.rss), sm.vms, sm.poolReady, mib(sm.memAvailable))
	return nil
}

func (s *soak) adapterInfo(ctx context.Context) (map[string]any, error) {
	raw, err := s.c.Call(ctx, adapterName+"::adapter::info", nil, client.WithTimeout(time.Minute))
	if err != nil {
		return nil, fmt.Errorf("adapter::info: %w", err)
	}
	var info map[string]any
	if err := json.Unmarshal(raw, &info); err != nil {
		return nil, err
	}
	return info, nil
}

func poolReady(info map[string]any) int {
	wp, _ := info["warm_pool"].(map[string]any)
	e, _ := wp["python"].(map[string]any)
	n, _ := e["ready"].(float64)
	return int(n)
}

// waitPool waits until the pool holds -pool ready VMs.
func (s *soak) waitPool(ctx context.Context, limit time.Duration) error {
	if s.o.pool == 0 {
		return nil
	}
	end := time.Now().Add(limit)
	for time.Now().Before(end) {
		info, err := s.adapterInfo(ctx)
		if err != nil {
			return err
		}
		if poolReady(info) >= s.o.pool {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("the warm pool did not fill in %s", limit)
}

// findAdapter is the engine's child running the adapter binary.
func (s *soak) findAdapter() (int, error) {
	want := filepath.Join(s.work, "bin", adapterName)
	end := time.Now().Add(2 * time.Minute)
	for time.Now().Before(end) {
		for _, pid := range children(s.eng.pid()) {
			if exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); err == nil && exe == want {
				return pid, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0, fmt.Errorf("no %s process under the engine (pid %d)", want, s.eng.pid())
}

// countQEMU counts the QEMU processes naming this soak's directory.
func (s *soak) countQEMU() int {
	n := 0
	for _, pid := range allPIDs() {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if strings.Contains(filepath.Base(args[0]), "qemu-system") && bytes.Contains(b, []byte(s.work+"/")) {
			n++
		}
	}
	return n
}

func allPIDs() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	var out []int
	for _, p := range allPIDs() {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) >= 2 && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}

// procFigures reads a process's open fds and VmRSS from /proc.
func procFigures(pid int) (procSample, error) {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return procSample{}, err
	}
	rss, err := statusBytes("/proc/"+strconv.Itoa(pid)+"/status", "VmRSS")
	if err != nil {
		return procSample{}, err
	}
	return procSample{fds: len(ents), rss: rss}, nil
}

func memAvailable() int64 {
	n, _ := statusBytes("/proc/meminfo", "MemAvailable")
	return n
}

// statusBytes reads a "Key: <n> kB" line.
func statusBytes(path, key string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && k == key {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in %s", key, path)
}

// ── report ─────────────────────────────────────────────────────────────

func (s *soak) report(ctx context.Context, ran time.Duration, logPath string) error {
	var templates map[string]any
	if info, err := s.adapterInfo(ctx); err == nil {
		templates, _ = info["snapshot_templates"].(map[string]any)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.o
	fmt.Printf("\nran %s (rounds started for %s; those under way then finished)\n", ran.Round(time.Second), o.duration)
	fmt.Printf("creates %d, execs %d (python3: %d), fs write+read checked %d, stops %d\n",
		s.creates.Load(), s.execs.Load(), s.pyExecs.Load(), s.fsRounds.Load(), s.stops.Load())
	if len(s.createDur) > 0 && len(s.execDur) > 0 {
		fmt.Printf("create p50 %s p99 %s; exec p50 %s p99 %s\n",
			fmtD(benchstat.Percentile(s.createDur, 50)), fmtD(benchstat.Percentile(s.createDur, 99)),
			fmtD(benchstat.Percentile(s.execDur, 50)), fmtD(benchstat.Percentile(s.execDur, 99)))
	}
	// Claims: the adapter logs each one; a claim returns in milliseconds
	// and a cold boot under TCG takes seconds, so the fast creates are a
	// cross-check.
	claims := strings.Count(tail(logPath, 1<<30), "warm pool VM claimed")
	fast := 0
	for _, d := range s.createDur {
		if d < time.Second {
			fast++
		}
	}
	fmt.Printf("warm pool: %d creates claimed a pooled VM (the adapter's log), %d did not (booted, for them or for the pool meanwhile); creates under 1 s: %d\n",
		claims, int(s.creates.Load())-claims, fast)
	if templates != nil {
		fmt.Printf("snapshot templates (adapter::info, creates and pool refills together): enabled %v, recorded %v, restored %v, restore failed %v\n",
			templates["enabled"], templates["recorded"], templates["restored"], templates["restore_failed"])
	}
	fmt.Printf("lost results: %d; failed calls: %d\n", s.lost.Load(), s.failed.Load())
	for _, f := range s.failures {
		fmt.Println("  ", f)
	}

	fmt.Println("\nsample  creates   execs | engine: fds gor   RSS MiB | adapter: fds   gor   RSS MiB | VMs pool | MemAvailable")
	for _, sm := range s.samples {
		fmt.Printf("%-7s %7d %7d | %11d %3d %9.1f | %12d %5d %9.1f | %3d %4d | %.1f GiB\n", sm.label, sm.creates, sm.execs,
			sm.engine.fds, sm.engine.goroutines, float64(sm.engine.rss)/(1<<20),
			sm.adapter.fds, sm.adapter.goroutines, float64(sm.adapter.rss)/(1<<20), sm.vms, sm.poolReady, float64(sm.memAvailable)/(1<<30))
	}
	minAvail := int64(-1)
	for _, sm := range s.samples {
		if minAvail < 0 || sm.memAvailable < minAvail {
			minAvail = sm.memAvailable
		}
	}
	fmt.Printf("lowest MemAvailable sampled: %.1f GiB\n", float64(minAvail)/(1<<30))

	// Flat: the last sample (idle again: every sandbox stopped, the pool
	// full) against the first one after warm-up (a minute in, under
	// load), and, stricter for counts, against the idle start.
	if len(s.samples) < 3 {
		return errors.New("too few samples for a verdict: run longer than -sample")
	}
	first, warm, last := s.samples[0], s.samples[1], s.samples[len(s.samples)-1]
	fmt.Printf("\nflat verdict: the last sample (%s: idle, pool full) against the first after warm-up (%s), which it may exceed by max(%.0f%%, %d) fds, max(%.0f%%, %d) goroutines, max(%.0f%%, %d MiB) RSS; fds and goroutines also against the idle start (+%d, +%d)\n",
		last.label, warm.label, tolFraction*100, tolFDs, tolFraction*100, tolGoroutines, tolRSSFrac*100, tolRSSBytes>>20, tolFDs, tolGoroutines)
	flat := true
	check := func(proc, what string, base, got, slack int64) {
		ok := got <= base+slack
		flat = flat && ok
		v := "flat"
		if !ok {
			v = "GREW"
		}
		fmt.Printf("  %-8s %-10s %10d -> %10d (limit %d): %s\n", proc, what, base, got, base+slack, v)
	}
	slack := func(base int64, frac float64, abs int64) int64 { return max(int64(float64(base)*frac), abs) }
	for _, p := range []struct {
		name              string
		first, warm, last procSample
	}{{"engine", first.engine, warm.engine, last.engine}, {"adapter", first.adapter, warm.adapter, last.adapter}} {
		check(p.name, "fds", int64(p.warm.fds), int64(p.last.fds), slack(int64(p.warm.fds), tolFraction, tolFDs))
		check(p.name, "goroutines", int64(p.warm.goroutines), int64(p.last.goroutines), slack(int64(p.warm.goroutines), tolFraction, tolGoroutines))
		check(p.name, "rss", p.warm.rss, p.last.rss, slack(p.warm.rss, tolRSSFrac, tolRSSBytes))
		check(p.name, "fds (idle)", int64(p.first.fds), int64(p.last.fds), tolFDs)
		check(p.name, "gor (idle)", int64(p.first.goroutines), int64(p.last.goroutines), tolGoroutines)
	}
	// L1's figure beside its floor: what each process holds at the end
	// against what it held after warm-up in the same run.
	for _, p := range []struct {
		name              string
		first, warm, last procSample
	}{{"engine", first.engine, warm.engine, last.engine}, {"adapter", first.adapter, warm.adapter, last.adapter}} {
		fmt.Printf("L1 %-8s RSS at the end %.1f MiB | floor: after warm-up (%s, same run) %.1f MiB | ratio %.2fx; fds %d -> %d, goroutines %d -> %d (idle start -> end)\n",
			p.name, float64(p.last.rss)/(1<<20), warm.label, float64(p.warm.rss)/(1<<20), float64(p.last.rss)/float64(max(p.warm.rss, 1)),
			p.first.fds, p.last.fds, p.first.goroutines, p.last.goroutines)
	}
	if len(s.samples) >= 4 {
		// Under load (informational: in-flight calls move the counts):
		// the last sample before the end against the first after warm-up.
		l := s.samples[len(s.samples)-2]
		fmt.Printf("under load, %s against %s: engine RSS %+.1f MiB, fds %+d; adapter RSS %+.1f MiB, fds %+d\n", l.label, warm.label,
			float64(l.engine.rss-warm.engine.rss)/(1<<20), l.engine.fds-warm.engine.fds,
			float64(l.adapter.rss-warm.adapter.rss)/(1<<20), l.adapter.fds-warm.adapter.fds)
	}
	switch {
	case s.lost.Load() > 0 || s.failed.Load() > 0:
		return fmt.Errorf("%d lost results, %d failed calls", s.lost.Load(), s.failed.Load())
	case !flat:
		return errors.New("not flat: a figure grew beyond its tolerance")
	}
	fmt.Println("result: 0 lost, flat")
	return nil
}

func fmtD(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1e3)
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// ── engine process ─────────────────────────────────────────────────────

type engine struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
}

func (e *engine) pid() int { return e.cmd.Process.Pid }

func startEngine(iii, dir, logPath string, port int) (*engine, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	e := &engine{done: make(chan struct{}), log: log}
	e.cmd = exec.Command(iii, "-c", filepath.Join(dir, "config.yaml"))
	e.cmd.Dir = dir
	e.cmd.Env = append(os.Environ(), "III_LOG_LEVEL=info")
	e.cmd.Stdout, e.cmd.Stderr = log, log
	// Its own process group, so an interrupt of the harness reaches it
	// only through stop.
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := e.cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	go func() { _ = e.cmd.Wait(); close(e.done) }()
	end := time.Now().Add(2 * time.Minute)
	for time.Now().Before(end) {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return e, nil
		}
		select {
		case <-e.done:
			return nil, fmt.Errorf("the engine exited:\n%s", tail(logPath, 4000))
		case <-time.After(20 * time.Millisecond):
		}
	}
	e.stop()
	return nil, errors.New("the engine did not listen in 2 minutes")
}

// stop interrupts the engine (which stops the adapter and its VMs) and
// waits, killing it after a minute.
func (e *engine) stop() {
	_ = e.cmd.Process.Signal(os.Interrupt)
	select {
	case <-e.done:
	case <-time.After(time.Minute):
		_ = e.cmd.Process.Kill()
		<-e.done
	}
	e.log.Close()
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
