package sandboxkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/contract"
)

// fakeProvider is a Provider for the Manager's unit tests: sandboxes are
// maps of files and exec understands a few made-up commands. The real
// back end is exercised by the hostdir adapter's conformance run.
type fakeProvider struct {
	mu         sync.Mutex
	presets    []contract.CatalogImage
	configured map[string]json.RawMessage
	configErr  error
	bootErr    error
	writeErr   error
	boots      []BootSpec
	sandboxes  []*fakeSandbox
	// progress is reported by every Boot, before it answers.
	progress []contract.ProgressEvent
	// activityHook, when set, runs inside each new sandbox's
	// LastActivity.
	activityHook func()
}

func newFakeProvider() *fakeProvider {
	return &fakeProvider{presets: []contract.CatalogImage{
		{Name: "python", OCIRef: "example/python:1"},
		{Name: "node", OCIRef: "example/node:1"},
		{Name: "shell", OCIRef: "example/shell:1"},
	}}
}

func (p *fakeProvider) Presets() []contract.CatalogImage { return p.presets }

func (p *fakeProvider) Configure(_ context.Context, keys map[string]json.RawMessage) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.configured = keys
	return p.configErr
}

func (p *fakeProvider) Info(context.Context) map[string]any {
	return map[string]any{"backend": "fake"}
}

func (p *fakeProvider) Boot(ctx context.Context, spec BootSpec) (Sandbox, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.boots = append(p.boots, spec)
	for _, ev := range p.progress {
		ReportProgress(ctx, ev)
	}
	if p.bootErr != nil {
		return nil, p.bootErr
	}
	sb := &fakeSandbox{spec: spec, files: map[string]string{}, done: make(chan struct{}), writeErr: p.writeErr, activityHook: p.activityHook}
	p.sandboxes = append(p.sandboxes, sb)
	return sb, nil
}

func (p *fakeProvider) sandbox(id string) *fakeSandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.sandboxes {
		if s.spec.ID == id {
			return s
		}
	}
	return nil
}

type fakeSandbox struct {
	spec BootSpec

	mu        sync.Mutex
	files     map[string]string
	execs     []ExecSpec
	stopCalls int
	stopWait  bool
	activity  time.Time
	writeErr  error
	done      chan struct{}
	doneOnce  sync.Once
	// activityHook runs at the start of LastActivity.
	activityHook func()
	// paused, pauses and resumes: Pausable (pause_test.go).
	paused          bool
	pauses, resumes int
	pauseErr        error
}

// die makes the sandbox end on its own.
func (s *fakeSandbox) die() { s.doneOnce.Do(func() { close(s.done) }) }

func (s *fakeSandbox) lastExec() ExecSpec {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.execs[len(s.execs)-1]
}

func (s *fakeSandbox) stops() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopCalls
}

// Exec understands:
//
//	echo ARGS...   stdout = ARGS joined
//	exit N         exit code N
//	signal         exit code nil (killed)
//	timeout        TimedOut
//	flood          2 MiB of stdout the provider forgot to cap
//	block          waits for ctx or the sandbox's end
//	block-s300     the same, ending with an S300 error (a VM's lost agent)
//	fail           a plain error
func (s *fakeSandbox) Exec(ctx context.Context, spec ExecSpec) (ExecResult, error) {
	s.mu.Lock()
	s.execs = append(s.execs, spec)
	s.mu.Unlock()
	zero := 0
	switch spec.Argv[0] {
	case "echo":
		return ExecResult{Stdout: []byte(strings.Join(spec.Argv[1:], " ")), ExitCode: &zero}, nil
	case "exit":
		n, _ := strconv.Atoi(spec.Argv[1])
		return ExecResult{ExitCode: &n}, nil
	case "signal":
		return ExecResult{}, nil
	case "timeout":
		return ExecResult{TimedOut: true}, nil
	case "flood":
		return ExecResult{Stdout: bytes.Repeat([]byte("x"), 2<<20), Stderr: []byte("e"), ExitCode: &zero}, nil
	case "block", "block-s300":
		select {
		case <-ctx.Done():
			return ExecResult{}, ctx.Err()
		case <-s.done:
			if spec.Argv[0] == "block-s300" {
				return ExecResult{}, contract.NewError(contract.S300, "guest agent: connection closed")
			}
			return ExecResult{}, errors.New("sandbox gone")
		}
	case "fail":
		return ExecResult{}, errors.New("the back end broke")
	}
	n := 127
	return ExecResult{Stderr: []byte("not found"), ExitCode: &n}, nil
}

