package guest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ClocksourceDir is where the kernel lists its clocksources and takes a
// choice.
const ClocksourceDir = "/sys/devices/system/clocksource/clocksource0"

// PreferTSC asks the kernel for the TSC as its clock when it is running on
// jiffies, and reports whether it asked. Under QEMU TCG the guest kernel
// (Debian's cloud kernel) registers its TSC clocksource only after its
// final calibration, a while after the agent starts, and then does not
// switch to it on its own: it stays on refined-jiffies, a clock that
// advances in whole 4 ms ticks as tick interrupts arrive, so every
// duration the agent measures (an exec's) comes in 4 ms steps. The kernel keeps a name
// written here and switches when a clocksource of that name registers, so
// asking this early is enough. Under TCG the TSC counts the VM's running
// time in host cycles (QEMU stops it with the VM). A kernel on anything
// but jiffies (kvm-clock, the TSC itself) has a real clock and is left
// alone.
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
	if err := os.WriteFile(filepath.Join(dir, "current_clocksource"), []byte("tsc"), 0); err != nil {
		return false, fmt.Errorf("ask for the tsc clocksource: %w", err)
	}
	return true, nil
}
