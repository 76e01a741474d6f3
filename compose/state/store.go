package state

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/proc"
)

// Store is an open state directory. Opening it takes the project lock:
// while a Store is open, no other Compose can load the same project in the
// same namespace.
type Store struct {
	dir         string
	composePath string
	ns          string

	mu   sync.Mutex
	lock *os.File
	// runsMu serialises the read-modify-write of vm-workers.json, credsMu
	// that of worker-credentials.json.
	runsMu  sync.Mutex
	credsMu sync.Mutex
}

// Open creates (owner-only) and locks the state directory dir of the
// project whose canonical compose file is composePath. A state.json left
// by another compose file in the same directory is refused.
func Open(dir, composePath, ns string) (*Store, error) {
	for _, d := range []string{dir, filepath.Join(dir, ConfigDir), filepath.Join(dir, LogsDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, compose.New(compose.CodeStateDirUnavailable, fmt.Sprintf("cannot create the state directory %s: %v", d, err))
		}
	}
	s := &Store{dir: dir, composePath: composePath, ns: ns}
	f, err := lockFile(filepath.Join(dir, projectLockFile))
	if err != nil {
		if errors.Is(err, errLocked) {
			return nil, compose.New(compose.CodeStateDirUnavailable, fmt.Sprintf(
				"project %s in namespace %q is already run by another Compose (%s holds %s); stop it first, or use another namespace",
				composePath, ns, holder(f, err), filepath.Join(dir, projectLockFile)))
		}
		return nil, compose.New(compose.CodeStateDirUnavailable, fmt.Sprintf("cannot lock the state directory %s: %v", dir, err))
	}
	s.lock = f
	st, err := s.Load()
	if err != nil {
		s.Close()
		return nil, err
	}
	if st != nil && st.ComposePath != composePath {
		s.Close()
		return nil, compose.New(compose.CodeStateDirUnavailable, fmt.Sprintf(
			"the state directory %s belongs to %s, not %s: two compose files in one directory need different namespaces (set namespace: in one of them)",
			dir, st.ComposePath, composePath))
	}
	return s, nil
}

// holder describes who holds a lock (the pid written into the lock file).
func holder(_ *os.File, err error) string {
	var le *lockedError
	if errors.As(err, &le) && le.pid > 0 {
		return "pid " + strconv.Itoa(le.pid)
	}
	return "another process"
}

// Dir is the state directory.
func (s *Store) Dir() string { return s.dir }

// ComposePath is the project's canonical compose file.
func (s *Store) ComposePath() string { return s.composePath }

// ConfigDir holds the resolved worker configs.
func (s *Store) ConfigDir() string { return filepath.Join(s.dir, ConfigDir) }

// LogsDir holds the rotating worker logs.
func (s *Store) LogsDir() string { return filepath.Join(s.dir, LogsDir) }

// StatePath is state.json.
func (s *Store) StatePath() string { return filepath.Join(s.dir, StateFile) }

// EngineConfigPath is the generated engine config.
func (s *Store) EngineConfigPath() string { return filepath.Join(s.dir, EngineConfigFile) }

// Load reads state.json; nil when there is none.
func (s *Store) Load() (*State, error) {
	data, err := os.ReadFile(s.StatePath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, ioError("read "+s.StatePath(), err)
	}
	return Decode(data, s.StatePath())
}

// Save writes state.json atomically, owner-only.
func (s *Store) Save(st *State) error {
	data, err := st.Encode()
	if err != nil {
		return ioError("encode "+s.StatePath(), err)
	}
	if err := writeAtomic(s.StatePath(), data, 0o600); err != nil {
		return ioError("write "+s.StatePath(), err)
	}
	return nil
}

// Clear removes state.json after a clean shutdown: nothing is left to
// adopt.
func (s *Store) Clear() error {
	if err := os.Remove(s.StatePath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return ioError("remove "+s.StatePath(), err)
	}
	return nil
}

