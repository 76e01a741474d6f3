package mine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit"
	"github.com/iii-sandbox/iii/plugins/sdk/sandboxkit/fsops"
)

// The directories every sandbox starts with, as sandbox paths.
const (
	homeDir = "/home"
	tmpDir  = "/tmp"
)

// errStopped ends an exec cut off by Stop. The kit sees that the sandbox
// was stopped while the exec ran and answers the caller with S004.
var errStopped = errors.New("the sandbox was stopped while the exec ran")

type sandbox struct {
	id   string
	dir  string   // the host directory that is the sandbox's "/"
	env  []string // the boot environment
	root *os.Root
	tree *fsops.Tree // the ten fs operations on root

	mu      sync.Mutex
	stopped bool
	groups  map[int]bool   // process groups of execs, killed by Stop
	running sync.WaitGroup // execs in flight
	stop    chan struct{}  // closed when Stop starts
	done    chan struct{}  // closed when the sandbox is gone
}

func newSandbox(spec sandboxkit.BootSpec, dir string) (*sandbox, error) {
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
		id: spec.ID, dir: dir, env: spec.Env, root: root,
		tree:   fsops.NewTree(root, homeDir),
		groups: map[int]bool{},
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}, nil
}

// hostPath is where the sandbox path p (absolute, clean) is on the host.
func (s *sandbox) hostPath(p string) string {
	return filepath.Join(s.dir, filepath.FromSlash(p))
}

// mapArg maps an absolute argument whose first component exists in the
// sandbox (/home, /tmp, or a directory made with fs::mkdir) to its host
// path, so `python3 /tmp/run.py` runs the file sandbox::run wrote. Every
// other argument is the host's: /bin/sh stays /bin/sh.
func (s *sandbox) mapArg(arg string) string {
	if !strings.HasPrefix(arg, "/") {
		return arg
	}
	clean := path.Clean(arg)
	first, _, _ := strings.Cut(clean[1:], "/")
	if first == "" {
		return arg
	}
	if _, err := s.root.Lstat(first); err != nil {
		return arg
	}
	return s.hostPath(clean)
}

// Exec runs one host process in the sandbox directory and waits for it.
func (s *sandbox) Exec(ctx context.Context, spec sandboxkit.ExecSpec) (sandboxkit.ExecResult, error) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return sandboxkit.ExecResult{}, errStopped
	}
	s.running.Add(1)
	s.mu.Unlock()
	defer s.running.Done()

	workdir := spec.Workdir
	if workdir == "" {
		workdir = homeDir
	}
	name, shown := s.tree.Resolve(workdir)
	if st, err := s.root.Stat(name); err != nil {
		return sandboxkit.ExecResult{}, fsops.Error(shown, err)
	} else if !st.IsDir() {
		return sandboxkit.ExecResult{}, contract.NewError(contract.S212, "workdir %s is not a directory", shown)
	}
	// The exec's environment: the sandbox's, the boot env, the exec's
	// own. For a name set twice, the last wins (os/exec keeps the last).
	env := append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + s.hostPath(homeDir),
		"TMPDIR=" + s.hostPath(tmpDir),
		"III_SANDBOX_ID=" + s.id,
	}, s.env...)
	env = append(env, spec.Env...)

	var stdout, stderr sandboxkit.OutputBuffer // 1 MiB each, then flags
	bin, err := lookPath(s.mapArg(spec.Argv[0]), lastPath(env))
	if err != nil {
		// A missing binary is a reply with exit code 127, not an error.
		fmt.Fprintf(&stderr, "%s: command not found\n", spec.Argv[0])
		return result(&stdout, &stderr, 127, false), nil
	}
	args := make([]string, 0, len(spec.Argv)-1)
	for _, a := range spec.Argv[1:] {
		args = append(args, s.mapArg(a))
	}
	cmd := exec.Command(bin, args...)
	cmd.Args[0] = spec.Argv[0]
	cmd.Dir = s.hostPath(shown)
	cmd.Env = env
	cmd.Stdin = bytes.NewReader(spec.Stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Its own process group, so a timeout or Stop kills everything it
	// started, background processes included.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Do not wait forever for output pipes a background process holds.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(&stderr, "%s: %v\n", spec.Argv[0], err)
		return result(&stdout, &stderr, 126, false), nil
	}
	pgid := cmd.Process.Pid
	s.mu.Lock()
	s.groups[pgid] = true
	s.mu.Unlock()
	defer s.forget(pgid)

	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	timer := time.NewTimer(spec.Timeout)
	defer timer.Stop()
	select {
	case err = <-waited:
	case <-timer.C:
		// The kit turns TimedOut into S200.
		kill(pgid)
		<-waited
		return result(&stdout, &stderr, -1, true), nil
	case <-s.stop:
		// Stop was called while this exec ran. Return an error (not a
		// reply): the caller gets S004, the sandbox is stopped.
		kill(pgid)
		<-waited
		return sandboxkit.ExecResult{}, errStopped
	case <-ctx.Done():
		kill(pgid)
		<-waited
		return sandboxkit.ExecResult{}, ctx.Err()
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) && !errors.Is(err, exec.ErrWaitDelay) {
		return sandboxkit.ExecResult{}, err
	}
	return result(&stdout, &stderr, cmd.ProcessState.ExitCode(), false), nil
}

