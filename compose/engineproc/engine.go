// Package engineproc runs the engine `iii compose --up` starts from an
// engine: section: its generated config.yaml, the process with its
// lifeline, the wait for its listener, and its stop. The Compose daemon
// decides when; this package knows how.
package engineproc

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/compose/state"
)

// EnvLifeline names the fd of the lifeline pipe the managed engine
// inherits: when it reads EOF, Compose is gone and the engine stops.
const EnvLifeline = "III_ENGINE_LIFELINE_FD"

// EnvToken is the variable the engine reads its token from.
const EnvToken = "III_ENGINE_TOKEN"

// lifelineFD is the fd the lifeline lands on in the engine (ExtraFiles[0]).
const lifelineFD = 3

// listenerPoll is how often the managed engine's listener is tried.
const listenerPoll = 50 * time.Millisecond

// outputFlushWait bounds the wait for an exited engine's last output
// before its log is quoted.
const outputFlushWait = 500 * time.Millisecond

// storeDir holds the configuration worker's entries of a managed
// engine whose compose file does not configure that worker.
const storeDir = "engine-data"

// Tracker is told about the engine process so it is killed should
// Compose die uncleanly (*proc.Reaper).
type Tracker interface {
	Track(pgid int, birth string, phase int) error
	Untrack(pgid int) error
}

// Spec is what Start needs.
type Spec struct {
	// File has the engine: section; the engine runs in its directory.
	File *composefile.File
	// Lock is the project's engine lock, taken by the caller: released
	// when Start fails before the engine runs, and by Stop.
	Lock *state.EngineLock
	// Store is the project's state directory: the generated config and
	// engine.log live there.
	Store *state.Store
	// Executable is the iii binary.
	Executable string
	// Token returns the project token, which the engine learns from its
	// environment only: it is in no file the engine or a worker reads.
	Token func() (string, error)
	// Tracker, when set, tracks the engine process.
	Tracker Tracker
	Logger  hclog.Logger
	// Out receives the "engine started" line.
	Out io.Writer
}

// Engine is the engine `iii compose --up` started from an engine:
// section. It dies with Compose: a clean stop stops it after the
// projects; a dead Compose breaks its lifeline (and, on Linux, the kernel
// sends it SIGTERM).
type Engine struct {
	path        string // the compose file that owns it
	fingerprint [32]byte
	lock        *state.EngineLock
	store       *state.Store
	proc        *proc.Process
	log         *proc.Log
	lifeline    *os.File
	grace       time.Duration
	tracker     Tracker
}

// Start starts the engine of s.File and waits for its listener. The
// Engine is returned once its process runs, also when the wait fails:
// the caller stops it.
func Start(ctx context.Context, s Spec) (*Engine, error) {
	f, lock := s.File, s.Lock
	cfg, err := Config(f, s.Store.Dir())
	if err != nil {
		lock.Release()
		return nil, err
	}
	host, port, err := ListenerOf(f.Engine.URL)
	if err != nil {
		lock.Release()
		return nil, err
	}
	if l, err := net.Listen("tcp", net.JoinHostPort(host, port)); err != nil {
		lock.Release()
		return nil, compose.New(compose.CodeManagedEngineListenerUnavailable, fmt.Sprintf(
			"the managed engine cannot listen on %s (engine.url %s): %v; stop whatever holds the port, change engine.url (and the iii-worker-manager port), or leave engine: empty to attach to the engine that runs there",
			net.JoinHostPort(host, port), f.Engine.URL, err))
	} else {
		l.Close()
	}
	cfgPath, err := s.Store.WriteEngineConfig(cfg)
	if err != nil {
		lock.Release()
		return nil, err
	}
	token, err := s.Token()
	if err != nil {
		lock.Release()
		return nil, err
	}
	log, err := proc.OpenLog(s.Store.Dir(), state.EngineLogName, proc.LogOptions{})
	if err != nil {
		lock.Release()
		return nil, compose.New(compose.CodeIOError, fmt.Sprintf("open engine.log in %s: %v", s.Store.Dir(), err))
	}
	r, w, err := os.Pipe()
	if err != nil {
		log.Close()
		lock.Release()
		return nil, compose.New(compose.CodeEngineSpawnFailed, "create the engine's lifeline: "+err.Error())
	}
	env := []string{fmt.Sprintf("%s=%d", EnvLifeline, lifelineFD), EnvToken + "=" + token}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, EnvToken+"=") && !strings.HasPrefix(kv, EnvLifeline+"=") {
			env = append(env, kv)
		}
	}
	pr, err := proc.Start(proc.Spec{
		Argv: []string{s.Executable, "-c", cfgPath, "--no-update-check"},
		Dir:  f.Dir, Env: env, Log: log, ExtraFiles: []*os.File{r}, DieWithParent: true,
	})
	r.Close()
	if err != nil {
		w.Close()
		log.Close()
		lock.Release()
		return nil, compose.New(compose.CodeEngineSpawnFailed, fmt.Sprintf("cannot start the engine (%s -c %s): %v", s.Executable, cfgPath, err))
	}
	m := &Engine{path: f.Path, fingerprint: sha256.Sum256(cfg), lock: lock, store: s.Store, proc: pr, log: log,
		lifeline: w, grace: f.StopTimeout, tracker: s.Tracker}
	if m.tracker != nil {
		if err := m.tracker.Track(pr.Pid, pr.Birth, proc.PhaseEngine); err != nil {
			s.Logger.Error("cannot tell the reaper about the engine", "error", err)
		}
	}
	if err := m.waitListener(ctx, net.JoinHostPort(host, port), f.StartupTimeout); err != nil {
		return m, err
	}
	s.Logger.Info("managed engine started", "pid", pr.Pid, "url", f.Engine.URL, "config", cfgPath)
	fmt.Fprintf(s.Out, "compose: engine started (pid %d) on %s; config %s, log %s\n", pr.Pid, f.Engine.URL, cfgPath, log.Path())
	return m, nil
}

