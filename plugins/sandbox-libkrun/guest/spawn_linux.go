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
//
// A kept process (SpawnRequest.Keep) outlives its stream and the host
// connection: a worker's command survives its adapter's restart. While no
// host is attached its output is held (the last KeptOutputBytes) and its
// exit recorded, until Attach on a later connection streams both.
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
	// keep routes a kept process's output; nil when the process lives
	// and dies with its stream.
	keep *keptOutput
}

// Run starts req and streams it until the process exits (and its output is
// drained) or ctx ends, which kills the process tree — unless req.Keep,
// when only the host's Cancel kills it and the stream ending detaches it.
func (s *Supervisor) Run(ctx context.Context, req *agentproto.SpawnRequest, eio ExecIO) (*agentproto.ExitStatus, error) {
	procCtx := ctx
	if req.Keep {
		// The process's life is its own: not the stream's, not the
		// connection's.
		procCtx = context.Background()
	}
	procCtx, cancel := context.WithCancel(procCtx)
	p := &supervised{started: make(chan struct{}), done: make(chan struct{}), cancel: cancel}
	s.mu.Lock()
	if s.procs == nil {
		s.procs = map[string]*supervised{}
	}
	if old, busy := s.procs[req.Name]; busy && !old.ended() {
		s.mu.Unlock()
		cancel()
		return nil, agentproto.Errorf(agentproto.CodeInvalidRequest, "a process named %q is already running; stop it first", req.Name)
	}
	s.procs[req.Name] = p
	s.mu.Unlock()
	var startOnce sync.Once
	markStarted := func() { startOnce.Do(func() { close(p.started) }) }

	execReq := &agentproto.ExecRequest{
		Argv: req.Argv, Env: req.Env, Workdir: req.Workdir,
		// A worker's output has no cap: it streams for as long as the
		// worker lives, paced by the host's flow control.
		MaxOutputBytes: math.MaxInt64,
	}
	if !req.Keep {
		defer func() {
			markStarted()
			s.forget(req.Name, p)
			close(p.done)
			cancel()
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
		return s.Exec.Run(procCtx, execReq, eio)
	}

	k := &keptOutput{}
	att := k.attach(ctx, eio)
	p.keep = k
	go func() {
		status, err := s.Exec.Run(procCtx, execReq, ExecIO{
			Stdout: k.sink(agentproto.KindStdout),
			Stderr: k.sink(agentproto.KindStderr),
			Started: func(pid int) {
				s.mu.Lock()
				p.pid = pid
				s.mu.Unlock()
				markStarted()
				if a := k.current(); a != nil && a.eio.Started != nil {
					a.eio.Started(pid)
				}
			},
		})
		k.finish(status, err)
		markStarted()
		close(p.done)
		cancel()
	}()
	return s.follow(ctx, req.Name, p, att)
}

// Attach streams the kept process req.Name on a new stream: its pid and
// how much output was dropped, the output held while detached, then its
// output as it comes and its exit.
func (s *Supervisor) Attach(ctx context.Context, req *agentproto.ProcAttachRequest, eio ExecIO) (*agentproto.ExitStatus, error) {
	s.mu.Lock()
	p := s.procs[req.Name]
	s.mu.Unlock()
	if p == nil || p.keep == nil {
		return nil, agentproto.Errorf(agentproto.CodeNoProcess, "no kept process named %q is in this VM", req.Name)
	}
	select {
	case <-p.started:
	case <-ctx.Done():
		return nil, agentproto.Errorf(agentproto.CodeCanceled, "attach %s: %v", req.Name, ctx.Err())
	}
	s.mu.Lock()
	pid := p.pid
	s.mu.Unlock()
	att, err := p.keep.takeOver(ctx, eio, pid)
	if err != nil {
		return nil, err
	}
	return s.follow(ctx, req.Name, p, att)
}

// follow waits on the stream att is for: the process's exit while att is
// attached (reported, and the process forgotten), att taken over by
// another stream, or the stream ending — the host's Cancel kills the
// process, anything else only detaches it.
func (s *Supervisor) follow(ctx context.Context, name string, p *supervised, att *attachment) (*agentproto.ExitStatus, error) {
	k := p.keep
	select {
	case <-p.done:
	case <-att.gone:
	case <-ctx.Done():
		if !canceledByHost(ctx) {
			k.detach(att)
			return nil, agentproto.Errorf(agentproto.CodeDisconnected, "%s: the stream ended; the process goes on", name)
		}
		p.cancel()
		<-p.done
	}
	select {
	case <-p.done:
	default:
		return nil, agentproto.Errorf(agentproto.CodeDetached, "%s was attached on another stream", name)
	}
	if canceledByHost(ctx) {
		// The host killed it: it knows.
		s.forget(name, p)
		return k.result()
	}
	if !k.holds(att) {
		return nil, agentproto.Errorf(agentproto.CodeDetached, "%s was attached on another stream", name)
	}
	// The exit stays for a later attach all the same: until a new
	// connection arrives the agent cannot tell a host that is gone from
	// one that is slow, so this report may have gone nowhere. A new spawn
	// of the name replaces it.
	return k.result()
}

func (s *Supervisor) forget(name string, p *supervised) {
	s.mu.Lock()
	if s.procs[name] == p {
		delete(s.procs, name)
	}
	s.mu.Unlock()
}

func (p *supervised) ended() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
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
	if p.keep != nil {
		// Nobody may be attached to tell its exit: stopping it is the
		// last word on it.
		defer s.forget(req.Name, p)
	}
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
