package pluginhost

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// testBinDir holds the adapter binaries the tests build: any process whose
// command line names it is an adapter these tests started. It is made
// once, before any test runs.
var testBinDir string

// built records the adapter binaries built so far (TestMain builds them
// all, except when fuzzing).
var built struct {
	sync.Mutex
	paths map[string]string
}

// adapterPackages are the adapters tests run, by name.
func adapterPackages() map[string]string {
	return map[string]string{
		"sandbox-hostdir":   "github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir/cmd/sandbox-hostdir",
		"sandbox-althost":   "./testdata/althost",
		"sandbox-major2":    "./testdata/major2",
		"sandbox-infomajor": "./testdata/infomajor",
		// The shipped VM adapter, for its worker::* functions; the tests
		// here boot no VM with it.
		"sandbox-libkrun": "github.com/iii-sandbox/iii/plugins/sandbox-libkrun/cmd/sandbox-libkrun",
	}
}

// testBin returns the path of the adapter binary name, building it if
// TestMain did not.
func testBin(t testing.TB, name string) string {
	t.Helper()
	if err := buildAdapter(name); err != nil {
		t.Fatal(err)
	}
	built.Lock()
	defer built.Unlock()
	return built.paths[name]
}

// buildAdapter builds the adapter name into testBinDir once.
func buildAdapter(name string) error {
	built.Lock()
	defer built.Unlock()
	if _, ok := built.paths[name]; ok {
		return nil
	}
	pkg, ok := adapterPackages()[name]
	if !ok {
		return fmt.Errorf("no test adapter %q", name)
	}
	out := filepath.Join(testBinDir, name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %v\n%s", pkg, err, b)
	}
	if built.paths == nil {
		built.paths = map[string]string{}
	}
	built.paths[name] = out
	return nil
}

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "pluginhost-bins-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	testBinDir = dir
	// Build every adapter up front, into the temp dir, so test failures
	// never hide a build failure; fuzzing (and its workers) builds none.
	flag.Parse()
	if f := flag.Lookup("test.fuzz"); f == nil || f.Value.String() == "" {
		if f := flag.Lookup("test.fuzzworker"); f == nil || f.Value.String() != "true" {
			for name := range adapterPackages() {
				if err := buildAdapter(name); err != nil {
					fmt.Fprintln(os.Stderr, err)
					return 1
				}
			}
		}
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	if code == 0 {
		if pids := adapterProcesses(dir); len(pids) > 0 {
			fmt.Fprintf(os.Stderr, "adapter processes outlived the tests: %v\n", pids)
			code = 1
		}
	}
	return code
}
