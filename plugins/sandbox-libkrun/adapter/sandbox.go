package adapter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentclient"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/boot"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/runner"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
)

// sandbox is one VM, as the kit sees it: running, or paused (pause.go:
// its state saved beside its overlay, no VM process).
type sandbox struct {
	p       *Provider
	id      string
	backend string
	dir     *runner.Dir
	// vm is the VM's specification as it booted; resume starts it again
	// from the saved state with the same devices.
	vm      backend.Spec
	env     []string
	workdir string
	// net measures network payload for the reaper; nil without network.
	net *netActivity

	// move orders pause, resume and stop of the sandbox.
	move sync.Mutex
	// mu guards the VM's current runner and agent connection and the
	// pause state; Done fires when the current runner ends unless a
	// pause ended it.
	mu       sync.Mutex
	proc     *runner.Process
	agent    *agentclient.Client
	paused   bool
	pausing  bool
	stopping bool
	// detached: the adapter left the sandbox to the next adapter process
	// (adopt.go); rec is its sandbox.json.
	detached bool
	rec      sandboxRecord
	gone     chan struct{}
	goneOnce sync.Once

	once    sync.Once
	cleaned chan struct{}
	stopErr error
}

var _ sandboxkit.Sandbox = (*sandbox)(nil)

func newSandbox(p *Provider, b *boot.Boot) *sandbox {
	s := &sandbox{
		p: p, id: b.Spec.ID, backend: b.Selection.Backend,
		dir: b.Dir, proc: b.Runner, agent: b.Agent, vm: b.VM,
		env: b.Env, workdir: b.Workdir,
		gone:    make(chan struct{}),
		cleaned: make(chan struct{}),
	}
	if b.Spec.Network && b.Agent.Has(agentproto.CapNetStats) {
		s.net = newNetActivity(func(ctx context.Context) (*agentproto.NetStats, error) {
			return s.ag().NetStats(ctx, "")
		}, b.Spec.ReaperTick)
	}
	go s.watch(b.Runner)
	return s
}

// ag is the connection to the VM's agent.
func (s *sandbox) ag() *agentclient.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.agent
}

// watch marks the sandbox gone when proc, its current runner, ends on its
// own (not because a pause ended it).
func (s *sandbox) watch(proc *runner.Process) {
	<-proc.Done()
	s.mu.Lock()
	own := s.proc == proc && !s.pausing && !s.paused
	s.mu.Unlock()
	if own {
		s.markGone()
	}
}

func (s *sandbox) markGone() { s.goneOnce.Do(func() { close(s.gone) }) }

// Done implements sandboxkit.Sandbox: the VM is gone when its runner has
// exited on its own or the sandbox was stopped; a pause does not count.
func (s *sandbox) Done() <-chan struct{} { return s.gone }

// LastActivity implements sandboxkit.Sandbox: for a sandbox with network,
// the last time its guest's payload counters moved (see netActivity);
// zero otherwise, so only the kit's own operations count.
func (s *sandbox) LastActivity() time.Time {
	if s.net == nil {
		return time.Time{}
	}
	s.mu.Lock()
	proc, still := s.proc, s.paused || s.pausing
	s.mu.Unlock()
	if still {
		return time.Time{}
	}
	select {
	case <-proc.Done():
		// A VM that is gone answers nothing; the kit reaps it anyway.
		return time.Time{}
	default:
	}
	return s.net.LastActivity()
}

