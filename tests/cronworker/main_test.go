// Package cronworker is the acceptance test of the registry's `cron`
// worker (workers/cron): a real `iii compose --up` with a managed engine
// installs the `cron` package from the default registry (registry/ beside
// iii: bin/registry under `make test`, which sets $III_BIN_DIR; otherwise
// the test builds iii and the worker and publishes it beside them), runs
// two cron workers from it, and a Node iii-sdk 0.22.1 worker schedules
// functions with `cron` triggers and counts their fires.
package cronworker

import (
	"flag"
	"os"
	"testing"

	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
	"github.com/iii-sandbox/iii/workers/cron"
)

// iii is the binary under test; registry/ beside it holds `cron`.
var iii string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(composeproj.Main(m, &iii, composeproj.Package{Name: "cron", Version: cron.Version,
		GoPackage: "github.com/iii-sandbox/iii/workers/cron/cmd/cron", DefaultConfig: cron.DefaultConfig}))
}