func (s *fakeSandbox) FsLs(context.Context, *contract.FsLsRequest) (*contract.FsLsResponse, error) {
	return &contract.FsLsResponse{}, nil
}

func (s *fakeSandbox) FsStat(_ context.Context, req *contract.FsStatRequest) (*contract.FsEntry, error) {
	switch req.Path {
	case "/plain-error":
		return nil, errors.New("disk on fire")
	case "/missing":
		return nil, contract.NewError(contract.S211, "path not found: /missing")
	case "/nil":
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.files[req.Path]; ok {
		return &contract.FsEntry{Name: req.Path, Size: uint64(len(c)), Mode: 0o644}, nil
	}
	return nil, contract.NewError(contract.S211, "path not found: %s", req.Path)
}

func (s *fakeSandbox) FsMkdir(context.Context, *contract.FsMkdirRequest) (*contract.FsMkdirResponse, error) {
	return &contract.FsMkdirResponse{Created: true}, nil
}

func (s *fakeSandbox) FsWrite(_ context.Context, req *contract.FsWriteRequest, content io.Reader) (*contract.FsWriteResponse, error) {
	s.mu.Lock()
	werr := s.writeErr
	s.mu.Unlock()
	if werr != nil {
		return nil, werr
	}
	if !req.Parents {
		return nil, contract.ParentNotFound(req.Path)
	}
	b, err := io.ReadAll(content)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.files[req.Path] = string(b)
	return &contract.FsWriteResponse{BytesWritten: uint64(len(b)), Path: req.Path}, nil
}

func (s *fakeSandbox) FsRead(_ context.Context, req *contract.FsReadRequest) (*contract.FsReadMeta, io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.files[req.Path]
	if !ok {
		return nil, nil, contract.NewError(contract.S211, "path not found: %s", req.Path)
	}
	return &contract.FsReadMeta{Size: uint64(len(c))}, io.NopCloser(strings.NewReader(c)), nil
}

func (s *fakeSandbox) FsRm(context.Context, *contract.FsRmRequest) (*contract.FsRmResponse, error) {
	return &contract.FsRmResponse{Removed: true}, nil
}

func (s *fakeSandbox) FsChmod(context.Context, *contract.FsChmodRequest) (*contract.FsChmodResponse, error) {
	return &contract.FsChmodResponse{Updated: 1}, nil
}

func (s *fakeSandbox) FsMv(context.Context, *contract.FsMvRequest) (*contract.FsMvResponse, error) {
	return &contract.FsMvResponse{Moved: true}, nil
}

func (s *fakeSandbox) FsGrep(context.Context, *contract.FsGrepRequest) (*contract.FsGrepResponse, error) {
	return &contract.FsGrepResponse{}, nil
}

func (s *fakeSandbox) FsSed(context.Context, *contract.FsSedRequest) (*contract.FsSedResponse, error) {
	return &contract.FsSedResponse{}, nil
}

func (s *fakeSandbox) Stop(_ context.Context, wait bool) error {
	s.mu.Lock()
	s.stopCalls++
	s.stopWait = wait
	s.mu.Unlock()
	s.die()
	return nil
}

func (s *fakeSandbox) Done() <-chan struct{} { return s.done }

func (s *fakeSandbox) LastActivity() time.Time {
	if s.activityHook != nil {
		s.activityHook()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.activity
}
