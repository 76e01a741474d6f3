package guest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ClocksourceDir is where the kernel lists its clocksources and takes a
// choice.
const ClocksourceDir = "/sys/devices/system/clocksource/clocksource0"

// PreferTSC moves the kernel's clock from jiffies to the TSC when the
// kernel fell back to jiffies and offers the TSC, and reports whether it
// did. Under QEMU TCG the guest kernel (Debian's cloud kernel) boots onto
// refined-jiffies with the TSC listed as available: a clock that advances
// in 4 ms steps and leaves the kernel without high-resolution timers, so
// every sleep shorter than a tick lasts a tick. The Go runtime's own short
// waits (sysmon taking a P back from a blocking read) then cost whole
// ticks, and the agent's measurements (an exec's duration) come in 4 ms
// steps. Under TCG the TSC counts the VM's running time in host cycles
// (QEMU stops it with the VM), so it is the better clock there. A kernel that chose anything but jiffies (kvm-clock, the TSC) has
// a real clock and is left alone.
func PreferTSC(dir string) (bool, error) {
	cur, err := os.ReadFile(filepath.Join(dir, "current_clocksource"))
	if err != nil {
		return false, fmt.Errorf("read the clocksource: %w", err)
	}
	switch strings.TrimSpace(string(cur)) {
	case "jiffies", "refined-jiffies":
	default:
		return false, nil
	}
	avail, err := os.ReadFile(filepath.Join(dir, "available_clocksource"))
	if err != nil {
		return false, fmt.Errorf("read the available clocksources: %w", err)
	}
	if !slices.Contains(strings.Fields(string(avail)), "tsc") {
		return false, nil
	}
	if err := os.WriteFile(filepath.Join(dir, "current_clocksource"), []byte("tsc"), 0); err != nil {
		return false, fmt.Errorf("switch the clocksource to tsc: %w", err)
	}
	return true, nil
}