// result is an ExecResult; code -1 (killed by a signal) is no exit code.
func result(stdout, stderr *sandboxkit.OutputBuffer, code int, timedOut bool) sandboxkit.ExecResult {
	r := sandboxkit.ExecResult{
		Stdout: stdout.Bytes(), StdoutTruncated: stdout.Truncated(),
		Stderr: stderr.Bytes(), StderrTruncated: stderr.Truncated(),
		TimedOut: timedOut,
	}
	if code >= 0 {
		r.ExitCode = &code
	}
	return r
}

// forget drops an exec's process group once nothing is left in it; a
// group with background processes stays for Stop to kill.
func (s *sandbox) forget(pgid int) {
	if errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) {
		s.mu.Lock()
		delete(s.groups, pgid)
		s.mu.Unlock()
	}
}

func kill(pgid int) { _ = syscall.Kill(-pgid, syscall.SIGKILL) }

// Stop is called exactly once. It kills every process group the sandbox
// started, which makes running execs return errStopped, waits for them,
// and deletes the directory. It is complete when it returns, so wait
// changes nothing here.
func (s *sandbox) Stop(_ context.Context, _ bool) error {
	s.mu.Lock()
	s.stopped = true
	close(s.stop)
	for pgid := range s.groups {
		kill(pgid)
	}
	s.mu.Unlock()
	s.running.Wait()
	_ = s.root.Close()
	err := removeAll(s.dir)
	close(s.done)
	return err
}

// Done is closed once the sandbox is gone. Host directories do not die
// on their own, so only Stop closes it.
func (s *sandbox) Done() <-chan struct{} { return s.done }

// LastActivity is for activity the kit cannot see, such as relayed
// network traffic; this adapter relays none.
func (s *sandbox) LastActivity() time.Time { return time.Time{} }

// lookPath finds program as a shell would on pathList: a name with a
// slash as it is, otherwise the first executable file of that name in an
// absolute PATH directory.
func lookPath(program, pathList string) (string, error) {
	if strings.Contains(program, "/") {
		_, err := os.Stat(program)
		return program, err
	}
	for _, d := range filepath.SplitList(pathList) {
		p := filepath.Join(d, program)
		if st, err := os.Stat(p); err == nil && filepath.IsAbs(d) && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fs.ErrNotExist
}

// lastPath is the value of the last PATH entry of env.
func lastPath(env []string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], "PATH="); ok {
			return v
		}
	}
	return ""
}

// removeAll deletes dir, first making its directories writable again: a
// sandbox may have chmod'ed its own files to 0.
func removeAll(dir string) error {
	if os.RemoveAll(dir) == nil {
		return nil
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}
