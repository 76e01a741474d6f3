// Package pubsubworker is the acceptance test of the registry's
// deprecated `pubsub` worker (workers/pubsub): a real `iii compose --up`
// with a managed engine, `compose::add worker=pubsub` from the default
// registry (registry/ beside iii: bin/registry under `make test`, which
// sets $III_BIN_DIR; otherwise the test builds iii and the worker and
// publishes it beside them), and a Node iii-sdk 0.22.1 worker that
// subscribes with `subscribe` triggers and publishes with `publish`.
package pubsubworker

import (
	"flag"
	"os"
	"testing"

	"github.com/iii-sandbox/iii/internal/testkit/composeproj"
	"github.com/iii-sandbox/iii/workers/pubsub"
)

// iii is the binary under test; registry/ beside it holds `pubsub`.
var iii string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(composeproj.Main(m, &iii, composeproj.Package{Name: "pubsub", Version: pubsub.Version,
		GoPackage: "github.com/iii-sandbox/iii/workers/pubsub/cmd/pubsub", DefaultConfig: pubsub.DefaultConfig}))
}
