package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/compose/state"
)

// EnvEngineLifeline names the fd of the lifeline pipe the managed engine
// inherits: when it reads EOF, Compose is gone and the engine stops.
const EnvEngineLifeline = "III_ENGINE_LIFELINE_FD"

// lifelineFD is the fd the lifeline lands on in the engine (ExtraFiles[0]).
const lifelineFD = 3

// listenerPoll is how often the managed engine's listener is tried.
const listenerPoll = 50 * time.Millisecond

// engineStoreDir holds the configuration worker's entries of a managed
// engine whose compose file does not configure that worker.
const engineStoreDir = "engine-data"

// managedEngine is the engine `iii compose --up` started from an engine:
// section. It dies with Compose: a clean stop stops it after the
// projects; a dead Compose breaks its lifeline (and, on Linux, the kernel
// sends it SIGTERM).
type managedEngine struct {
	path        string // the compose file that owns it
	fingerprint [32]byte
	lock        *state.EngineLock
	store       *state.Store
	proc        *proc.Process
	log         *proc.Log
	lifeline    *os.File
	grace       time.Duration
	d           *Daemon
}

// startManaged starts the engine of f and waits for its listener.
func (d *Daemon) startManaged(ctx context.Context, f *composefile.File) error {
	d.applyNamespace(f)
	dir := state.DirFor(f.Path, f.Namespace, d.getenv)
	lock, err := state.LockEngine(dir, f.Path, f.Namespace)
	if err != nil {
		return err
	}
	p, err := d.projectFor(f)
	if err != nil {
		lock.Release()
		return err
	}
	cfg, err := engineConfig(f, p.store.Dir())
	if err != nil {
		lock.Release()
		return err
	}
	host, port, err := listenerOf(f.Engine.URL)
	if err != nil {
		lock.Release()
		return err
	}
	if l, err := net.Listen("tcp", net.JoinHostPort(host, port)); err != nil {
		lock.Release()
		return compose.New(compose.CodeManagedEngineListenerUnavailable, fmt.Sprintf(
			"the managed engine cannot listen on %s (engine.url %s): %v; stop whatever holds the port, change engine.url (and the iii-worker-manager port), or leave engine: empty to attach to the engine that runs there",
			net.JoinHostPort(host, port), f.Engine.URL, err))
	} else {
		l.Close()
	}
	cfgPath, err := p.store.WriteEngineConfig(cfg)
	if err != nil {
		lock.Release()
		return err
	}
	// The engine learns the project token from its environment only: it
	// is in no file the engine or a worker reads.
	token, err := d.projectToken(p.store)
	if err != nil {
		lock.Release()
		return err
	}
	d.token = token
	log, err := proc.OpenLog(p.store.Dir(), state.EngineLogName, proc.LogOptions{})
	if err != nil {
		lock.Release()
		return compose.New(compose.CodeIOError, fmt.Sprintf("open engine.log in %s: %v", p.store.Dir(), err))
	}
	r, w, err := os.Pipe()
	if err != nil {
		log.Close()
		lock.Release()
		return compose.New(compose.CodeEngineSpawnFailed, "create the engine's lifeline: "+err.Error())
	}
	env := []string{fmt.Sprintf("%s=%d", EnvEngineLifeline, lifelineFD), envEngineToken + "=" + token}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envEngineToken+"=") && !strings.HasPrefix(kv, EnvEngineLifeline+"=") {
			env = append(env, kv)
		}
	}
	pr, err := proc.Start(proc.Spec{
		Argv: []string{d.exe, "-c", cfgPath, "--no-update-check"},
		Dir:  f.Dir, Env: env, Log: log, ExtraFiles: []*os.File{r}, DieWithParent: true,
	})
	r.Close()
	if err != nil {
		w.Close()
		log.Close()
		lock.Release()
		return compose.New(compose.CodeEngineSpawnFailed, fmt.Sprintf("cannot start the engine (%s -c %s): %v", d.exe, cfgPath, err))
	}
	m := &managedEngine{path: f.Path, fingerprint: sha256.Sum256(cfg), lock: lock, store: p.store, proc: pr, log: log,
		lifeline: w, grace: f.StopTimeout, d: d}
	d.managed = m
	if d.reaper != nil {
		if err := d.reaper.Track(pr.Pid, pr.Birth, proc.PhaseEngine); err != nil {
			d.log.Error("cannot tell the reaper about the engine", "error", err)
		}
	}
	if err := m.waitListener(ctx, net.JoinHostPort(host, port), f.StartupTimeout); err != nil {
		return err
	}
	d.log.Info("managed engine started", "pid", pr.Pid, "url", f.Engine.URL, "config", cfgPath)
	fmt.Fprintf(d.out, "compose: engine started (pid %d) on %s; config %s, log %s\n", pr.Pid, f.Engine.URL, cfgPath, log.Path())
	return nil
}

