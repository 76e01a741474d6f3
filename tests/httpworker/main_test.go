// Package httpworker is the acceptance test of the registry's `http`
// worker (workers/http): a real `iii compose --up` with a managed engine
// installs the `http` package from the default registry (registry/ beside
// iii: bin/registry under `make test`, which sets $III_BIN_DIR; otherwise
// the test builds iii and the worker and publishes it beside them), a
// Node iii-sdk 0.22.1 worker registers routes with `http` triggers, and a
// real HTTP client calls them on loopback.
package httpworker

import (
	"flag"
	"os"
	"testing"

	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
	httpw "github.com/iii-sandbox/iii/workers/http"
)

// iii is the binary under test; registry/ beside it holds `http`.
var iii string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(composeproj.Main(m, &iii, composeproj.Package{Name: "http", Version: httpw.Version,
		GoPackage: "github.com/iii-sandbox/iii/workers/http/cmd/http", DefaultConfig: httpw.DefaultConfig}))
}
