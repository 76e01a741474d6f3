// Package exampleproject keeps docs/standard-workers.md's complete project
// runnable: it writes the page's files, runs `iii compose --up` as the
// page does, with the four standard workers from the default registry
// (registry/ beside iii: bin/registry under `make test`, which sets
// $III_BIN_DIR; otherwise the test builds iii and the workers and
// publishes them beside it) and the page's Node worker on the pinned
// iii-sdk 0.22.1, and checks what the page says the curl commands show.
package exampleproject

import (
	"flag"
	"os"
	"testing"

	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
	"github.com/iii-sandbox/iii/workers/cron"
	httpw "github.com/iii-sandbox/iii/workers/http"
	"github.com/iii-sandbox/iii/workers/queue"
	"github.com/iii-sandbox/iii/workers/state"
)

// iii is the binary under test; registry/ beside it holds the workers.
var iii string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(composeproj.Main(m, &iii,
		composeproj.Package{Name: "state", Version: state.Version, GoPackage: "github.com/iii-sandbox/iii/workers/state/cmd/state", DefaultConfig: state.DefaultConfig},
		composeproj.Package{Name: "queue", Version: queue.Version, GoPackage: "github.com/iii-sandbox/iii/workers/queue/cmd/queue", DefaultConfig: queue.DefaultConfig},
		composeproj.Package{Name: "cron", Version: cron.Version, GoPackage: "github.com/iii-sandbox/iii/workers/cron/cmd/cron", DefaultConfig: cron.DefaultConfig},
		composeproj.Package{Name: "http", Version: httpw.Version, GoPackage: "github.com/iii-sandbox/iii/workers/http/cmd/http", DefaultConfig: httpw.DefaultConfig}))
}
