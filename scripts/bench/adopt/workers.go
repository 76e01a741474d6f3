package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
)

// workerCommand is what each bench worker VM runs: nothing that needs the
// engine, so the harness runs without one (the worker's engine_url names
// a port nobody listens on; the forward is never used).
const workerCommand = "exec sleep 1000000"

// workerRound is T7w: n worker VMs (python image, the workspace a small
// directory, no install step) are started and running, the adapter is
// killed with SIGKILL, and the next adapter process is timed from its exec
// until every worker reads `running` again with the same command pid (its
// log says "adopted"). The floor is T7's: the same adapter's exec to
// adapter::info, configured, with nothing to adopt; the yardstick beside it
// is the time one worker VM took to start (a cold boot and the copy).
func (b *bench) workerRound(ctx context.Context, n int) error {
	var floors, hands []time.Duration
	if err := b.floors(ctx, &floors, &hands); err != nil {
		return err
	}
	wa, ok := b.cur.a.(contract.WorkerAdapter)
	if !ok {
		return errors.New("the adapter client has no worker::* operations")
	}
	var starts []time.Duration
	pids := map[string]int{}
	for i := range n {
		id := fmt.Sprintf("bench-w%d", i)
		t := time.Now()
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		_, err := wa.WorkerStart(cctx, &contract.WorkerStartRequest{VMID: id, Name: id, Image: "python", HostDir: b.hostDir,
			Command: workerCommand, EngineURL: "ws://127.0.0.1:9"})
		cancel()
		if err != nil {
			return fmt.Errorf("worker::start %s: %w", id, err)
		}
		b.workers = append(b.workers, id)
		st, err := waitWorker(ctx, wa, id, 0)
		if err != nil {
			return err
		}
		starts = append(starts, time.Since(t))
		pids[id] = *st.PID
	}
	load := benchstat.LoadAvg()
	t0, hand, conf, err := b.restart(ctx)
	if err != nil {
		return err
	}
	wa = b.cur.a.(contract.WorkerAdapter)
	var last time.Duration
	for id, pid := range pids {
		st, err := waitWorker(ctx, wa, id, pid)
		if err != nil {
			return fmt.Errorf("after the restart: %w", err)
		}
		last = max(last, time.Since(t0))
		logs, err := wa.WorkerLogs(ctx, &contract.WorkerLogsRequest{VMID: id, Tail: 50})
		if err != nil {
			return fmt.Errorf("worker::logs %s: %w", id, err)
		}
		adopted := false
		for _, e := range logs.Entries {
			adopted = adopted || strings.Contains(e.Message, "adopted by a new adapter process")
		}
		if !adopted || st.Restarts != 0 {
			return fmt.Errorf("worker %s was not adopted (restarts %d, log without \"adopted\")", id, st.Restarts)
		}
	}
	if err := b.stopWorkers(ctx); err != nil {
		return err
	}
	if err := b.floors(ctx, &floors, &hands); err != nil {
		return err
	}
	floor := benchstat.Median(floors)
	start := benchstat.Median(starts)
	fmt.Printf("T7w N=%d: %d worker VMs started (median %s each: cold boot, workspace copy, command), adapter killed with SIGKILL (load average %s)\n",
		n, n, fmtD(start), load)
	fmt.Printf("  new adapter's exec to all %d workers running again, same command pid  %10s | floor: its exec to adapter::info, configured, nothing to adopt (median of %d) %10s | ratio %.2fx\n",
		n, fmtD(last), len(floors), fmtD(floor), last.Seconds()/floor.Seconds())
	fmt.Printf("  phases: handshake %s, Configure (adoption inside) %s; beside a worker VM's start (this run) %s: %.3fx\n",
		fmtD(hand), fmtD(conf-hand), fmtD(start), last.Seconds()/start.Seconds())
	return nil
}

// waitWorker polls worker::status until id runs (with command pid, when
// pid is not 0).
func waitWorker(ctx context.Context, wa contract.WorkerAdapter, id string, pid int) (*contract.WorkerStatus, error) {
	deadline := time.Now().Add(callTimeout)
	for {
		st, err := wa.WorkerStatus(ctx, &contract.WorkerStatusRequest{VMID: id})
		switch {
		case err == nil && st.State == contract.WorkerRunning && st.PID != nil && (pid == 0 || *st.PID == pid):
			return st, nil
		case err == nil && st.State == contract.WorkerRunning && st.PID != nil:
			return nil, fmt.Errorf("worker %s runs another command (pid %d, was %d)", id, *st.PID, pid)
		case err == nil && st.State != contract.WorkerStarting && st.State != contract.WorkerRunning:
			return nil, fmt.Errorf("worker %s is %s: %s", id, st.State, st.LastError)
		case time.Now().After(deadline):
			return nil, fmt.Errorf("worker %s did not run within %s (last: %+v, %v)", id, callTimeout, st, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stopWorkers stops and removes the bench's worker VMs.
func (b *bench) stopWorkers(ctx context.Context) error {
	wa, ok := b.cur.a.(contract.WorkerAdapter)
	if !ok {
		return errors.New("the adapter client has no worker::* operations")
	}
	var errs []error
	for _, id := range b.workers {
		if _, err := wa.WorkerRemove(ctx, &contract.WorkerRemoveRequest{VMID: id}); err != nil {
			errs = append(errs, fmt.Errorf("worker::remove %s: %w", id, err))
		}
	}
	b.workers = nil
	return errors.Join(errs...)
}

// workerHostDir makes the small directory every bench worker copies.
func workerHostDir(work string) (string, error) {
	dir := filepath.Join(work, "w")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "README"), []byte("a bench worker's workspace\n"), 0o644)
}
