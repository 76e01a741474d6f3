package workervm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/boot"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/runner"
)

// Worker VMs outlive the adapter as sandboxes do (adapter/adopt.go): the runner
// keeps the VM for adopt_grace_ms, the guest agent keeps the worker's
// command running with no host attached (spawn keep), and the gateway
// forward that carries the worker's engine credential lives in the
// runner, so the worker's connection to the engine does not even notice.
// The next adapter process on the same state_dir adopts every worker whose
// worker.json says running: it takes the directory's lock, proves to the
// runner it holds its key, dials the agent again and attaches to the
// command by name (proc_attach), picking up the output written meanwhile.
// Whatever cannot be adopted is killed by the leftover clean-up that
// follows, as before.

// detach leaves run's VM and command running for the next adapter
// process: the agent connection closes (the agent keeps the command), the
// runner's lifeline is let go without the stop word (it waits
// adopt_grace_ms), and follow releases the directory's lock. It reports
// false when run cannot be left (still booting, or an agent that cannot
// keep a process), which the caller stops instead.
func (w *workerVM) detach(run *workerRun) bool {
	run.mu.Lock()
	b, agent, proc := run.boot, run.agent, run.proc
	run.mu.Unlock()
	if b == nil || agent == nil || proc == nil || !agent.Has(agentproto.CapProcAttach) {
		return false
	}
	select {
	case <-run.done:
		return true // nothing runs
	default:
	}
	run.detaching.Store(true)
	w.note("the adapter is stopping: the VM and its command go on for the next adapter process (for up to adopt_grace_ms)")
	b.Runner.Detach()
	_ = agent.Close()
	// follow sees the connection end and returns without a stop.
	select {
	case <-run.done:
	case <-time.After(10 * time.Second):
		w.set.h.Log().Warn("a detached worker VM's watcher did not return", "vm_id", w.id)
	}
	return true
}

// adoptAll adopts, in parallel, every worker VM an earlier adapter process
// left running under the set's directory.
func (s *Set) adoptAll(ctx context.Context) {
	des, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	var (
		wg sync.WaitGroup
		mu sync.Mutex
		n  int
	)
	t0 := time.Now()
	for _, de := range des {
		id := de.Name()
		if !de.IsDir() || !contract.ValidVMID(id) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, cancel := context.WithTimeout(ctx, boot.AdoptTimeout)
			defer cancel()
			ok, err := s.adoptWorker(actx, id)
			switch {
			case errors.Is(err, runner.ErrLocked):
				s.h.Log().Debug("a live adapter holds this worker VM; not adopting it", "vm_id", id)
			case err != nil:
				s.h.Log().Warn("could not adopt a worker VM an earlier adapter process left running; it will be stopped", "vm_id", id, "error", err.Error())
			case ok:
				mu.Lock()
				n++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if n > 0 {
		s.h.Log().Info("adopted worker VMs", "count", n, "ms", time.Since(t0).Milliseconds())
	}
}

// adoptWorker adopts the worker vmID when its record says it runs; ok is
// false when there was nothing to adopt.
func (s *Set) adoptWorker(ctx context.Context, id string) (ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(s.dir, id, metaName))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	m, err := decodeMeta(b)
	if err != nil {
		return false, err
	}
	if m.State != contract.WorkerRunning {
		return false, nil // stopped, or cut short while booting
	}
	if m.VMID != id {
		return false, fmt.Errorf("%s names vm_id %q", metaName, m.VMID)
	}
	if m.PlanHash == "" {
		return false, errors.New("recorded by an adapter that did not leave worker VMs running")
	}
	dir, err := runner.AdoptWorkerDir(s.dir, id)
	if err != nil {
		return false, err
	}
	fail := func(err error) (bool, error) {
		dir.Release()
		return false, err
	}
	var rc runner.Config
	if err := boot.ReadJSONFile(dir.File(runner.ConfigName), boot.MaxRecordBytes, &rc); err != nil {
		return fail(err)
	}
	if err := rc.Validate(); err != nil {
		return fail(err)
	}
	if filepath.Clean(rc.Spec.StateDir) != filepath.Clean(dir.Path) {
		return fail(fmt.Errorf("%s names another state directory, %s", runner.ConfigName, rc.Spec.StateDir))
	}
	proc, err := runner.Adopt(ctx, dir)
	if err != nil {
		return fail(fmt.Errorf("take over its runner: %w", err))
	}
	log := s.h.Log().With("vm_id", id)
	agent, err := boot.DialAgent(ctx, proc, rc.Spec.SocketPath(), log)
	if err != nil {
		proc.Detach()
		return fail(fmt.Errorf("reach its guest agent again: %w", err))
	}
	w := &workerVM{set: s, id: id, dir: dir.Path, ops: make(chan struct{}, 1), meta: *m}
	w.log = openLogStore(dir.Path, s.h.Now)
	sink, flushSink := w.outputSink()
	cmd, err := agent.Attach(ctx, procWorker, sink)
	if err != nil {
		_ = agent.Close()
		proc.Detach()
		w.log.close()
		return fail(fmt.Errorf("attach to the worker's command: %w", err))
	}
	bt := &boot.Boot{Host: s.h, Selection: &boot.Selection{Backend: rc.Backend}, Dir: dir, VM: rc.Spec, Runner: proc, Agent: agent}
	rctx, cancel := context.WithCancel(s.bg)
	run := &workerRun{ctx: rctx, cancel: cancel, hash: m.PlanHash, ready: make(chan struct{}), done: make(chan struct{})}
	run.boot, run.agent, run.proc = bt, agent, cmd
	run.flush = func() { <-cmd.Done(); flushSink() }
	run.markReady(nil)

	s.mu.Lock()
	if s.closed || s.vms[id] != nil {
		s.mu.Unlock()
		cancel()
		_ = agent.Close()
		proc.Detach()
		w.log.close()
		return fail(errors.New("the adapter is shutting down"))
	}
	w.run = run
	s.vms[id] = w
	s.runs.Add(1)
	s.mu.Unlock()
	if cmd.Dropped > 0 {
		w.note("adopted by a new adapter process; %d bytes of the command's output were lost while no adapter was attached", cmd.Dropped)
	} else {
		w.note("adopted by a new adapter process: the command goes on (pid %d)", cmd.PID)
	}
	pid := cmd.PID
	w.update(func(m *workerMeta) { m.PID = &pid })
	log.Info("worker VM adopted", "pid", pid)
	go func() {
		defer s.runs.Done()
		defer close(run.done)
		defer cancel()
		w.follow(run, bt, cmd, run.flush)
	}()
	return true, nil
}
