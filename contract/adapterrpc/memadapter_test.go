package adapterrpc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/iii-sandbox/iii/contract"
)

// memAdapter is a small in-memory Adapter for the wire tests: sandboxes are
// maps of files, exec understands a handful of made-up commands. It is a
// fake standing in for a VM back end in unit tests of the transport only.
type memAdapter struct {
	mu        sync.Mutex
	allowlist []string
	sandboxes map[string]*memSandbox
	// readFailAfter, when positive, makes every fs::read body fail after
	// that many bytes, to test errors that arrive mid-stream.
	readFailAfter int
}

type memSandbox struct {
	image   string
	name    string
	stopped bool
	files   map[string]*memFile
}

type memFile struct {
	dir  bool
	mode contract.Mode
	data []byte
}

var _ contract.Adapter = (*memAdapter)(nil)

func newMemAdapter() *memAdapter {
	return &memAdapter{allowlist: []string{"python", "node"}, sandboxes: map[string]*memSandbox{}}
}

func (m *memAdapter) Info(context.Context) (*contract.AdapterInfo, error) {
	return &contract.AdapterInfo{
		Adapter: "mem", AdapterVersion: "0.0.1-test", Contract: contract.Current(),
		Facts: map[string]any{"backend": "memory", "max_vcpus": float64(8)},
	}, nil
}

func (m *memAdapter) Configure(_ context.Context, configJSON []byte) error {
	var cfg struct {
		ImageAllowlist []string `json:"image_allowlist"`
	}
	if err := json.Unmarshal(configJSON, &cfg); err != nil {
		return fmt.Errorf("config is not a JSON object of the adapter's keys: %v", err)
	}
	for _, im := range cfg.ImageAllowlist {
		if im == "" {
			return contract.NewError(contract.S100, "image_allowlist holds an empty name")
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.allowlist = cfg.ImageAllowlist
	return nil
}

func (m *memAdapter) live(id string) (*memSandbox, error) {
	sb, ok := m.sandboxes[id]
	if !ok {
		return nil, contract.NewError(contract.S002, "sandbox not found: %s", id)
	}
	if sb.stopped {
		return nil, contract.NewError(contract.S004, "sandbox already stopped: %s", id)
	}
	return sb, nil
}

func (m *memAdapter) Create(_ context.Context, req *contract.CreateRequest) (*contract.CreateResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	allowed := false
	for _, a := range m.allowlist {
		allowed = allowed || a == req.Image
	}
	if !allowed {
		return nil, contract.NewError(contract.S100, "image %q is not allowed; allowed: %s", req.Image, strings.Join(m.allowlist, ", "))
	}
	id := uuid.NewString()
	m.sandboxes[id] = &memSandbox{image: req.Image, name: req.Name, files: map[string]*memFile{"/": {dir: true, mode: 0o755}}}
	return &contract.CreateResponse{SandboxID: id, Image: req.Image}, nil
}

func (m *memAdapter) Exec(ctx context.Context, req *contract.ExecRequest) (*contract.ExecResponse, error) {
	m.mu.Lock()
	_, err := m.live(req.SandboxID)
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return m.run(ctx, req.Argv, req.Stdin, req.Env)
}

func (m *memAdapter) run(ctx context.Context, argv []string, stdin []byte, env []string) (*contract.ExecResponse, error) {
	out := &contract.ExecResponse{DurationMS: 1}
	code := 0
	switch argv[0] {
	case "echo":
		out.Stdout = strings.Join(argv[1:], " ") + "\n"
	case "cat":
		out.Stdout = string(stdin)
	case "env":
		out.Stdout = strings.Join(env, "\n")
	case "fail":
		code = 3
		out.Stderr = "failed on purpose\n"
	case "killed":
		out.ExitCode = nil
		out.Success = false
		return out, nil
	case "flood":
		out.Stdout = strings.Repeat("x", contract.ExecOutputCap)
		out.StdoutTruncated = true
	case "hang":
		<-ctx.Done()
		return nil, ctx.Err()
	case "slow":
		return nil, contract.NewError(contract.S200, "exec timed out after 10 ms")
	case "crash":
		return nil, errors.New("the guest agent went away")
	default:
		code = 127
		out.Stderr = argv[0] + ": not found\n"
	}
	out.ExitCode = &code
	out.Success = contract.ExecSuccess(out.ExitCode, out.TimedOut)
	return out, nil
}

func (m *memAdapter) Run(ctx context.Context, req *contract.RunRequest) (*contract.RunResponse, error) {
	created, err := m.Create(ctx, &contract.CreateRequest{Image: req.Image, Env: req.Env})
	if err != nil {
		return nil, contract.WrapRunStep(contract.RunStepCreate, "", contract.AsError(err, contract.S300))
	}
	id := created.SandboxID
	for _, f := range req.Files {
		if _, err := m.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: id, Path: f.Path, Mode: contract.DefaultFileMode, Parents: true},
			strings.NewReader(f.Content)); err != nil {
			return nil, contract.WrapRunStep(contract.RunStepWriteFile, id, contract.AsError(err, contract.S216))
		}
	}
	interp, file := contract.RunInterpreter(req.Lang)
	if _, err := m.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: id, Path: file, Mode: contract.DefaultFileMode, Parents: true},
		strings.NewReader(req.Code)); err != nil {
		return nil, contract.WrapRunStep(contract.RunStepWriteCode, id, contract.AsError(err, contract.S216))
	}
	res, err := m.run(ctx, []string{interp, file}, req.Stdin, req.Env)
	if err == nil && interp == "python3" {
		res.Stdout = req.Code
		res.Stderr = ""
		zero := 0
		res.ExitCode = &zero
		res.Success = true
	}
	out := &contract.RunResponse{}
	if !req.KeepSandbox {
		_, _ = m.Stop(ctx, &contract.StopRequest{SandboxID: id})
	} else {
		out.SandboxID = id
	}
	if err != nil {
		return nil, contract.WrapRunStep(contract.RunStepExec, out.SandboxID, contract.AsError(err, contract.S300))
	}
	out.ExecResponse = *res
	return out, nil
}

