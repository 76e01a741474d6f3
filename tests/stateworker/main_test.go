// Package stateworker is the acceptance test of the registry's `state`
// worker (workers/state): a real `iii compose --up` with a managed engine
// installs the `state` package from the default registry (registry/ beside
// iii: bin/registry under `make test`, which sets $III_BIN_DIR; otherwise
// the test builds iii and the worker and publishes it beside them), and a
// Node iii-sdk worker writes state and sees its `state` trigger fire.
package stateworker

import (
	"flag"
	"os"
	"testing"

	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
	"github.com/iii-sandbox/iii/workers/state"
)

// iii is the binary under test; registry/ beside it holds `state`.
var iii string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(composeproj.Main(m, &iii, composeproj.Package{Name: "state", Version: state.Version,
		GoPackage: "github.com/iii-sandbox/iii/workers/state/cmd/state", DefaultConfig: state.DefaultConfig}))
}
