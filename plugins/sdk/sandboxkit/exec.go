package sandboxkit

import (
	"context"
	"errors"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/contract"
)

// Exec serves exec: S002/S004 for a missing or stopped sandbox, S003 at
// the exec cap (no queueing), the timeout clamped to max_exec_timeout_ms,
// and S200 when the process outlives it.
func (m *Manager) Exec(ctx context.Context, req *contract.ExecRequest) (*contract.ExecResponse, error) {
	resp, err := m.exec(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (m *Manager) exec(ctx context.Context, req *contract.ExecRequest) (*contract.ExecResponse, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, contract.NewError(contract.S001, "invalid sandbox::exec request: nothing to run: pass cmd (optionally with args) or argv: [bin, ...]")
	}
	e, ce := m.acquire(req.SandboxID, true)
	if ce != nil {
		return nil, ce
	}
	defer m.release(e, true)

	m.mu.Lock()
	maxMS := m.cfg.MaxExecTimeoutMS
	m.mu.Unlock()
	asked := req.TimeoutMS
	if asked == 0 {
		asked = contract.DefaultExecTimeoutMS
	}
	ms := min(asked, maxMS)
	timeout := durationOf(ms, time.Millisecond)

	// The provider enforces the timeout; the backstop only keeps a
	// provider that fails to from holding the caller forever.
	pctx, cancel := context.WithTimeout(ctx, addSat(timeout, execGrace))
	defer cancel()
	start := time.Now()
	res, err := e.sb.Exec(pctx, ExecSpec{
		Argv:    slices.Clone(req.Argv),
		Env:     slices.Clone(req.Env),
		Workdir: req.Workdir,
		Stdin:   req.Stdin,
		Timeout: timeout,
	})
	elapsed := time.Since(start)
	if err == nil && res.TimedOut || err != nil && ctx.Err() == nil && pctx.Err() != nil {
		return nil, timedOut(req, asked, ms)
	}
	if err != nil {
		return nil, m.opError(ctx, e, err, contract.S300)
	}
	stdout, outTrunc := capOutput(res.Stdout, res.StdoutTruncated)
	stderr, errTrunc := capOutput(res.Stderr, res.StderrTruncated)
	return &contract.ExecResponse{
		Stdout:          string(stdout),
		Stderr:          string(stderr),
		ExitCode:        res.ExitCode,
		DurationMS:      uint64(elapsed / time.Millisecond),
		Success:         contract.ExecSuccess(res.ExitCode, false),
		StdoutTruncated: outTrunc,
		StderrTruncated: errTrunc,
	}, nil
}

// timedOut is S200 for an exec that outlived its timeout.
func timedOut(req *contract.ExecRequest, asked, used uint64) *contract.Error {
	msg := "exec of " + quoteArg(req.Argv[0]) + " exceeded its timeout of " + itoa(used) + " ms and was killed"
	if asked > used {
		msg += " (timeout_ms " + itoa(asked) + " was clamped to the adapter's max_exec_timeout_ms " + itoa(used) + ")"
	}
	return contract.NewError(contract.S200, "%s", msg)
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

func quoteArg(s string) string {
	return "`" + truncate(s, 80) + "`"
}

// runWorkdir is where sandbox::run writes relative files and runs the
// code: the directory of the code file, so code finds its sibling files
// both by relative path and by module import (Python's sys.path[0] and
// Node's require('./x') start there).
const runWorkdir = "/tmp"

// Run serves run: create, write the files (parents created) and the code,
// exec the interpreter, and stop the sandbox whether it worked or not,
// unless keep_sandbox. A failing step keeps its own code, wrapped with
// the step, the sandbox id and the inner code (contract.WrapRunStep).
func (m *Manager) Run(ctx context.Context, req *contract.RunRequest) (*contract.RunResponse, error) {
	interpreter, codeFile := contract.RunInterpreter(req.Lang)
	created, ce := m.create(ctx, &contract.CreateRequest{Image: req.Image, Env: req.Env})
	if ce != nil {
		return nil, contract.WrapRunStep(contract.RunStepCreate, "", ce)
	}
	id := created.SandboxID
	// Clean-up must happen even when the caller has gone away.
	cleanup := func() {
		if req.KeepSandbox {
			return
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		defer cancel()
		if _, err := m.Stop(sctx, &contract.StopRequest{SandboxID: id}); err != nil && !contract.IsCode(err, contract.S004) {
			m.log.Warn("stopping the sandbox of a run failed", "sandbox_id", id, "error", err)
		}
	}
	fail := func(step string, err error, fallback contract.Code) (*contract.RunResponse, error) {
		cleanup()
		if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			return nil, err
		}
		return nil, contract.WrapRunStep(step, id, contract.AsError(err, fallback))
	}

	for _, f := range req.Files {
		p := f.Path
		if !path.IsAbs(p) {
			p = path.Join(runWorkdir, p)
		}
		w := &contract.FsWriteRequest{SandboxID: id, Path: p, Mode: contract.DefaultFileMode, Parents: true}
		if _, err := m.FsWrite(ctx, w, strings.NewReader(f.Content)); err != nil {
			return fail(contract.RunStepWriteFile, err, contract.S216)
		}
	}
	w := &contract.FsWriteRequest{SandboxID: id, Path: codeFile, Mode: contract.DefaultFileMode, Parents: true}
	if _, err := m.FsWrite(ctx, w, strings.NewReader(req.Code)); err != nil {
		return fail(contract.RunStepWriteCode, err, contract.S216)
	}
	res, err := m.exec(ctx, &contract.ExecRequest{
		SandboxID: id,
		Argv:      []string{interpreter, codeFile},
		Stdin:     req.Stdin,
		TimeoutMS: req.TimeoutMS,
		Workdir:   runWorkdir,
	})
	if err != nil {
		return fail(contract.RunStepExec, err, contract.S300)
	}
	cleanup()
	out := &contract.RunResponse{ExecResponse: *res}
	if req.KeepSandbox {
		out.SandboxID = id
	}
	return out, nil
}