func (m *memAdapter) List(context.Context, *contract.ListRequest) (*contract.ListResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := &contract.ListResponse{}
	for id, sb := range m.sandboxes {
		out.Sandboxes = append(out.Sandboxes, contract.ListEntry{
			SandboxID: id, Name: sb.name, Image: sb.image, ExecSlotsFree: contract.DefaultMaxConcurrentExecPerSandbox, Stopped: sb.stopped,
		})
	}
	sort.Slice(out.Sandboxes, func(i, j int) bool { return out.Sandboxes[i].SandboxID < out.Sandboxes[j].SandboxID })
	return out, nil
}

func (m *memAdapter) Stop(_ context.Context, req *contract.StopRequest) (*contract.StopResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, err := m.live(req.SandboxID)
	if err != nil {
		return nil, err
	}
	sb.stopped = true
	return &contract.StopResponse{SandboxID: req.SandboxID, Stopped: true}, nil
}

func (m *memAdapter) CatalogList(context.Context, *contract.CatalogListRequest) (*contract.CatalogListResponse, error) {
	return &contract.CatalogListResponse{Images: []contract.CatalogImage{
		{Name: "python", OCIRef: "docker.io/iiidev/python:latest", Kind: contract.KindPreset},
		{Name: "node", OCIRef: "docker.io/iiidev/node:latest", Kind: contract.KindPreset},
	}}, nil
}

// fsOp runs fn on a live sandbox under the lock.
func (m *memAdapter) fsOp(id string, fn func(sb *memSandbox) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, err := m.live(id)
	if err != nil {
		return err
	}
	return fn(sb)
}

func (sb *memSandbox) entry(p string) (contract.FsEntry, error) {
	f, ok := sb.files[path.Clean(p)]
	if !ok {
		return contract.FsEntry{}, contract.NewError(contract.S211, "file not found: %s", p)
	}
	return contract.FsEntry{Name: path.Base(p), IsDir: f.dir, Size: uint64(len(f.data)), Mode: f.mode, Mtime: 1_700_000_000}, nil
}

