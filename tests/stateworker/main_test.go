// Package stateworker is the acceptance test of the registry's `state`
// worker (workers/state): a real `iii compose --up` with a managed engine
// installs the `state` package from the default registry (registry/ beside
// iii: bin/registry under `make test`, which sets $III_BIN_DIR; otherwise
// the test builds iii and the worker and publishes it beside them), and a
// Node iii-sdk worker writes state and sees its `state` trigger fire.
package stateworker

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/workers/state"
)

const envBinDir = "III_BIN_DIR"

// iii is the binary under test; registry/ beside it holds `state`.
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
		idx := filepath.Join(dir, "registry", "packages", "state", "index.json")
		if _, err := os.Stat(idx); err != nil {
			fmt.Fprintf(os.Stderr, "%s: the state package is not published (%v): run make build\n", envBinDir, err)
			return 1
		}
		return m.Run()
	}
	work, err := os.MkdirTemp("", "iii-state-accept-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(work)
	iii = filepath.Join(work, "iii")
	worker := filepath.Join(work, "state")
	for out, pkg := range map[string]string{iii: "github.com/iii-sandbox/iii/cmd/iii", worker: "github.com/iii-sandbox/iii/workers/state/cmd/state"} {
		if b, err := bins.GoBuild(out, pkg, nil); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", pkg, err, b)
			return 1
		}
	}
	if _, err := registry.Publish(filepath.Join(work, "registry"), registry.Publication{
		Name: "state", Version: state.Version, Kind: registry.KindBinary,
		Target:        registry.HostPlatform().Target(),
		Files:         []registry.PublishFile{{Path: worker}},
		DefaultConfig: []byte(state.DefaultConfig),
		Tags:          []string{registry.TagLatest},
	}); err != nil {
		fmt.Fprintln(os.Stderr, "publish state:", err)
		return 1
	}
	return m.Run()
}
