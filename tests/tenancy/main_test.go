package tenancy

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/iii-sandbox/iii/internal/testkit/bins"
)

// testBins builds iii and the sandbox-hostdir example adapter; the engine
// finds the adapter beside its own executable, as an installed one.
var testBins *bins.Set

func TestMain(m *testing.M) {
	set, err := bins.New("iii-tenancy-", map[string]string{
		"iii":             "github.com/iii-sandbox/iii/cmd/iii",
		"sandbox-hostdir": "github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir/cmd/sandbox-hostdir",
	})
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
