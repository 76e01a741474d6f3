package proc

import (
	"fmt"
	"os"
	"strconv"
)

func identify(pid int) (Identity, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Identity{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return parseStat(data)
}
