package hostdir

import (
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"
)

// killStragglers kills processes whose working directory is inside dir:
// those an exec started in a new session or process group, which killing
// the exec's own group does not reach. Best effort: processes of other
// users cannot be inspected.
func killStragglers(dir string, log hclog.Logger) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	self := os.Getpid()
	prefix := strings.TrimSuffix(dir, "/") + "/"
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd")
		if err != nil {
			continue
		}
		if cwd == dir || strings.HasPrefix(cwd, prefix) {
			if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
				log.Debug("killed a process left running in the sandbox", "pid", pid)
			}
		}
	}
}
