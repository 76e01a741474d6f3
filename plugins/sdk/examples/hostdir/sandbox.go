package hostdir

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit/fsops"
)

// Sandbox paths of the directories every sandbox starts with.
const (
	homeDir = "/home"
	tmpDir  = "/tmp"
)

// waitDelay is how long an exec waits, after its process exited, for
// output pipes still held by processes it left in the background.
const waitDelay = time.Second

// sandbox is one hostdir sandbox.
type sandbox struct {
	id      string
	dir     string // the host directory that is the sandbox's "/"
	bootEnv []string
	path    string // the PATH execs get
	log     hclog.Logger
	root    *os.Root
	tree    *fsops.Tree

	mu       sync.Mutex
	stopping bool
	paused   bool             // sandbox::pause (pause.go)
	groups   map[int]struct{} // process groups of execs, killed on stop
	running  sync.WaitGroup   // execs in flight
	stopCh   chan struct{}    // closed when Stop starts
	done     chan struct{}    // closed when Stop has finished
	stopErr  error
}

var _ sandboxkit.Sandbox = (*sandbox)(nil)

func newSandbox(spec sandboxkit.BootSpec, dir, hostPath string, log hclog.Logger) (*sandbox, error) {
	for _, d := range []string{homeDir, tmpDir} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	return &sandbox{
		id:      spec.ID,
		dir:     dir,
		bootEnv: spec.Env,
		path:    hostPath,
		log:     log,
		root:    root,
		tree:    fsops.NewTree(root, homeDir),
		groups:  map[int]struct{}{},
		stopCh:  make(chan struct{}),
		done:    make(chan struct{}),
	}, nil
}

// hostPath is where sandbox path p (absolute, cleaned) lives on the host.
func (s *sandbox) hostPath(p string) string {
	return filepath.Join(s.dir, filepath.FromSlash(p))
}

// mapArg rewrites an absolute argument whose first component exists in
// the sandbox to its host path (see the package documentation).
func (s *sandbox) mapArg(arg string) string {
	if !strings.HasPrefix(arg, "/") || strings.IndexByte(arg, 0) >= 0 {
		return arg
	}
	clean := path.Clean(arg)
	first, _, _ := strings.Cut(strings.TrimPrefix(clean, "/"), "/")
	if first == "" {
		return arg
	}
	if _, err := s.root.Lstat(first); err != nil {
		return arg
	}
	mapped := s.hostPath(clean)
	if strings.HasSuffix(arg, "/") {
		mapped += "/"
	}
	return mapped
}

// env is the exec's environment: the sandbox's base, the boot env, then
// the exec's own; a later entry for the same name wins.
func (s *sandbox) env(extra []string) []string {
	base := []string{
		"PATH=" + s.path,
		"HOME=" + s.hostPath(homeDir),
		"TMPDIR=" + s.hostPath(tmpDir),
		"LANG=C.UTF-8",
		"III_SANDBOX_ID=" + s.id,
		"III_SANDBOX_ROOT=" + s.dir,
	}
	return mergeEnv(base, s.bootEnv, extra)
}

// mergeEnv merges "K=V" lists; a later entry for a name replaces an
// earlier one in place.
func mergeEnv(lists ...[]string) []string {
	var out []string
	index := map[string]int{}
	for _, l := range lists {
		for _, kv := range l {
			k, _, _ := strings.Cut(kv, "=")
			if i, ok := index[k]; ok {
				out[i] = kv
				continue
			}
			index[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

// Exec implements sandboxkit.Sandbox.
func (s *sandbox) Exec(ctx context.Context, spec sandboxkit.ExecSpec) (sandboxkit.ExecResult, error) {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return sandboxkit.ExecResult{}, errors.New("the sandbox is stopped")
	}
	if s.paused {
		s.mu.Unlock()
		return sandboxkit.ExecResult{}, contract.SandboxPausedError(s.id, contract.OpExec)
	}
	s.running.Add(1)
	s.mu.Unlock()
	defer s.running.Done()

	env := s.env(spec.Env)
	workdir := spec.Workdir
	if workdir == "" {
		workdir = homeDir
	}
	name, shown := s.tree.Resolve(workdir)
	st, err := s.root.Stat(name)
	if err != nil {
		return sandboxkit.ExecResult{}, fsops.Error(shown, err)
	}
	if !st.IsDir() {
		return sandboxkit.ExecResult{}, contract.NewError(contract.S212, "workdir %s is not a directory", shown)
	}
	dir := s.hostPath(shown)

	argv := make([]string, len(spec.Argv))
	for i, a := range spec.Argv {
		argv[i] = s.mapArg(a)
	}
	var stdout, stderr sandboxkit.OutputBuffer
	bin, err := lookPath(argv[0], pathOf(env), dir)
	if err != nil {
		fmt.Fprintf(&stderr, "sandbox-hostdir: %s: command not found\n", spec.Argv[0])
		return result(&stdout, &stderr, exitCode(127), false), nil
	}
	cmd := exec.Command(bin, argv[1:]...)
	cmd.Args[0] = spec.Argv[0]
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdin = bytes.NewReader(spec.Stdin)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = waitDelay
	if err := cmd.Start(); err != nil {
		code := 126
		if errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		fmt.Fprintf(&stderr, "sandbox-hostdir: %s: %v\n", spec.Argv[0], errors.Unwrap(err))
		return result(&stdout, &stderr, exitCode(code), false), nil
	}
	pgid := cmd.Process.Pid
	s.mu.Lock()
	s.groups[pgid] = struct{}{}
	s.mu.Unlock()

	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	timer := time.NewTimer(spec.Timeout)
	defer timer.Stop()
	timedOut := false
	var waitErr error
	select {
	case waitErr = <-waited:
	case <-timer.C:
		timedOut = true
		killGroup(pgid)
		waitErr = <-waited
	case <-ctx.Done():
		killGroup(pgid)
		<-waited
		s.forgetGroup(pgid)
		return sandboxkit.ExecResult{}, ctx.Err()
	case <-s.stopCh:
		killGroup(pgid)
		<-waited
		return sandboxkit.ExecResult{}, errors.New("the sandbox was stopped while the exec ran")
	}
	s.forgetGroup(pgid)
	if waitErr != nil && !errors.Is(waitErr, exec.ErrWaitDelay) {
		var ee *exec.ExitError
		if !errors.As(waitErr, &ee) {
			return sandboxkit.ExecResult{}, fmt.Errorf("wait for %s: %w", spec.Argv[0], waitErr)
		}
	}
	var code *int
	if !timedOut {
		if c := cmd.ProcessState.ExitCode(); c >= 0 {
			code = exitCode(c)
		}
	}
	return result(&stdout, &stderr, code, timedOut), nil
}

func exitCode(c int) *int { return &c }

func result(stdout, stderr *sandboxkit.OutputBuffer, code *int, timedOut bool) sandboxkit.ExecResult {
	return sandboxkit.ExecResult{
		Stdout:          stdout.Bytes(),
		Stderr:          stderr.Bytes(),
		StdoutTruncated: stdout.Truncated(),
		StderrTruncated: stderr.Truncated(),
		ExitCode:        code,
		TimedOut:        timedOut,
	}
}

// pathOf is the PATH in env.
func pathOf(env []string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], "PATH="); ok {
			return v
		}
	}
	return ""
}

