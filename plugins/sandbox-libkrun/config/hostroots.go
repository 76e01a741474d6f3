package config

import (
	"encoding/json"
	"path/filepath"
	"strings"
)

// Worker-VM configuration defaults and bounds.
const (
	// DefaultWorkerDiskMB sizes a worker's persistent disk: a sparse file,
	// so it costs only what the worker writes.
	DefaultWorkerDiskMB = 8192
	minWorkerDiskMB     = 256
	maxWorkerDiskMB     = 1 << 20
	// Worker VMs run language runtimes and their dependency installs;
	// they get more room than a sandbox's defaults unless the request
	// says otherwise.
	DefaultWorkerCPUs     = 1
	DefaultWorkerMemoryMB = 1024
)

// parseHostRoots reads host_roots: a list of absolute directories ("~/"
// is the home directory). Compose sets it to the compose file's directory,
// its package cache and each declared path:// VM worker's directory.
func parseHostRoots(key string, v json.RawMessage, home string) ([]string, error) {
	if len(v) == 0 || v[0] != '[' {
		return nil, Err(key, "must be a list of absolute directories, got %s", kind(v))
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(v, &raw); err != nil {
		return nil, Err(key, "must be a list of absolute directories: %v", err)
	}
	out := make([]string, 0, len(raw))
	for i, r := range raw {
		s, err := parseString(key, r)
		if err != nil {
			return nil, Err(key, "item %d must be a string, got %s", i, kind(r))
		}
		if s == "" || strings.ContainsAny(s, "\x00\n") {
			return nil, Err(key, "item %d is empty or holds a NUL or newline", i)
		}
		if rest, ok := strings.CutPrefix(s, "~/"); ok {
			if home == "" {
				return nil, Err(key, "item %d %q starts with ~/ but there is no home directory", i, s)
			}
			s = filepath.Join(home, rest)
		}
		if !filepath.IsAbs(s) {
			return nil, Err(key, "item %d %q is not an absolute path", i, truncate(s, 80))
		}
		out = append(out, filepath.Clean(s))
	}
	return out, nil
}
