package runner

import (
	"bytes"
	"encoding/binary"
)

// ParseProcArgs2 decodes macOS's kern.procargs2 sysctl: a native-endian
// int32 argc, the executable path, NUL padding, then argc NUL-terminated
// arguments (the environment follows and is ignored). It returns nil for
// anything malformed: a process whose arguments cannot be read is never
// taken for one of ours.
func ParseProcArgs2(b []byte) []string {
	if len(b) < 4 {
		return nil
	}
	argc := int(int32(binary.LittleEndian.Uint32(b)))
	if argc <= 0 || argc > 1<<16 {
		return nil
	}
	rest := b[4:]
	// The executable path, then its padding.
	i := bytes.IndexByte(rest, 0)
	if i < 0 {
		return nil
	}
	rest = rest[i:]
	for len(rest) > 0 && rest[0] == 0 {
		rest = rest[1:]
	}
	out := make([]string, 0, min(argc, 64))
	for range argc {
		j := bytes.IndexByte(rest, 0)
		if j < 0 {
			return nil
		}
		out = append(out, string(rest[:j]))
		rest = rest[j+1:]
	}
	return out
}

// ParseCmdline splits /proc/<pid>/cmdline: NUL-terminated arguments.
func ParseCmdline(b []byte) []string {
	b = bytes.TrimSuffix(b, []byte{0})
	if len(b) == 0 {
		return nil
	}
	parts := bytes.Split(b, []byte{0})
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = string(p)
	}
	return out
}
