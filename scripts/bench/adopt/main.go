// Command adopt measures T7 (issue 23): how long sandboxes wait for a new
// sandbox-libkrun adapter process after the previous one was killed with
// SIGKILL. For each N it creates N sandboxes (snapshot templates on, so
// creates are restores), kills the adapter with kill -9, starts a new one
// on the same state_dir as the engine's plugin host would (a go-plugin
// subprocess, gRPC with mTLS), and prints:
//
//   - the figure: from the new process's start (the exec of its binary)
//     until every one of the N sandboxes has answered an exec of `true`;
//   - the floor, same run: from the start of the same adapter, on the same
//     state_dir with no sandboxes, until it answers adapter::info once
//     configured (the handshake and Configure nobody can avoid);
//   - the ratio, the adapter's own log line "adopted sandboxes count=N
//     ms=…", and the per-sandbox cost (figure − floor) / N beside T1, a
//     template-restore sandbox::create timed in the same run.
//
// Every sandbox is stopped at the end; the runners' adopt_grace_ms is
// short (-grace-ms), so a run killed half-way leaves no VM for long.
//
// It builds the adapter and the guest agent from this tree. Run
// scripts/build-images.sh first (the python image), then:
//
//	go run ./scripts/bench/adopt [-n 1,8,32] [-memory-mb 256] [-floors 3] [-workers 1,4]
//
// With -workers it also measures T7w: worker VMs (issue 23 part 3) adopted
// by the next adapter process, same floor.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/adapterproc"
	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/procscan"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/adapter"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/runner"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "adopt bench:", err)
		os.Exit(1)
	}
}

type options struct {
	ns       []int
	memoryMB int
	graceMS  int
	floors   int
	boots    int
	accel    string
	workers  []int
}

// callTimeout bounds one adapter call; a create under TCG on a loaded
// two-core machine can take a while.
const callTimeout = 5 * time.Minute

func run() error {
	var o options
	var nList string
	flag.StringVar(&nList, "n", "1,8,32", "sandbox counts to adopt, one round each")
	flag.IntVar(&o.memoryMB, "memory-mb", 256, "VM memory of every sandbox")
	flag.IntVar(&o.graceMS, "grace-ms", 20_000, "adopt_grace_ms: how long a killed adapter's VMs wait (short, so an aborted run leaves nothing for long)")
	flag.IntVar(&o.floors, "floors", 3, "floor restarts before and again after each round (the median of all is printed)")
	flag.IntVar(&o.boots, "boots", 5, "template-restore creates timed for T1 (the median is printed)")
	flag.StringVar(&o.accel, "accel", "auto", "accel for the adapter")
	var wList string
	flag.StringVar(&wList, "workers", "", "worker VM counts to adopt (T7w), one round each after the sandbox rounds; empty: none")
	flag.Parse()
	for _, s := range strings.Split(wList, ",") {
		if strings.TrimSpace(s) == "" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-workers: %q is not a worker count", s)
		}
		o.workers = append(o.workers, n)
	}
	for _, s := range strings.Split(nList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("-n: %q is not a sandbox count", s)
		}
		o.ns = append(o.ns, n)
	}
	if o.floors < 1 || o.boots < 1 || o.graceMS < 1 {
		return errors.New("-floors, -boots and -grace-ms must be at least 1")
	}
	// An interrupt still stops every sandbox (the deferred clean-up).
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	root, err := images.DefaultRoot()
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("/tmp", "adb")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin, err := bins.SandboxLibkrun(".", filepath.Join(work, "bin"), adapter.AgentName(runtime.GOARCH))
	if err != nil {
		return err
	}
	cache := filepath.Join(work, "cache")
	if err := dirs.ImageCache(cache, filepath.Join(root, "oci")); err != nil {
		return err
	}
	hostDir, err := workerHostDir(work)
	if err != nil {
		return err
	}
	b := &bench{bin: bin, state: filepath.Join(work, "s"), o: o, hostDir: hostDir, config: map[string]any{
		"image_allowlist": []string{"python"}, "state_dir": filepath.Join(work, "s"), "cache_dir": cache,
		"accel": o.accel, "default_memory_mb": o.memoryMB, "snapshot_templates": true,
		"max_concurrent_sandboxes": slices.Max(o.ns) + 2, "adopt_grace_ms": o.graceMS,
		"host_roots": []string{hostDir}, "worker_disk_mb": 256,
	}}
	defer b.cleanup()
	return b.measure(ctx)
}

