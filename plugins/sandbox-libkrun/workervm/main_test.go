package workervm

import (
	"testing"

	"go.uber.org/goleak"
)

// Worker VMs run and stop on goroutines of their own.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
