//go:build !unix

package idletrim

import "time"

// ProcessCPU is zero where the system does not say: with no work seen,
// nothing is ever trimmed.
func ProcessCPU() time.Duration { return 0 }
