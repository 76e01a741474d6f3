package selfupdate

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind (HTTP clients,
// servers, the `--version` runs).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
