package daemon

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/iii-sandbox/iii/compose/proc"
)

// TestMain lets the test binary be the reaper the daemon starts
// (`<exe> __compose-reaper`), and checks no goroutine outlives the tests.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == proc.ReaperCommand {
		os.Exit(proc.ReaperMain(os.Stdin, os.Stdout, os.Stderr, os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == goWorkerCommand {
		os.Exit(goWorker())
	}
	code := m.Run()
	if adapterBins.dir != "" {
		_ = os.RemoveAll(adapterBins.dir)
	}
	removeFixtures()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
