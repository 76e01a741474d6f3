package proc

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// identify reads the start time the kernel keeps for pid (sysctl
// kern.proc.pid), which is what `ps -o lstart` prints.
func identify(pid int) (Identity, error) {
	kp, err := unix.SysctlKinfoProc("kern.proc.pid", pid)
	if err != nil {
		return Identity{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	if kp.Proc.P_pid != int32(pid) {
		return Identity{}, fmt.Errorf("pid %d: no such process", pid)
	}
	st := kp.Proc.P_starttime
	// SZOMB is 5 in <sys/proc.h>.
	return Identity{Birth: fmt.Sprintf("%d.%06d", st.Sec, st.Usec), Zombie: kp.Proc.P_stat == 5}, nil
}