// EngineLock is engine.lock, held by the Compose that starts and owns the
// managed engine of a project's namespace.
type EngineLock struct{ f *os.File }

// LockEngine takes <dir>/engine.lock (creating dir). It is taken before the
// project lock, so a second managed start of the same project and
// namespace is told DAEMON_NAMESPACE_TAKEN.
func LockEngine(dir, composePath, ns string) (*EngineLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, compose.New(compose.CodeStateDirUnavailable, fmt.Sprintf("cannot create the state directory %s: %v", dir, err))
	}
	path := filepath.Join(dir, EngineLockFile)
	f, err := lockFile(path)
	if err != nil {
		if errors.Is(err, errLocked) {
			return nil, compose.New(compose.CodeDaemonNamespaceTaken, fmt.Sprintf(
				"another `iii compose --up` (%s) already runs the engine of %s in namespace %q; stop it first, or use another namespace",
				holder(f, err), composePath, ns))
		}
		return nil, compose.New(compose.CodeStateDirUnavailable, fmt.Sprintf("cannot lock %s: %v", path, err))
	}
	return &EngineLock{f: f}, nil
}

// Release releases engine.lock.
func (l *EngineLock) Release() {
	if l != nil && l.f != nil {
		unlockFile(l.f)
		l.f = nil
	}
}

// WriteEngineConfig writes the generated engine config, owner-only.
func (s *Store) WriteEngineConfig(data []byte) (string, error) {
	if err := writeAtomic(s.EngineConfigPath(), data, 0o600); err != nil {
		return "", ioError("write "+s.EngineConfigPath(), err)
	}
	return s.EngineConfigPath(), nil
}

// RemoveEngineConfig deletes the generated engine config (after a clean
// shutdown).
func (s *Store) RemoveEngineConfig() {
	_ = os.Remove(s.EngineConfigPath())
}

// Close releases the project lock.
func (s *Store) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lock != nil {
		unlockFile(s.lock)
		s.lock = nil
	}
}

// Outcome is what recovery decided about a record left by a Compose that
// did not shut down cleanly.
type Outcome string

// Recovery outcomes (spec §5.7).
const (
	// Adopted: the recorded process is alive and is the same process.
	Adopted Outcome = "adopted"
	// Dead: the recorded process is gone (or its pid names another
	// process now); the container is failed.
	Dead Outcome = "dead"
	// Unverified: a live process has the recorded pid but its identity
	// cannot be checked; it is left running and reported, never signalled.
	Unverified Outcome = "unverified"
)

// Recovered is one record's recovery.
type Recovered struct {
	Container string
	Record    Record
	Outcome   Outcome
}

// CodeWorkerLost is the last_error code of a worker whose process was gone
// when Compose recovered its state.
const CodeWorkerLost = "WORKER_EXITED"

// Recover compares every running record of st with the live system and
// updates st: dead ones become failed. check is proc.Check outside tests.
func Recover(st *State, check func(pid int, birth string) proc.Match) []Recovered {
	var out []Recovered
	keys := make([]string, 0, len(st.Containers))
	for k := range st.Containers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, key := range keys {
		r := st.Containers[key]
		if r.PID == 0 || (r.Status != StatusStarting && r.Status != StatusReady) {
			continue
		}
		switch check(r.PID, r.Birth) {
		case proc.Same:
			out = append(out, Recovered{key, *r, Adopted})
		case proc.Unverifiable:
			out = append(out, Recovered{key, *r, Unverified})
		default:
			before := *r
			r.Status, r.PID, r.Birth = StatusFailed, 0, ""
			r.LastError = &ErrorRecord{Code: CodeWorkerLost, Message: fmt.Sprintf(
				"the worker (pid %d) ended while no Compose was watching it; start it again with compose::up", before.PID)}
			out = append(out, Recovered{key, before, Dead})
		}
	}
	return out
}
