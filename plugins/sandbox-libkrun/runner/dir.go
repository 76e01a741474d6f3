package runner

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// File names in a VM's state directory (besides backend.SocketName and the
// back end's logs).
const (
	LockName      = "lock"
	ConfigName    = "runner.json"
	RunnerPIDName = "runner.pid"
	VMPIDName     = "vm.pid"
	LogName       = "runner.log"
	// AdoptSocketName is the unix socket (0600) a runner serves from its
	// start when it may be adopted (Config.AdoptGraceMS > 0).
	AdoptSocketName = "runner.sock"
	// AdoptKeyName holds the runner's adoption key: 32 random bytes
	// (0600) Spawn writes before the runner starts. Whoever can read it
	// may take the runner over (Adopt); the key never crosses the socket.
	AdoptKeyName = "adopt.key"
)

// dirNameRE is what the adapter names state directories: sandbox ids
// (UUIDs) and accelerator-probe directories. Nothing else under state_dir is
// ever touched by the clean-up, so a mistyped state_dir cannot cost anyone
// their files.
var dirNameRE = regexp.MustCompile(`^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|probe-[0-9a-z]{1,16})$`)

// ValidDirName reports whether name is a state directory name the adapter
// makes.
func ValidDirName(name string) bool { return dirNameRE.MatchString(name) }

// Dir is one VM's state directory, locked by this process for as long as
// it is open.
type Dir struct {
	Path string
	lock *os.File
}

// CreateDir makes <stateDir>/<name> (0700) and takes its lock before
// anything else goes in, so no other adapter's clean-up mistakes it for a
// leftover. The directory must not exist yet.
func CreateDir(stateDir, name string) (*Dir, error) {
	if !ValidDirName(name) {
		return nil, fmt.Errorf("state directory name %q is not a sandbox id", name)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create state_dir %s: %w", stateDir, err)
	}
	p := filepath.Join(stateDir, name)
	if err := os.Mkdir(p, 0o700); err != nil {
		return nil, fmt.Errorf("create VM state directory: %w", err)
	}
	lock, err := lockFile(filepath.Join(p, LockName), false)
	if err != nil {
		_ = os.RemoveAll(p)
		return nil, err
	}
	return &Dir{Path: p, lock: lock}, nil
}

// OpenDir try-locks the existing state directory <stateDir>/<name> for
// this process, so that a new adapter can adopt the VM a dead one left
// running in it (Adopt). A lock another live process holds is ErrLocked.
// The directory must have its lock file: one without it is still being
// created by CreateDir (which takes the lock right after mkdir, blocking),
// and taking it would stall that adapter.
func OpenDir(stateDir, name string) (*Dir, error) {
	if !ValidDirName(name) {
		return nil, fmt.Errorf("state directory name %q is not a sandbox id", name)
	}
	p := filepath.Join(stateDir, name)
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, fmt.Errorf("open VM state directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", p)
	}
	lockPath := filepath.Join(p, LockName)
	lock, err := openLock(lockPath, 0, true)
	if err != nil {
		return nil, err
	}
	// A clean-up that held the lock may have removed the directory
	// between our open and our flock: then the lock we hold is of an
	// unlinked file, and the directory is no one's to open.
	if !sameFile(lock, lockPath) {
		_ = lock.Close()
		return nil, fmt.Errorf("open VM state directory %s: %w", p, fs.ErrNotExist)
	}
	return &Dir{Path: p, lock: lock}, nil
}

// sameFile reports whether the open file f is still the file at path.
func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Lstat(path)
	return err == nil && os.SameFile(a, b)
}

// lockFile opens (creating) and flocks path. With try, a lock someone else
// holds is ErrLocked instead of a wait.
func lockFile(path string, try bool) (*os.File, error) {
	return openLock(path, os.O_CREATE, try)
}

// openLock is lockFile with the open flags to add (os.O_CREATE or none).
func openLock(path string, flags int, try bool) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|flags|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	how := unix.LOCK_EX
	if try {
		how |= unix.LOCK_NB
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// ErrLocked: another live process (an adapter) holds the directory's lock.
var ErrLocked = errors.New("locked by a live adapter")

// File returns the path of a file in the directory.
func (d *Dir) File(name string) string { return filepath.Join(d.Path, name) }

// Remove deletes the directory and then drops its lock. Deleting first
// means no other process ever sees an unlocked directory of ours.
func (d *Dir) Remove() error {
	err := os.RemoveAll(d.Path)
	if d.lock != nil {
		_ = d.lock.Close()
		d.lock = nil
	}
	if err != nil {
		return fmt.Errorf("remove VM state directory: %w", err)
	}
	return nil
}

// WritePID records pid in path, atomically (readers never see half a
// number).
func WritePID(path string, pid int) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ReadPID reads a pid file written by WritePID.
func ReadPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return ParsePID(b)
}

// ParsePID parses the content of a pid file: decimal digits and an optional
// newline, a positive number that fits a pid.
func ParsePID(b []byte) (int, error) {
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" || len(s) > 10 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("pid file holds %q, not a pid", truncate(s, 20))
	}
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n <= 1 {
		return 0, fmt.Errorf("pid file holds %q, not a pid", s)
	}
	return int(n), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
