package guest

import (
	"os"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain doubles as the entry point of helper processes: some tests run
// this binary again to act as another user or as a subreaper.
func TestMain(m *testing.M) {
	switch os.Getenv("GUEST_TEST_HELPER") {
	case "fsperm":
		fsPermHelper()
		os.Exit(0)
	case "reaper":
		reaperHelper()
		os.Exit(0)
	case "netns":
		netnsHelper()
		os.Exit(0)
	case "pgidsleep":
		// Leave the process group (but not the session), as a job-control
		// shell would do for a background job, and linger.
		_ = syscall.Setpgid(0, 0)
		time.Sleep(100 * time.Second)
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}