// applyNamespace makes f run in the daemon namespace when -n was given.
func (d *Daemon) applyNamespace(f *composefile.File) {
	if d.nsForced && f.Namespace != d.ns {
		f.SetNamespace(d.ns)
	}
}

// listenerOf is the host and port the managed engine listens on.
func listenerOf(raw string) (string, string, error) {
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
func (m *managedEngine) waitListener(ctx context.Context, addr string, timeout time.Duration) error {
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
			return m.exitedError()
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

// exitedError is ENGINE_EXITED with the tail of engine.log.
func (m *managedEngine) exitedError() error {
	select {
	case <-m.proc.OutputDone():
	case <-time.After(outputFlushWait):
	}
	return compose.New(compose.CodeEngineExited, fmt.Sprintf("the managed engine (pid %d) exited (%s)%s",
		m.proc.Pid, m.proc.ExitStatus(), m.tail()))
}

func (m *managedEngine) tail() string {
	lines := proc.TailLines(m.store.Dir(), state.EngineLogName, 10)
	if len(lines) == 0 {
		return ""
	}
	return "; last lines of " + m.log.Path() + ":\n  " + strings.Join(lines, "\n  ")
}

// stop ends the engine after the projects: its lifeline is closed (it
// stops by itself, its adapters first), then SIGTERM, then SIGKILL after
// the grace. The generated config is deleted after a clean stop.
func (m *managedEngine) stop(ctx context.Context) error {
	_ = m.lifeline.Close()
	err := m.proc.Stop(ctx, m.grace)
	if m.d.reaper != nil {
		_ = m.d.reaper.Untrack(m.proc.Pid)
	}
	m.store.RemoveEngineConfig()
	_ = m.log.Close()
	m.lock.Release()
	if err != nil {
		return fmt.Errorf("stop the managed engine: %w", err)
	}
	return nil
}

// checkEngineSection applies the ownership rules to a file loaded by
// compose::up or restart: an engine: section needs this daemon to have
// started the engine for that very file, with the same section.
func (d *Daemon) checkEngineSection(f *composefile.File) error {
	if f.Engine == nil || f.Engine.Empty {
		return nil
	}
	if d.managed == nil {
		return engineNeedsManagedStart(f, d.url)
	}
	if d.managed.path != f.Path {
		return compose.New(compose.CodeEngineAlreadyOwned, fmt.Sprintf(
			"%s has an engine: section, but this Compose already owns the engine started for %s; remove engine: from %s (or leave it empty) to run it on this engine",
			f.Path, d.managed.path, f.Path))
	}
	cfg, err := engineConfig(f, d.managed.store.Dir())
	if err != nil {
		return err
	}
	if sha256.Sum256(cfg) != d.managed.fingerprint {
		return compose.New(compose.CodeEngineRestartRequired, fmt.Sprintf(
			"the engine: section of %s changed; it takes effect only when Compose starts the engine: stop this Compose and run `iii compose --up` again", f.Path))
	}
	return nil
}

// engineConfig generates the managed engine's config.yaml: the
// engine.workers entries in list shape (values as written), a listener
// for engine.url when the file declares none, the configuration worker's
// store, registration_namespace_grace_ms, and the sandbox: binding
// (engine.sandbox, else sandbox-libkrun in the project namespace).
func engineConfig(f *composefile.File, stateDir string) ([]byte, error) {
	e := f.Engine
	host, port, err := listenerOf(e.URL)
	if err != nil {
		return nil, err
	}
	str := func(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }
	num := func(n int) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(n)} }
	mapping := func(kv ...*yaml.Node) *yaml.Node {
		return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: kv}
	}

	root := mapping()
	root.HeadComment = "Generated by `iii compose --up` from " + f.Path + ".\nRewritten at every start and deleted at a clean stop; edit the engine: section there instead."
	if e.RegistrationNamespaceGraceMS != nil {
		root.Content = append(root.Content, str("registration_namespace_grace_ms"), num(*e.RegistrationNamespaceGraceMS))
	}
	workers := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	hasListener, hasConfiguration := false, false
	for _, w := range e.Workers {
		cfg := w.EngineNode()
		switch w.Name {
		case composefile.EngineWorkerManager:
			hasListener = true
		case composefile.EngineWorkerConfiguration:
			hasConfiguration = true
			anchorStore(cfg, f.Dir)
		}
		workers.Content = append(workers.Content, mapping(str("name"), str(w.Name), str("config"), cfg))
	}
	if !hasConfiguration {
		dir := filepath.Join(stateDir, engineStoreDir, "config")
		workers.Content = append(workers.Content, mapping(str("name"), str(composefile.EngineWorkerConfiguration), str("config"),
			mapping(str("adapter"), mapping(str("name"), str("fs"), str("config"), mapping(str("directory"), str(dir))))))
	}
	if !hasListener {
		p, _ := strconv.Atoi(port)
		workers.Content = append(workers.Content, mapping(str("name"), str(composefile.EngineWorkerManager), str("config"),
			mapping(str("host"), str(host), str("port"), num(p))))
	}
	root.Content = append(root.Content, str("workers"), workers)
	adapter, ns := composefile.DefaultSandboxAdapter, f.Namespace
	if e.Sandbox != nil {
		adapter = e.Sandbox.Adapter
		if e.Sandbox.Namespace != "" {
			ns = e.Sandbox.Namespace
		}
	}
	root.Content = append(root.Content, str("sandbox"), mapping(str("adapter"), str(adapter), str("namespace"), str(ns)))

	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{root}}); err != nil {
		return nil, compose.New(compose.CodeIOError, "encode the engine config: "+err.Error())
	}
	if err := enc.Close(); err != nil {
		return nil, compose.New(compose.CodeIOError, "encode the engine config: "+err.Error())
	}
	return buf.Bytes(), nil
}

// anchorStore makes the configuration worker's store directory absolute
// against the compose file's directory: the generated config lives in the
// state directory, and the engine resolves relative paths against it. A
// directory left out is the engine's ./config, also of the project.
// A value with ${...} is the engine's to expand and is left alone.
func anchorStore(cfg *yaml.Node, dir string) {
	adapter := child(cfg, "adapter")
	if adapter == nil {
		adapter = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		cfg.Content = append(cfg.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "adapter"}, adapter)
	}
	if adapter.Kind != yaml.MappingNode {
		return
	}
	store := child(adapter, "config")
	if store == nil {
		store = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		adapter.Content = append(adapter.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "config"}, store)
	}
	if store.Kind != yaml.MappingNode {
		return
	}
	d := child(store, "directory")
	if d == nil {
		store.Content = append(store.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "directory"},
			&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: filepath.Join(dir, "config")})
		return
	}
	if d.Kind == yaml.ScalarNode && d.Tag != "!!null" && !strings.Contains(d.Value, "${") && d.Value != "" && !filepath.IsAbs(d.Value) {
		d.Value = filepath.Join(dir, d.Value)
		d.Style = 0
	}
}

func child(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}