// Stop implements sandboxkit.Sandbox. The clean-up runs once, in the
// background, after any pause or resume under way; with wait, Stop
// returns when it is complete: the VM and its runner gone, the state
// directory (a paused sandbox's saved state included) removed.
func (s *sandbox) Stop(ctx context.Context, wait bool) error {
	s.once.Do(func() {
		s.mu.Lock()
		s.stopping = true
		s.mu.Unlock()
		go s.stop()
	})
	if !wait {
		return nil
	}
	select {
	case <-s.cleaned:
		return s.stopErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *sandbox) stop() {
	defer close(s.cleaned)
	defer s.markGone()
	defer s.p.forget(s)
	s.move.Lock()
	defer s.move.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), boot.StopBudget)
	defer cancel()
	log := s.p.log.With("sandbox_id", s.id)
	s.mu.Lock()
	proc, agent, paused, detached := s.proc, s.agent, s.paused, s.detached
	s.mu.Unlock()
	if detached {
		// Not ours any more: the next adapter process owns it.
		return
	}
	if paused {
		// No VM: its saved state goes with the directory.
		if err := s.dir.Remove(); err != nil {
			s.stopErr = err
			log.Warn("paused sandbox clean-up incomplete", "error", err)
		}
		return
	}

	select {
	case <-proc.Done():
	default:
		if s.p.isClosed() {
			// The adapter is going: the runner kills the VM at once.
			break
		}
		sctx, scancel := context.WithTimeout(ctx, boot.ShutdownTimeout)
		err := agent.Shutdown(sctx)
		scancel()
		// libkrun on x86_64 has no ACPI: a powered-off guest halts but
		// its VMM stays, so only QEMU is worth waiting for.
		if err == nil && s.backend == backend.QEMU {
			t := time.NewTimer(boot.PowerOffWait)
			select {
			case <-proc.Done():
			case <-t.C:
				log.Debug("the VM did not exit after the guest powered off; killing it")
			}
			t.Stop()
		}
	}
	_ = agent.Close()
	var errs []error
	if err := proc.Stop(ctx, boot.ReleaseGrace); err != nil {
		errs = append(errs, fmt.Errorf("stop the VM runner (pid %d): %w", proc.PID, err))
	}
	if err := s.dir.Remove(); err != nil {
		errs = append(errs, err)
	}
	s.stopErr = errors.Join(errs...)
	if s.stopErr != nil {
		log.Warn("sandbox clean-up incomplete", "error", s.stopErr)
	}
}

// Exec implements sandboxkit.Sandbox.
func (s *sandbox) Exec(ctx context.Context, spec sandboxkit.ExecSpec) (sandboxkit.ExecResult, error) {
	req := agentclient.ExecRequest{
		Argv:           spec.Argv,
		Env:            boot.MergeEnv(s.env, spec.Env),
		Workdir:        spec.Workdir,
		Timeout:        spec.Timeout,
		MaxOutputBytes: contract.ExecOutputCap,
	}
	if req.Workdir == "" {
		req.Workdir = s.workdir
	}
	if spec.Stdin != nil {
		req.Stdin = bytes.NewReader(spec.Stdin)
	}
	res, err := s.ag().Exec(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return sandboxkit.ExecResult{}, ctx.Err()
		}
		return sandboxkit.ExecResult{}, agentclient.ContractError(err, "exec")
	}
	out := sandboxkit.ExecResult{
		Stdout:          res.Stdout,
		Stderr:          res.Stderr,
		StdoutTruncated: res.StdoutTruncated,
		StderrTruncated: res.StderrTruncated,
		TimedOut:        res.TimedOut,
	}
	// A process killed by a signal (or by the timeout) has no exit code.
	if !res.TimedOut && res.Signal == 0 {
		code := res.ExitCode
		out.ExitCode = &code
	}
	return out, nil
}

// fsErr maps an agent error for fs operation op.
func fsErr(ctx context.Context, err error, op string) error {
	if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return ctx.Err()
	}
	return agentclient.ContractError(err, op)
}

func entryOf(e agentproto.FsEntry) contract.FsEntry {
	mode, _ := contract.ParseMode(e.Mode)
	return contract.FsEntry{Name: e.Name, IsDir: e.IsDir, Size: uint64(max(e.Size, 0)), Mode: mode, Mtime: e.Mtime, IsSymlink: e.IsSymlink}
}

