package guest

import (
	"context"
	"math"
	"sync"
	"syscall"
	"time"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// Supervisor runs the long-lived processes of a worker VM (its command,
// its install step) by name: their output streams to the host with no cap,
// their exit is reported, and ProcStop ends one gracefully (SIGTERM to its
// process group, SIGKILL to its whole tree after the grace). It uses the
// Executor, so processes are reaped and killed exactly as execs are.
type Supervisor struct {
	Exec *Executor

	mu    sync.Mutex
	procs map[string]*supervised
}

type supervised struct {
	started chan struct{} // closed once pid is set (or the start failed)
	done    chan struct{} // closed once the process is gone
	pid     int
	cancel  context.CancelFunc
}

// Run starts req and streams it until the process exits (and its output is
// drained) or ctx ends, which kills the process tree.
func (s *Supervisor) Run(ctx context.Context, req *agentproto.SpawnRequest, eio ExecIO) (*agentproto.ExitStatus, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p := &supervised{started: make(chan struct{}), done: make(chan struct{}), cancel: cancel}
	s.mu.Lock()
	if s.procs == nil {
		s.procs = map[string]*supervised{}
	}
	if _, busy := s.procs[req.Name]; busy {
		s.mu.Unlock()
		return nil, agentproto.Errorf(agentproto.CodeInvalidRequest, "a process named %q is already running; stop it first", req.Name)
	}
	s.procs[req.Name] = p
	s.mu.Unlock()
	var startOnce sync.Once
	markStarted := func() { startOnce.Do(func() { close(p.started) }) }
	defer func() {
		markStarted()
		s.mu.Lock()
		delete(s.procs, req.Name)
		s.mu.Unlock()
		close(p.done)
	}()

	inner := eio.Started
	eio.Started = func(pid int) {
		s.mu.Lock()
		p.pid = pid
		s.mu.Unlock()
		markStarted()
		if inner != nil {
			inner(pid)
		}
	}
	return s.Exec.Run(ctx, &agentproto.ExecRequest{
		Argv: req.Argv, Env: req.Env, Workdir: req.Workdir,
		// A worker's output has no cap: it streams for as long as the
		// worker lives, paced by the host's flow control.
		MaxOutputBytes: math.MaxInt64,
	}, eio)
}

// Stop ends the process named req.Name: SIGTERM to its process group,
// then, after the grace, SIGKILL to everything it started. It returns once
// the process is gone.
func (s *Supervisor) Stop(ctx context.Context, req *agentproto.ProcStopRequest) (*agentproto.ProcStopResult, error) {
	s.mu.Lock()
	p := s.procs[req.Name]
	s.mu.Unlock()
	if p == nil {
		return &agentproto.ProcStopResult{}, nil
	}
	select {
	case <-p.started:
	case <-ctx.Done():
		return nil, agentproto.Errorf(agentproto.CodeCanceled, "stop %s: %v", req.Name, ctx.Err())
	}
	s.mu.Lock()
	pid := p.pid
	s.mu.Unlock()
	if pid > 0 {
		// The Executor starts each process in a session of its own, so
		// its pid is its process group.
		_ = syscall.Kill(-pid, syscall.SIGTERM)
	}
	t := time.NewTimer(time.Duration(req.GraceMS) * time.Millisecond)
	defer t.Stop()
	res := &agentproto.ProcStopResult{Stopped: true}
	select {
	case <-p.done:
		return res, nil
	case <-t.C:
	case <-ctx.Done():
	}
	// Canceling the run kills the whole tree (KillTree) and ends it.
	res.Killed = true
	p.cancel()
	select {
	case <-p.done:
		return res, nil
	case <-ctx.Done():
		return nil, agentproto.Errorf(agentproto.CodeCanceled, "stop %s: %v", req.Name, ctx.Err())
	}
}
