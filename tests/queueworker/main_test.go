// Package queueworker is the acceptance test of the registry's `queue`
// worker (workers/queue): a real `iii compose --up` with a managed engine
// installs the `queue` package from the default registry (registry/
// beside iii: bin/registry under `make test`, which sets $III_BIN_DIR;
// otherwise the test builds iii and the worker and publishes it beside
// them), and a Node iii-sdk 0.22.1 worker subscribes, publishes and
// enqueues through it.
package queueworker

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
	"github.com/iii-sandbox/iii/workers/queue"
)

const envBinDir = "III_BIN_DIR"

// iii is the binary under test; registry/ beside it holds `queue`.
var iii string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if testing.Short() || bins.Fuzzing() {
		return m.Run()
	}
	if dir := os.Getenv(envBinDir); dir != "" {
		iii = filepath.Join(dir, "iii")
		idx := filepath.Join(dir, "registry", "packages", "queue", "index.json")
		if _, err := os.Stat(idx); err != nil {
			fmt.Fprintf(os.Stderr, "%s: the queue package is not published (%v): run make build\n", envBinDir, err)
			return 1
		}
		return m.Run()
	}
	work, err := os.MkdirTemp("", "iii-queue-accept-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(work)
	iii, err = composeproj.BuildRegistry(work, composeproj.Package{Name: "queue", Version: queue.Version,
		GoPackage: "github.com/iii-sandbox/iii/workers/queue/cmd/queue", DefaultConfig: queue.DefaultConfig})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}