// Path is the compose file that owns the engine.
func (m *Engine) Path() string { return m.path }

// Pid is the engine's process id.
func (m *Engine) Pid() int { return m.proc.Pid }

// Done is closed when the engine process has exited.
func (m *Engine) Done() <-chan struct{} { return m.proc.Done() }

// Check applies the ownership rules to a file compose::up or restart
// loaded: an engine: section needs this engine to have been started for
// that very file, with the same section.
func (m *Engine) Check(f *composefile.File) error {
	if m.path != f.Path {
		return compose.New(compose.CodeEngineAlreadyOwned, fmt.Sprintf(
			"%s has an engine: section, but this Compose already owns the engine started for %s; remove engine: from %s (or leave it empty) to run it on this engine",
			f.Path, m.path, f.Path))
	}
	cfg, err := Config(f, m.store.Dir())
	if err != nil {
		return err
	}
	if sha256.Sum256(cfg) != m.fingerprint {
		return compose.New(compose.CodeEngineRestartRequired, fmt.Sprintf(
			"the engine: section of %s changed; it takes effect only when Compose starts the engine: stop this Compose and run `iii compose --up` again", f.Path))
	}
	return nil
}

// ListenerOf is the host and port the managed engine listens on.
func ListenerOf(raw string) (string, string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Port() == "" {
		return "", "", compose.New(compose.CodeInvalidManagedEngineURL, fmt.Sprintf("engine.url %q has no host:port", raw))
	}
	host := u.Hostname()
	if host == "localhost" {
		host = "127.0.0.1"
	}
	return host, u.Port(), nil
}

// waitListener waits until the engine accepts connections.
func (m *Engine) waitListener(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	t := time.NewTicker(listenerPoll)
	defer t.Stop()
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return nil
		}
		if m.proc.Exited() {
			return m.ExitedError()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return compose.New(compose.CodeEngineStartupTimeout, fmt.Sprintf(
				"the managed engine (pid %d) did not listen on %s within %s (startup_timeout)%s", m.proc.Pid, addr, timeout, m.tail()))
		case <-t.C:
		}
	}
}

// ExitedError is ENGINE_EXITED with the tail of engine.log.
func (m *Engine) ExitedError() error {
	select {
	case <-m.proc.OutputDone():
	case <-time.After(outputFlushWait):
	}
	return compose.New(compose.CodeEngineExited, fmt.Sprintf("the managed engine (pid %d) exited (%s)%s",
		m.proc.Pid, m.proc.ExitStatus(), m.tail()))
}

func (m *Engine) tail() string {
	lines := proc.TailLines(m.store.Dir(), state.EngineLogName, 10)
	if len(lines) == 0 {
		return ""
	}
	return "; last lines of " + m.log.Path() + ":\n  " + strings.Join(lines, "\n  ")
}

// Stop ends the engine after the projects: its lifeline is closed (it
// stops by itself, its adapters first), then SIGTERM, then SIGKILL after
// the grace. The generated config is deleted after a clean stop.
func (m *Engine) Stop(ctx context.Context) error {
	_ = m.lifeline.Close()
	err := m.proc.Stop(ctx, m.grace)
	if m.tracker != nil {
		_ = m.tracker.Untrack(m.proc.Pid)
	}
	m.store.RemoveEngineConfig()
	_ = m.log.Close()
	m.lock.Release()
	if err != nil {
		return fmt.Errorf("stop the managed engine: %w", err)
	}
	return nil
}