// forgetGroup drops a process group once nothing in it is left: a group
// with background processes is kept so Stop can kill it.
func (s *sandbox) forgetGroup(pgid int) {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		s.mu.Lock()
		delete(s.groups, pgid)
		s.mu.Unlock()
	}
}

func killGroup(pgid int) {
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// Stop implements sandboxkit.Sandbox: kill every process the sandbox
// started, wait for its execs to return, and remove its directory. It is
// complete when it returns, with or without wait.
func (s *sandbox) Stop(ctx context.Context, _ bool) error {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		select {
		case <-s.done:
			return s.stopErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.stopping = true
	close(s.stopCh)
	groups := make([]int, 0, len(s.groups))
	for g := range s.groups {
		groups = append(groups, g)
	}
	s.mu.Unlock()

	for _, g := range groups {
		killGroup(g)
	}
	waited := make(chan struct{})
	go func() {
		s.running.Wait()
		close(waited)
	}()
	select {
	case <-waited:
	case <-time.After(stopWait):
		s.log.Warn("execs did not return after their processes were killed")
	}
	killStragglers(s.dir, s.log)
	_ = s.root.Close()
	err := removeTree(s.dir)
	if err != nil {
		err = fmt.Errorf("remove the sandbox directory: %w", err)
	}
	s.mu.Lock()
	s.stopErr = err
	s.mu.Unlock()
	close(s.done)
	return err
}

// Done implements sandboxkit.Sandbox: a hostdir sandbox only ends by Stop.
func (s *sandbox) Done() <-chan struct{} { return s.done }

// LastActivity implements sandboxkit.Sandbox: hostdir relays no network
// traffic, so only operations count.
func (s *sandbox) LastActivity() time.Time { return time.Time{} }

// The filesystem operations are fsops on the sandbox's root.

func (s *sandbox) FsLs(ctx context.Context, req *contract.FsLsRequest) (*contract.FsLsResponse, error) {
	return s.tree.Ls(ctx, req)
}

func (s *sandbox) FsStat(ctx context.Context, req *contract.FsStatRequest) (*contract.FsEntry, error) {
	return s.tree.Stat(ctx, req)
}

func (s *sandbox) FsMkdir(ctx context.Context, req *contract.FsMkdirRequest) (*contract.FsMkdirResponse, error) {
	return s.tree.Mkdir(ctx, req)
}

func (s *sandbox) FsWrite(ctx context.Context, req *contract.FsWriteRequest, content io.Reader) (*contract.FsWriteResponse, error) {
	return s.tree.Write(ctx, req, content)
}

func (s *sandbox) FsRead(ctx context.Context, req *contract.FsReadRequest) (*contract.FsReadMeta, io.ReadCloser, error) {
	return s.tree.Read(ctx, req)
}

func (s *sandbox) FsRm(ctx context.Context, req *contract.FsRmRequest) (*contract.FsRmResponse, error) {
	return s.tree.Rm(ctx, req)
}

func (s *sandbox) FsChmod(ctx context.Context, req *contract.FsChmodRequest) (*contract.FsChmodResponse, error) {
	return s.tree.Chmod(ctx, req)
}

func (s *sandbox) FsMv(ctx context.Context, req *contract.FsMvRequest) (*contract.FsMvResponse, error) {
	return s.tree.Mv(ctx, req)
}

func (s *sandbox) FsGrep(ctx context.Context, req *contract.FsGrepRequest) (*contract.FsGrepResponse, error) {
	return s.tree.Grep(ctx, req)
}

func (s *sandbox) FsSed(ctx context.Context, req *contract.FsSedRequest) (*contract.FsSedResponse, error) {
	return s.tree.Sed(ctx, req)
}
