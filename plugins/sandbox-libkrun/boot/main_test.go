package boot

import (
	"testing"

	"go.uber.org/goleak"
)

// The warm pool and the template store start goroutines.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
