package procstats

import (
	"bytes"
	"os"
	"strconv"
)

// readOS reads /proc/self: the fd directory's entries and VmRSS.
func readOS(s *Stats) {
	if n, err := countFDs("/proc/self/fd"); err == nil {
		s.OpenFDs = n
	}
	if data, err := os.ReadFile("/proc/self/status"); err == nil {
		if rss, ok := parseVmRSS(data); ok {
			s.RSSBytes = rss
		}
	}
}

// countFDs counts the entries of dir, a /proc/<pid>/fd directory, less the
// descriptor this read itself holds open on it.
func countFDs(dir string) (int, error) {
	f, err := os.Open(dir)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return 0, err
	}
	n := len(names)
	if n > 0 {
		n-- // the descriptor of f
	}
	return n, nil
}

// parseVmRSS finds "VmRSS:  <n> kB" in the text of /proc/<pid>/status and
// returns it in bytes.
func parseVmRSS(status []byte) (int64, bool) { return parseKB(status, "VmRSS:") }

// MemAvailable is the host's available memory (/proc/meminfo's
// MemAvailable) in bytes: what a sandbox host reports as room for more VMs.
func MemAvailable() (int64, bool) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	return parseKB(data, "MemAvailable:")
}

// parseKB finds "<key>  <n> kB" in a /proc text and returns it in bytes.
func parseKB(text []byte, key string) (int64, bool) {
	for line := range bytes.Lines(text) {
		rest, ok := bytes.CutPrefix(line, []byte(key))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, false
		}
		kb, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil || kb < 0 {
			return 0, false
		}
		return kb << 10, true
	}
	return 0, false
}