// bench holds the adapter process of the moment and the sandboxes that
// are still running, so that the clean-up can stop them whatever failed.
type bench struct {
	bin, state string
	o          options
	config     map[string]any
	cur        *proc
	live       []string
	// hostDir is the bench workers' workspace, workers the worker VMs
	// that still run (T7w).
	hostDir string
	workers []string
}

// proc is one adapter process.
type proc struct {
	a      contract.Adapter
	client *plugin.Client
	pid    int
	logs   *logCapture
}

func (b *bench) measure(ctx context.Context) error {
	t0 := time.Now()
	p, err := b.launch()
	if err != nil {
		return err
	}
	b.cur = p
	if err := b.configure(ctx, p); err != nil {
		return err
	}
	// The first create installs the image and records the template.
	if _, err := b.create(ctx); err != nil {
		return err
	}
	firstD := time.Since(t0)
	if err := b.stopAll(ctx); err != nil {
		return err
	}
	if err := waitTemplate(ctx, p.a); err != nil {
		return err
	}
	info, err := p.a.Info(ctx)
	if err != nil {
		return fmt.Errorf("adapter::info: %w", err)
	}
	fmt.Printf("host: %s/%s, %d CPUs; back end %v with %v; VM memory %d MiB; adopt_grace_ms %d; load average %s\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), info.Facts["hypervisor"], info.Facts["accel"], b.o.memoryMB, b.o.graceMS, benchstat.LoadAvg())
	fmt.Printf("first adapter start + first create (installs the image, records the template): %s\n", fmtD(firstD))

	// T1, the per-sandbox yardstick: template-restore creates, each
	// stopped before the next.
	var restores []time.Duration
	for range b.o.boots {
		t := time.Now()
		if _, err := b.create(ctx); err != nil {
			return err
		}
		restores = append(restores, time.Since(t))
		if err := b.stopAll(ctx); err != nil {
			return err
		}
	}
	if info, err = p.a.Info(ctx); err != nil {
		return fmt.Errorf("adapter::info: %w", err)
	}
	st, _ := info.Facts["snapshot_templates"].(map[string]any)
	if n, _ := st["restored"].(float64); int(n) < b.o.boots {
		return fmt.Errorf("only %v of %d creates were restored from the template", st["restored"], b.o.boots)
	}
	t1 := benchstat.Median(restores)
	fmt.Printf("T1 template-restore sandbox::create (median of %d, this run): %s\n", b.o.boots, fmtD(t1))

	for _, n := range b.o.ns {
		if err := b.round(ctx, n, t1); err != nil {
			return fmt.Errorf("N=%d: %w", n, err)
		}
	}
	for _, n := range b.o.workers {
		if err := b.workerRound(ctx, n); err != nil {
			return fmt.Errorf("workers N=%d: %w", n, err)
		}
	}
	return nil
}

// round creates n sandboxes, kills the adapter with SIGKILL and times the
// next adapter until every sandbox answers an exec; the floor (restarts
// with no sandboxes) is measured before and after.
func (b *bench) round(ctx context.Context, n int, t1 time.Duration) error {
	if avail, err := memAvailableMiB(); err == nil && avail < n*b.o.memoryMB+2048 {
		fmt.Printf("T7 N=%d: skipped: %d MiB available, %d sandboxes of %d MiB could need %d MiB and 2 GiB are kept free\n",
			n, avail, n, b.o.memoryMB, n*b.o.memoryMB)
		return nil
	}
	// The floor is measured before the sandboxes are created and again
	// after they are stopped: on a shared machine the load moves, and
	// the median of both sides brackets the figure's moment.
	var floors, floorHands []time.Duration
	if err := b.floors(ctx, &floors, &floorHands); err != nil {
		return err
	}

	var creates []time.Duration
	for range n {
		t := time.Now()
		if _, err := b.create(ctx); err != nil {
			return err
		}
		creates = append(creates, time.Since(t))
	}
	ids := slices.Clone(b.live)
	// Each sandbox's QEMU, to check after the restart that the same VM
	// answers (adopted, not booted again).
	vms := map[string]int{}
	for _, id := range ids {
		if err := b.execTrue(ctx, b.cur.a, id); err != nil {
			return err
		}
		pid, err := runner.ReadPID(filepath.Join(b.state, id, runner.VMPIDName))
		if err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		vms[id] = pid
	}
	load := benchstat.LoadAvg()

	t0, hand, conf, err := b.restart(ctx)
	if err != nil {
		return err
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		last time.Duration
		errs []error
	)
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := b.execTrue(ctx, b.cur.a, id)
			d := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			last = max(last, d)
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("after the restart: %w", err)
	}
	l, err := b.cur.a.List(ctx, &contract.ListRequest{})
	if err != nil {
		return fmt.Errorf("sandbox::list: %w", err)
	}
	listed := map[string]bool{}
	for _, e := range l.Sandboxes {
		listed[e.SandboxID] = !e.Stopped
	}
	for id, pid := range vms {
		now, err := runner.ReadPID(filepath.Join(b.state, id, runner.VMPIDName))
		switch {
		case !listed[id]:
			return fmt.Errorf("sandbox %s is not listed after the restart", id)
		case err != nil || now != pid || syscall.Kill(pid, 0) != nil:
			return fmt.Errorf("sandbox %s runs another VM after the restart (QEMU pid %d before, %d now: %v)", id, pid, now, err)
		}
	}

	adopted := b.cur.logs.lines()
	if err := b.stopAll(ctx); err != nil {
		return err
	}
	if err := b.floors(ctx, &floors, &floorHands); err != nil {
		return err
	}
	floor := benchstat.Median(floors)

	fmt.Printf("T7 N=%d: %d sandboxes created (template restores, median %s), adapter killed with SIGKILL (load average %s)\n",
		n, n, fmtD(benchstat.Median(creates)), load)
	fmt.Printf("  new adapter's exec to all %d sandboxes answering `true`  %10s | floor: its exec to adapter::info, configured, no sandboxes (median of %d) %10s | ratio %.2fx\n",
		n, fmtD(last), len(floors), fmtD(floor), last.Seconds()/floor.Seconds())
	fmt.Printf("  phases: handshake %s, Configure (adoption inside) %s, execs %s; the floor's handshake (median) %s, its floors %s\n",
		fmtD(hand), fmtD(conf-hand), fmtD(last-conf), fmtD(benchstat.Median(floorHands)), fmtDs(floors))
	for _, line := range adopted {
		fmt.Printf("  adapter log: %s\n", line)
	}
	per := (last - floor) / time.Duration(n)
	fmt.Printf("  per sandbox (figure - floor) / N %s | T1 template-restore create (this run) %s | ratio %.2fx\n",
		fmtD(per), fmtD(t1), per.Seconds()/t1.Seconds())
	return nil
}