// parentOK reports S211 with the parents fix when p's parent is missing,
// or creates the parents when asked to.
func (sb *memSandbox) parentOK(p string, parents bool) error {
	dir := path.Dir(path.Clean(p))
	if f, ok := sb.files[dir]; ok {
		if !f.dir {
			return contract.NewError(contract.S212, "not a directory: %s", dir)
		}
		return nil
	}
	if !parents {
		return contract.ParentNotFound(p)
	}
	for d := dir; d != "/"; d = path.Dir(d) {
		if _, ok := sb.files[d]; !ok {
			sb.files[d] = &memFile{dir: true, mode: contract.DefaultDirMode}
		}
	}
	return nil
}

func (m *memAdapter) FsLs(_ context.Context, req *contract.FsLsRequest) (*contract.FsLsResponse, error) {
	out := &contract.FsLsResponse{}
	err := m.fsOp(req.SandboxID, func(sb *memSandbox) error {
		dir := path.Clean(req.Path)
		e, err := sb.entry(dir)
		if err != nil {
			return err
		}
		if !e.IsDir {
			return contract.NewError(contract.S212, "not a directory: %s", dir)
		}
		for p := range sb.files {
			if p != dir && path.Dir(p) == dir {
				e, _ := sb.entry(p)
				out.Entries = append(out.Entries, e)
			}
		}
		sort.Slice(out.Entries, func(i, j int) bool { return out.Entries[i].Name < out.Entries[j].Name })
		return nil
	})
	return out, err
}

