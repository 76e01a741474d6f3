package pluginhost

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/procscan"
)

// testBins holds the adapter binaries the tests run: any process whose
// command line names its directory is an adapter these tests started. It
// is set by TestMain, before any test runs.
var testBins *bins.Set

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

// adapterProcesses lists the live adapter processes these tests started.
func adapterProcesses() []int { return procscan.Naming(testBins.Dir() + "/") }

func TestMain(m *testing.M) {
	set, err := bins.New("pluginhost-bins-", adapterPackages())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testBins = set
	os.Exit(set.Main(m, noGoroutineLeft, noAdapterLeft))
}

func noGoroutineLeft() error {
	if err := goleak.Find(); err != nil {
		return fmt.Errorf("goleak: %w", err)
	}
	return nil
}

func noAdapterLeft() error {
	if pids := adapterProcesses(); len(pids) > 0 {
		return fmt.Errorf("adapter processes outlived the tests: %v", pids)
	}
	return nil
}
