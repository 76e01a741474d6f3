package state

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

var errLocked = errors.New("locked")

type lockedError struct{ pid int }

func (e *lockedError) Error() string { return fmt.Sprintf("locked by pid %d", e.pid) }
func (e *lockedError) Is(target error) bool {
	return target == errLocked
}

// lockFile takes an exclusive advisory lock on path (flock: released by
// the kernel when the holder dies, so a crash never leaves a stale lock)
// and writes our pid into it for the messages of those who find it held.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			data, _ := io.ReadAll(io.LimitReader(f, 32))
			pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
			return nil, &lockedError{pid: pid}
		}
		return nil, err
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

func unlockFile(f *os.File) {
	_ = f.Truncate(0)
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	f.Close()
}