func (m *memAdapter) FsStat(_ context.Context, req *contract.FsStatRequest) (*contract.FsEntry, error) {
	var out contract.FsEntry
	err := m.fsOp(req.SandboxID, func(sb *memSandbox) (err error) {
		out, err = sb.entry(req.Path)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

func (m *memAdapter) FsMkdir(_ context.Context, req *contract.FsMkdirRequest) (*contract.FsMkdirResponse, error) {
	out := &contract.FsMkdirResponse{}
	err := m.fsOp(req.SandboxID, func(sb *memSandbox) error {
		p := path.Clean(req.Path)
		if _, ok := sb.files[p]; ok {
			return nil
		}
		if err := sb.parentOK(p, req.Parents); err != nil {
			return err
		}
		sb.files[p] = &memFile{dir: true, mode: req.Mode}
		out.Created = true
		return nil
	})
	return out, err
}

func (m *memAdapter) FsWrite(_ context.Context, req *contract.FsWriteRequest, content io.Reader) (*contract.FsWriteResponse, error) {
	if err := m.fsOp(req.SandboxID, func(sb *memSandbox) error { return sb.parentOK(req.Path, req.Parents) }); err != nil {
		return nil, err
	}
	// Read outside the lock: the content may be a long stream.
	data, err := io.ReadAll(content)
	if err != nil {
		return nil, err
	}
	err = m.fsOp(req.SandboxID, func(sb *memSandbox) error {
		sb.files[path.Clean(req.Path)] = &memFile{mode: req.Mode, data: data}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &contract.FsWriteResponse{BytesWritten: uint64(len(data)), Path: req.Path}, nil
}

// failingReader yields data, then fails with err.
type failingReader struct {
	data []byte
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if len(f.data) == 0 {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

func (m *memAdapter) FsRead(_ context.Context, req *contract.FsReadRequest) (*contract.FsReadMeta, io.ReadCloser, error) {
	var meta contract.FsReadMeta
	var data []byte
	err := m.fsOp(req.SandboxID, func(sb *memSandbox) error {
		f, ok := sb.files[path.Clean(req.Path)]
		if !ok {
			return contract.NewError(contract.S211, "file not found: %s", req.Path)
		}
		if f.dir {
			return contract.NewError(contract.S212, "is a directory: %s", req.Path)
		}
		meta = contract.FsReadMeta{Size: uint64(len(f.data)), Mode: f.mode, Mtime: 1_700_000_000}
		data = f.data
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if m.readFailAfter > 0 && len(data) > m.readFailAfter {
		return &meta, io.NopCloser(&failingReader{data: data[:m.readFailAfter], err: contract.NewError(contract.S216, "disk read failed at byte %d", m.readFailAfter)}), nil
	}
	return &meta, io.NopCloser(bytes.NewReader(data)), nil
}

func (m *memAdapter) FsRm(_ context.Context, req *contract.FsRmRequest) (*contract.FsRmResponse, error) {
	out := &contract.FsRmResponse{}
	err := m.fsOp(req.SandboxID, func(sb *memSandbox) error {
		p := path.Clean(req.Path)
		if _, ok := sb.files[p]; !ok {
			return contract.NewError(contract.S211, "file not found: %s", p)
		}
		for q := range sb.files {
			if strings.HasPrefix(q, p+"/") {
				if !req.Recursive {
					return contract.NewError(contract.S214, "directory not empty: %s", p)
				}
				delete(sb.files, q)
			}
		}
		delete(sb.files, p)
		out.Removed = true
		return nil
	})
	return out, err
}

func (m *memAdapter) FsChmod(_ context.Context, req *contract.FsChmodRequest) (*contract.FsChmodResponse, error) {
	out := &contract.FsChmodResponse{}
	err := m.fsOp(req.SandboxID, func(sb *memSandbox) error {
		f, ok := sb.files[path.Clean(req.Path)]
		if !ok {
			return contract.NewError(contract.S211, "file not found: %s", req.Path)
		}
		if req.UID != nil && *req.UID != 0 {
			return contract.NewError(contract.S215, "permission denied: chown %s to %d", req.Path, *req.UID)
		}
		f.mode = req.Mode
		out.Updated = 1
		return nil
	})
	return out, err
}

func (m *memAdapter) FsMv(_ context.Context, req *contract.FsMvRequest) (*contract.FsMvResponse, error) {
	out := &contract.FsMvResponse{}
	err := m.fsOp(req.SandboxID, func(sb *memSandbox) error {
		src, dst := path.Clean(req.Src), path.Clean(req.Dst)
		f, ok := sb.files[src]
		if !ok {
			return contract.NewError(contract.S211, "file not found: %s", src)
		}
		if _, exists := sb.files[dst]; exists && !req.Overwrite {
			return contract.NewError(contract.S213, "already exists: %s", dst)
		}
		sb.files[dst] = f
		delete(sb.files, src)
		out.Moved = true
		return nil
	})
	return out, err
}

func (m *memAdapter) FsGrep(_ context.Context, req *contract.FsGrepRequest) (*contract.FsGrepResponse, error) {
	pat := req.Pattern
	if req.IgnoreCase {
		pat = "(?i)" + pat
	}
	re, err := regexp.Compile(pat)
	if err != nil {
		return nil, contract.NewError(contract.S217, "invalid regex: %v", err)
	}
	out := &contract.FsGrepResponse{}
	err = m.fsOp(req.SandboxID, func(sb *memSandbox) error {
		var paths []string
		for p, f := range sb.files {
			if !f.dir && strings.HasPrefix(p, path.Clean(req.Path)) {
				paths = append(paths, p)
			}
		}
		sort.Strings(paths)
		for _, p := range paths {
			for i, line := range strings.Split(string(sb.files[p].data), "\n") {
				if !re.MatchString(line) {
					continue
				}
				if uint64(len(out.Matches)) == req.MaxMatches {
					out.Truncated = true
					return nil
				}
				out.Matches = append(out.Matches, contract.GrepMatch{Path: p, Line: uint64(i + 1), Content: line})
			}
		}
		return nil
	})
	return out, err
}

func (m *memAdapter) FsSed(_ context.Context, req *contract.FsSedRequest) (*contract.FsSedResponse, error) {
	pat := req.Pattern
	if !req.Regex {
		pat = regexp.QuoteMeta(pat)
	}
	if req.IgnoreCase {
		pat = "(?i)" + pat
	}
	re, err := regexp.Compile(pat)
	if err != nil {
		return nil, contract.NewError(contract.S217, "invalid regex: %v", err)
	}
	out := &contract.FsSedResponse{}
	err = m.fsOp(req.SandboxID, func(sb *memSandbox) error {
		for _, p := range req.Files {
			f, ok := sb.files[path.Clean(p)]
			if !ok {
				out.Results = append(out.Results, contract.SedResult{Path: p, Error: "file not found"})
				continue
			}
			n := uint64(len(re.FindAllIndex(f.data, -1)))
			f.data = re.ReplaceAll(f.data, []byte(req.Replacement))
			out.Results = append(out.Results, contract.SedResult{Path: p, Replacements: n, Success: true})
			out.TotalReplacements += n
		}
		return nil
	})
	return out, err
}
