// Package bins builds the repository's binaries that tests run as real
// subprocesses (adapters, the iii CLI, the guest agent): each once per test
// binary, into one directory, so every process a test starts from there
// can be found afterwards by that directory's name (see procscan).
package bins

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

// Set is a directory of binaries built from named Go packages.
type Set struct {
	dir  string
	pkgs map[string]string

	mu    sync.Mutex
	built map[string]string
}

// New makes a temporary directory (named with prefix) for the binaries of
// pkgs: name → Go package path (an import path, or one relative to the
// test's directory). Close removes it.
func New(prefix string, pkgs map[string]string) (*Set, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	return &Set{dir: dir, pkgs: pkgs, built: map[string]string{}}, nil
}

// Dir is the directory the binaries are built into.
func (s *Set) Dir() string { return s.dir }

// Close removes the directory and the binaries in it.
func (s *Set) Close() error { return os.RemoveAll(s.dir) }

// Build builds the binary name unless it is built already, and returns its
// path.
func (s *Set) Build(name string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.built[name]; ok {
		return p, nil
	}
	pkg, ok := s.pkgs[name]
	if !ok {
		return "", fmt.Errorf("no test binary %q", name)
	}
	out := filepath.Join(s.dir, name)
	if b, err := GoBuild(out, pkg, nil); err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", pkg, err, b)
	}
	s.built[name] = out
	return out, nil
}

// BuildAll builds every binary of the set (in name order, so a failure is
// the same one each run). TestMain calls it so that a build failure is
// reported as one, not as failing tests.
func (s *Set) BuildAll() error {
	names := make([]string, 0, len(s.pkgs))
	for name := range s.pkgs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if _, err := s.Build(name); err != nil {
			return err
		}
	}
	return nil
}

// Path returns the path of the binary name, building it if it is not yet;
// a build failure fails the test.
func (s *Set) Path(t testing.TB, name string) string {
	t.Helper()
	p, err := s.Build(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Main is the body of a TestMain whose tests run the set's binaries: it
// builds them all first (none when fuzzing), runs the tests, then, while
// all is well, each check (goroutines leaked, processes left behind),
// printing the first check's error. It removes the set and returns the
// exit code.
func (s *Set) Main(m *testing.M, checks ...func() error) int {
	defer s.Close()
	flag.Parse()
	if !Fuzzing() {
		if err := s.BuildAll(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	code := m.Run()
	for _, check := range checks {
		if code != 0 {
			break
		}
		if err := check(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	return code
}

// Fuzzing reports whether this test binary runs a fuzz target (-test.fuzz)
// or is one of its workers: those need no binaries, and building them in
// every worker would only slow fuzzing down. Call it after flag.Parse.
func Fuzzing() bool {
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		return true
	}
	f := flag.Lookup("test.fuzzworker")
	return f != nil && f.Value.String() == "true"
}

// GoBuild runs `go build [flags] -o out pkg` in the current directory with
// env added to the environment, and returns the command's output (the
// compiler's messages when it fails).
func GoBuild(out, pkg string, env []string, flags ...string) ([]byte, error) {
	args := append([]string{"build"}, flags...)
	cmd := exec.Command("go", append(args, "-o", out, pkg)...)
	cmd.Env = append(os.Environ(), env...)
	return cmd.CombinedOutput()
}

// RepoRoot returns the directory at or above dir that holds go.mod.
func RepoRoot(dir string) (string, error) {
	root := dir
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			return root, nil
		}
		parent := filepath.Dir(root)
		if parent == root {
			return "", fmt.Errorf("repository root (go.mod) not found above %s", dir)
		}
		root = parent
	}
}
