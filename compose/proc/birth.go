package proc

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"syscall"
)

// ErrUnverifiable means the birth identity of a live process cannot be read
// on this system, so a recorded pid cannot be proven to be the same process.
var ErrUnverifiable = errors.New("process birth identity cannot be read")

// Identity is what /proc/<pid>/stat (or the platform equivalent) says about
// a process.
type Identity struct {
	// Birth is the process start time in the platform's own units (clock
	// ticks since boot on Linux, seconds.microseconds on macOS). Two
	// processes with the same pid and the same Birth are the same process.
	Birth string
	// Zombie is true for a process that exited and was not reaped yet.
	Zombie bool
}

// parseStat reads the state (field 3) and the start time (field 22) of a
// Linux /proc/<pid>/stat line. The command name (field 2) is in parentheses
// and may itself hold spaces and parentheses, so fields are counted from
// the last ')'.
func parseStat(data []byte) (Identity, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return Identity{}, fmt.Errorf("stat: no command name")
	}
	fields := bytes.Fields(data[end+1:])
	// fields[0] is field 3 (state); field 22 is fields[19].
	if len(fields) < 20 {
		return Identity{}, fmt.Errorf("stat: %d fields after the command name, want at least 20", len(fields))
	}
	start := fields[19]
	if _, err := strconv.ParseUint(string(start), 10, 64); err != nil {
		return Identity{}, fmt.Errorf("stat: start time %q is not a number", start)
	}
	return Identity{Birth: string(start), Zombie: len(fields[0]) == 1 && (fields[0][0] == 'Z' || fields[0][0] == 'X')}, nil
}

// Alive reports whether pid names a live process (a zombie is not alive).
// A process we may not signal (EPERM) is alive.
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	if err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	id, ierr := identify(pid)
	if ierr == nil && id.Zombie {
		return false
	}
	return true
}

// Birth returns the birth identity of a live pid. ErrUnverifiable means the
// platform gives no way to read it; any other error means the process is
// gone.
func Birth(pid int) (string, error) {
	if pid <= 0 {
		return "", fmt.Errorf("pid %d: no such process", pid)
	}
	id, err := identify(pid)
	if err != nil {
		return "", err
	}
	if id.Zombie {
		return "", fmt.Errorf("pid %d has exited", pid)
	}
	return id.Birth, nil
}

// Match says what a recorded (pid, birth) pair is now.
type Match int

const (
	// Gone: no live process has that pid, or a different process reuses it.
	Gone Match = iota
	// Same: the pid is alive and its birth identity matches the record.
	Same
	// Unverifiable: the pid is alive but its identity cannot be checked
	// (no birth in the record, or the platform cannot read it).
	Unverifiable
)

func (m Match) String() string {
	switch m {
	case Same:
		return "same"
	case Unverifiable:
		return "unverifiable"
	default:
		return "gone"
	}
}

// Check compares a recorded pid and birth with the live system.
func Check(pid int, birth string) Match {
	if !Alive(pid) {
		return Gone
	}
	live, err := Birth(pid)
	switch {
	case errors.Is(err, ErrUnverifiable):
		return Unverifiable
	case err != nil:
		return Gone
	case birth == "":
		return Unverifiable
	case live == birth:
		return Same
	default:
		return Gone
	}
}