// FsLs implements sandboxkit.Sandbox.
func (s *sandbox) FsLs(ctx context.Context, req *contract.FsLsRequest) (*contract.FsLsResponse, error) {
	res, err := s.ag().Ls(ctx, req.Path)
	if err != nil {
		return nil, fsErr(ctx, err, agentproto.OpLs)
	}
	out := &contract.FsLsResponse{Entries: make([]contract.FsEntry, 0, len(res.Entries))}
	for _, e := range res.Entries {
		out.Entries = append(out.Entries, entryOf(e))
	}
	return out, nil
}

// FsStat implements sandboxkit.Sandbox.
func (s *sandbox) FsStat(ctx context.Context, req *contract.FsStatRequest) (*contract.FsEntry, error) {
	res, err := s.ag().Stat(ctx, req.Path)
	if err != nil {
		return nil, fsErr(ctx, err, agentproto.OpStat)
	}
	e := entryOf(*res)
	return &e, nil
}

// FsMkdir implements sandboxkit.Sandbox.
func (s *sandbox) FsMkdir(ctx context.Context, req *contract.FsMkdirRequest) (*contract.FsMkdirResponse, error) {
	res, err := s.ag().Mkdir(ctx, req.Path, req.Mode.String(), req.Parents)
	if err != nil {
		return nil, fsErr(ctx, err, agentproto.OpMkdir)
	}
	return &contract.FsMkdirResponse{Created: res.Created}, nil
}

// FsWrite implements sandboxkit.Sandbox.
func (s *sandbox) FsWrite(ctx context.Context, req *contract.FsWriteRequest, content io.Reader) (*contract.FsWriteResponse, error) {
	res, err := s.ag().WriteFile(ctx, &agentproto.FSRequest{Path: req.Path, Mode: req.Mode.String(), Parents: req.Parents}, content)
	if err != nil {
		return nil, fsErr(ctx, err, agentproto.OpWrite)
	}
	return &contract.FsWriteResponse{BytesWritten: uint64(max(res.BytesWritten, 0)), Path: res.Path}, nil
}

// FsRead implements sandboxkit.Sandbox. The file's bytes stream from the
// guest as the caller reads them.
func (s *sandbox) FsRead(ctx context.Context, req *contract.FsReadRequest) (*contract.FsReadMeta, io.ReadCloser, error) {
	meta, body, err := s.ag().ReadFile(ctx, req.Path)
	if err != nil {
		return nil, nil, fsErr(ctx, err, agentproto.OpRead)
	}
	mode, _ := contract.ParseMode(meta.Mode)
	return &contract.FsReadMeta{Size: uint64(max(meta.Size, 0)), Mode: mode, Mtime: meta.Mtime}, &readBody{rc: body}, nil
}

// readBody reports a read cut off mid-file as the contract's S218 (the
// stream aborted; retryable), and the agent's own S-codes as they are.
type readBody struct{ rc io.ReadCloser }

func (r *readBody) Read(p []byte) (int, error) {
	n, err := r.rc.Read(p)
	if err == nil || errors.Is(err, io.EOF) {
		return n, err
	}
	var ae *agentproto.Error
	if errors.As(err, &ae) && len(ae.Code) > 0 && ae.Code[0] == 'S' {
		return n, agentclient.ContractError(err, agentproto.OpRead)
	}
	return n, contract.NewError(contract.S218, "reading the file from the sandbox was cut off: %v; retry", err)
}

func (r *readBody) Close() error { return r.rc.Close() }

// FsRm implements sandboxkit.Sandbox.
func (s *sandbox) FsRm(ctx context.Context, req *contract.FsRmRequest) (*contract.FsRmResponse, error) {
	res, err := s.ag().Rm(ctx, req.Path, req.Recursive)
	if err != nil {
		return nil, fsErr(ctx, err, agentproto.OpRm)
	}
	return &contract.FsRmResponse{Removed: res.Removed}, nil
}

