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
	"os"
	"testing"

	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
	"github.com/iii-sandbox/iii/workers/queue"
)

// iii is the binary under test; registry/ beside it holds `queue`.
var iii string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(composeproj.Main(m, &iii, composeproj.Package{Name: "queue", Version: queue.Version,
		GoPackage: "github.com/iii-sandbox/iii/workers/queue/cmd/queue", DefaultConfig: queue.DefaultConfig}))
}
