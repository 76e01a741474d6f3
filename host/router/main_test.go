package router

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/procscan"
)

// testBins holds the adapter binaries the tests run: a process whose
// command line names its directory is an adapter these tests started. It
// is set by TestMain, before any test runs.
var testBins *bins.Set

// adapterPackages are the adapters tests run, by name.
func adapterPackages() map[string]string {
	return map[string]string{
		"sandbox-hostdir": "github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir/cmd/sandbox-hostdir",
		"sandbox-althost": "../pluginhost/testdata/althost",
	}
}

// adapterProcesses lists the live adapter processes these tests started.
func adapterProcesses() []int { return procscan.Naming(testBins.Dir() + "/") }

func TestMain(m *testing.M) {
	set, err := bins.New("router-bins-", adapterPackages())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testBins = set
	os.Exit(set.Main(m, func() error {
		if err := goleak.Find(); err != nil {
			return fmt.Errorf("goleak: %w", err)
		}
		return nil
	}))
}