// FsChmod implements sandboxkit.Sandbox.
func (s *sandbox) FsChmod(ctx context.Context, req *contract.FsChmodRequest) (*contract.FsChmodResponse, error) {
	r := &agentproto.FSRequest{Path: req.Path, Mode: req.Mode.String(), Recursive: &req.Recursive}
	if req.UID != nil {
		uid := int(*req.UID)
		r.UID = &uid
	}
	if req.GID != nil {
		gid := int(*req.GID)
		r.GID = &gid
	}
	res, err := s.ag().Chmod(ctx, r)
	if err != nil {
		return nil, fsErr(ctx, err, agentproto.OpChmod)
	}
	return &contract.FsChmodResponse{Updated: uint64(max(res.Updated, 0))}, nil
}

// FsMv implements sandboxkit.Sandbox.
func (s *sandbox) FsMv(ctx context.Context, req *contract.FsMvRequest) (*contract.FsMvResponse, error) {
	res, err := s.ag().Mv(ctx, req.Src, req.Dst, req.Overwrite)
	if err != nil {
		return nil, fsErr(ctx, err, agentproto.OpMv)
	}
	return &contract.FsMvResponse{Moved: res.Moved}, nil
}

// clampInt turns a contract count into the agent's int; 0 keeps meaning
// "the default".
func clampInt(n uint64) int {
	if n > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(n)
}

// FsGrep implements sandboxkit.Sandbox.
func (s *sandbox) FsGrep(ctx context.Context, req *contract.FsGrepRequest) (*contract.FsGrepResponse, error) {
	res, err := s.ag().Grep(ctx, &agentproto.FSRequest{
		Path: req.Path, Pattern: req.Pattern, Recursive: &req.Recursive, IgnoreCase: req.IgnoreCase,
		IncludeGlob: req.IncludeGlob, ExcludeGlob: req.ExcludeGlob,
		MaxMatches: clampInt(req.MaxMatches), MaxLineBytes: clampInt(req.MaxLineBytes),
	})
	if err != nil {
		return nil, fsErr(ctx, err, agentproto.OpGrep)
	}
	out := &contract.FsGrepResponse{Matches: make([]contract.GrepMatch, 0, len(res.Matches)), Truncated: res.Truncated}
	for _, m := range res.Matches {
		out.Matches = append(out.Matches, contract.GrepMatch{Path: m.Path, Line: uint64(max(m.Line, 0)), Content: m.Content})
	}
	return out, nil
}

// FsSed implements sandboxkit.Sandbox.
func (s *sandbox) FsSed(ctx context.Context, req *contract.FsSedRequest) (*contract.FsSedResponse, error) {
	res, err := s.ag().Sed(ctx, &agentproto.FSRequest{
		Files: req.Files, Path: req.Path, Recursive: &req.Recursive,
		IncludeGlob: req.IncludeGlob, ExcludeGlob: req.ExcludeGlob,
		Pattern: req.Pattern, Replacement: &req.Replacement, Regex: &req.Regex,
		FirstOnly: req.FirstOnly, IgnoreCase: req.IgnoreCase,
	})
	if err != nil {
		return nil, fsErr(ctx, err, agentproto.OpSed)
	}
	out := &contract.FsSedResponse{Results: make([]contract.SedResult, 0, len(res.Results)), TotalReplacements: uint64(max(res.TotalReplacements, 0))}
	for _, r := range res.Results {
		// Over a directory the contract lists the files sed changed or
		// failed on; the agent also reports the ones it left alone.
		if req.Path != "" && r.Success && r.Replacements == 0 {
			continue
		}
		out.Results = append(out.Results, contract.SedResult{Path: r.Path, Replacements: uint64(max(r.Replacements, 0)), Success: r.Success, Error: r.Error})
	}
	return out, nil
}
