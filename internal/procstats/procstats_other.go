//go:build !linux

package procstats

import (
	"os"
	"runtime/metrics"
)

// readOS, without /proc: the descriptors from /dev/fd where the system
// has it (macOS, the BSDs), and, for resident memory, what the Go runtime
// holds from the system less what it has released (an estimate: it leaves
// out memory outside the Go heap, such as cgo's).
func readOS(s *Stats) {
	if names, err := readDirNames("/dev/fd"); err == nil && len(names) > 0 {
		s.OpenFDs = len(names) - 1 // the descriptor of the read itself
	}
	samples := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(samples)
	if samples[0].Value.Kind() == metrics.KindUint64 && samples[1].Value.Kind() == metrics.KindUint64 {
		s.RSSBytes = int64(samples[0].Value.Uint64() - samples[1].Value.Uint64())
	}
}

func readDirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// MemAvailable is unknown without /proc.
func MemAvailable() (int64, bool) { return 0, false }
