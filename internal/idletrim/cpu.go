//go:build unix

package idletrim

import (
	"time"

	"golang.org/x/sys/unix"
)

// ProcessCPU is the CPU time, user and system, the process has used so
// far; zero when the system does not say.
func ProcessCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