// floors restarts the adapter -floors times with no sandboxes and appends
// each time from its exec to adapter::info answered once configured, and
// each handshake.
func (b *bench) floors(ctx context.Context, floors, hands *[]time.Duration) error {
	for range b.o.floors {
		t0, hand, _, err := b.restart(ctx)
		if err != nil {
			return err
		}
		if _, err := b.cur.a.Info(ctx); err != nil {
			return fmt.Errorf("adapter::info: %w", err)
		}
		*floors = append(*floors, time.Since(t0))
		*hands = append(*hands, hand)
		l, err := b.cur.a.List(ctx, &contract.ListRequest{})
		if err != nil {
			return fmt.Errorf("sandbox::list: %w", err)
		}
		if len(l.Sandboxes) != 0 {
			return fmt.Errorf("the floor's adapter lists %d sandboxes, not none", len(l.Sandboxes))
		}
	}
	return nil
}

// launch execs the adapter binary and hands shakes with it, as the
// engine's plugin host does.
func (b *bench) launch() (*proc, error) {
	logs := &logCapture{forward: os.Stderr}
	cmd := exec.Command(b.bin)
	client := adapterproc.NewClient(adapterproc.Options{Cmd: cmd,
		Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})})
	a, err := adapterproc.Dispense(client)
	if err != nil {
		client.Kill()
		return nil, err
	}
	return &proc{a: a, client: client, pid: cmd.Process.Pid, logs: logs}, nil
}

