package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/runner"
)

// pauseFigures measures T4-T6 with one adapter (snapshot templates on):
// T1 again as the floor (creates restored from the template), then on a
// restored sandbox running a Python process, sandbox::pause (T4) and
// sandbox::resume (T5) beside it, and what a paused sandbox holds on the
// host (T6): no process, so no RSS, and its state file on disk.
func pauseFigures(ctx context.Context, bin, cache, state string, o options) error {
	a, stop, err := startAdapter(bin, map[string]any{
		"image_allowlist": []string{"python"}, "state_dir": state, "cache_dir": cache, "accel": o.accel,
		"default_memory_mb": o.memoryMB, "max_concurrent_sandboxes": 4,
	})
	if err != nil {
		return err
	}
	defer stop()
	p, ok := a.(contract.PauseAdapter)
	if !ok {
		return fmt.Errorf("the adapter client has no pause")
	}
	first, err := create(ctx, a)
	if err != nil {
		return err
	}
	if _, err := a.Stop(ctx, &contract.StopRequest{SandboxID: first, Wait: true}); err != nil {
		return err
	}
	if err := waitTemplate(ctx, a); err != nil {
		return err
	}
	var restores []time.Duration
	for range o.boots {
		t := time.Now()
		id, err := create(ctx, a)
		if err != nil {
			return err
		}
		restores = append(restores, time.Since(t))
		if _, err := a.Stop(ctx, &contract.StopRequest{SandboxID: id, Wait: true}); err != nil {
			return err
		}
	}
	t1 := benchstat.Percentile(restores, 50)

	id, err := create(ctx, a)
	if err != nil {
		return err
	}
	defer func() { _, _ = a.Stop(context.Background(), &contract.StopRequest{SandboxID: id, Wait: true}) }()
	// A Python process with some state, so the save holds a used VM.
	if _, err := a.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"/bin/sh", "-c",
		`nohup python3 -c "import time; x = list(range(10**6)); time.sleep(10**6)" >/dev/null 2>&1 & echo $! > /tmp/py.pid; sleep 1`}}); err != nil {
		return err
	}
	dir := filepath.Join(state, id)
	var pauses, resumes []time.Duration
	var stateBytes int64
	var rssKB int
	for range o.boots {
		vpid, err := runner.ReadPID(filepath.Join(dir, runner.VMPIDName))
		if err != nil {
			return err
		}
		if rssKB, err = statusKB(vpid, "VmRSS"); err != nil {
			return err
		}
		t := time.Now()
		if _, err := p.Pause(ctx, &contract.PauseRequest{SandboxID: id}); err != nil {
			return err
		}
		pauses = append(pauses, time.Since(t))
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(vpid) + "/cmdline"); err == nil && strings.Contains(string(b), dir) {
			return fmt.Errorf("QEMU (pid %d) still runs while the sandbox is paused", vpid)
		}
		fi, err := os.Stat(filepath.Join(dir, "pause.state"))
		if err != nil {
			return err
		}
		stateBytes = fi.Size()
		t = time.Now()
		if _, err := p.Resume(ctx, &contract.ResumeRequest{SandboxID: id}); err != nil {
			return err
		}
		resumes = append(resumes, time.Since(t))
		// The Python process is still there (TestPauseResume checks
		// that it kept its variables).
		out, err := a.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"/bin/sh", "-c", `kill -0 "$(cat /tmp/py.pid)"`}})
		if err != nil {
			return err
		}
		if !out.Success {
			return fmt.Errorf("the Python process is gone after resume: exit %v, %s", out.ExitCode, out.Stderr)
		}
	}
	fmt.Println("T4-T6 sandbox::pause and sandbox::resume of a restored sandbox running Python (median of", o.boots, "cycles)")
	row("T1 template-restore sandbox::create (this run)", t1, "-", t1, 0)
	row("T4 sandbox::pause (save RAM+devices, end QEMU)", benchstat.Percentile(pauses, 50), "T1 template restore", t1, 0)
	row("T5 sandbox::resume (restore, reconnect, reseed)", benchstat.Percentile(resumes, 50), "T1 template restore", t1, 0)
	fmt.Printf("T6 host memory of a paused sandbox: RSS 0 (no QEMU, no runner), disk: state file %.1f MB | floor: the same sandbox running, QEMU RSS %.1f MB (VM memory %d MiB) | ratio RSS 0x, state file %.2fx of RSS\n",
		float64(stateBytes)/(1<<20), float64(rssKB)/1024, o.memoryMB, float64(stateBytes)/float64(max(rssKB, 1)*1024))
	return nil
}