func (b *bench) configure(ctx context.Context, p *proc) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := adapterproc.Configure(cctx, p.a, b.config); err != nil {
		return fmt.Errorf("configure the adapter: %w", err)
	}
	return nil
}

// restart kills the current adapter with SIGKILL, waits until it is gone
// (the engine relaunches a plugin once it has exited), then starts and
// configures the next. t0 is the moment just before the new exec; hand
// and conf are the time from t0 to the handshake and to Configure's end.
func (b *bench) restart(ctx context.Context) (t0 time.Time, hand, conf time.Duration, err error) {
	old := b.cur
	b.cur = nil
	if err := syscall.Kill(old.pid, syscall.SIGKILL); err != nil {
		return t0, 0, 0, fmt.Errorf("kill -9 the adapter (pid %d): %w", old.pid, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !old.client.Exited() {
		if time.Now().After(deadline) {
			return t0, 0, 0, fmt.Errorf("the adapter (pid %d) did not exit 30 s after SIGKILL", old.pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	old.client.Kill() // its go-plugin client's own clean-up
	t0 = time.Now()
	p, err := b.launch()
	if err != nil {
		return t0, 0, 0, err
	}
	hand = time.Since(t0)
	b.cur = p
	if err := b.configure(ctx, p); err != nil {
		return t0, 0, 0, err
	}
	return t0, hand, time.Since(t0), nil
}

func (b *bench) create(ctx context.Context) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	out, err := b.cur.a.Create(cctx, &contract.CreateRequest{Image: "python"})
	if err != nil {
		return "", fmt.Errorf("sandbox::create: %w", err)
	}
	b.live = append(b.live, out.SandboxID)
	return out.SandboxID, nil
}

func (b *bench) execTrue(ctx context.Context, a contract.Adapter, id string) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	out, err := a.Exec(cctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"true"}})
	if err != nil {
		return fmt.Errorf("exec true in %s: %w", id, err)
	}
	if !out.Success {
		return fmt.Errorf("exec true in %s: exit %v, %s", id, out.ExitCode, out.Stderr)
	}
	return nil
}

// stopAll stops every live sandbox through the current adapter and waits
// for each VM to end.
func (b *bench) stopAll(ctx context.Context) error {
	var errs []error
	var left []string
	for _, id := range b.live {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		_, err := b.cur.a.Stop(cctx, &contract.StopRequest{SandboxID: id, Wait: true})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("sandbox::stop %s: %w", id, err))
			left = append(left, id)
		}
	}
	b.live = left
	return errors.Join(errs...)
}

// cleanup stops every sandbox still running, ends the adapter, and waits
// until no runner or QEMU of this run's state_dir is left. If no adapter
// runs (a restart failed), a new one adopts the sandboxes to stop them.
// Whatever still runs once the grace period is long past is this run's
// own and is killed by pid.
func (b *bench) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if b.cur == nil && len(b.live)+len(b.workers) > 0 {
		if p, err := b.launch(); err == nil {
			b.cur = p
			if err := b.configure(ctx, p); err != nil {
				fmt.Fprintln(os.Stderr, "clean-up:", err)
			}
		}
	}
	if b.cur != nil {
		if err := b.stopAll(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "clean-up:", err)
		}
		if len(b.workers) > 0 {
			if err := b.stopWorkers(ctx); err != nil {
				fmt.Fprintln(os.Stderr, "clean-up:", err)
			}
		}
		b.cur.client.Kill()
		b.cur = nil
	}
	deadline := time.Now().Add(time.Duration(b.o.graceMS)*time.Millisecond + 30*time.Second)
	for {
		left := procsUnder(b.state)
		if len(left) == 0 {
			fmt.Println("clean-up: no runner or QEMU of this run is left")
			return
		}
		if time.Now().After(deadline) {
			for _, p := range left {
				fmt.Fprintf(os.Stderr, "clean-up: killing pid %d, still running past the grace period: %s\n", p.PID, strings.Join(p.Args, " "))
				_ = syscall.Kill(p.PID, syscall.SIGKILL)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// procsUnder lists the live processes whose arguments (argv[0] aside)
// name dir: this run's runners and QEMUs.
func procsUnder(dir string) []procscan.Proc {
	var out []procscan.Proc
	for _, p := range procscan.Live() {
		if slices.ContainsFunc(p.Args[1:], func(a string) bool { return strings.Contains(a, dir) }) {
			out = append(out, p)
		}
	}
	return out
}

// waitTemplate waits until the adapter has saved a template.
func waitTemplate(ctx context.Context, a contract.Adapter) error {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		info, err := a.Info(ctx)
		if err != nil {
			return fmt.Errorf("adapter::info: %w", err)
		}
		st, _ := info.Facts["snapshot_templates"].(map[string]any)
		if l, _ := st["templates"].([]any); len(l) > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.New("no snapshot template was saved in 5 minutes")
}

// memAvailableMiB is /proc/meminfo's MemAvailable.
func memAvailableMiB() (int, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kb / 1024, err
		}
	}
	return 0, errors.New("no MemAvailable in /proc/meminfo")
}

func fmtDs(ds []time.Duration) string {
	var s []string
	for _, d := range ds {
		s = append(s, fmtD(d))
	}
	return strings.Join(s, ", ")
}

func fmtD(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%.0f µs", float64(d.Nanoseconds())/1e3)
	}
	return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1e3)
}

// logCapture is the adapter's log as go-plugin relays it: it keeps the
// adapter's "adopted sandboxes" lines and passes warnings and errors on,
// so that a failed adoption is seen.
type logCapture struct {
	forward io.Writer

	mu      sync.Mutex
	partial []byte
	adopted []string
}

// maxLogLine bounds what is kept of a line without its end.
const maxLogLine = 64 << 10

// killedLine is how go-plugin reports a plugin that SIGKILL ended.
const killedLine = `error="signal: killed"`

// adoptedLine marks the adapter's own summary of an adoption (adopt.go).
const adoptedLine = "adopted sandboxes"

func (l *logCapture) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, b...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			if len(l.partial) > maxLogLine {
				l.partial = l.partial[:0] // not a log line of the adapter's
			}
			return len(b), nil
		}
		line := strings.TrimSpace(string(l.partial[:i]))
		l.partial = l.partial[i+1:]
		switch {
		case strings.Contains(line, adoptedLine):
			l.adopted = append(l.adopted, line)
		case strings.Contains(line, killedLine):
			// go-plugin's note of the SIGKILL this harness sent.
		case strings.Contains(line, "[WARN]") || strings.Contains(line, "[ERROR]"):
			if l.forward != nil {
				fmt.Fprintln(l.forward, line)
			}
		}
	}
}

// lines are the "adopted sandboxes" lines seen so far.
func (l *logCapture) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.adopted)
}
