package daemon

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/proc"
	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/compose/state"
)

// Readiness polling (spec §5.10).
const (
	readyPoll       = 200 * time.Millisecond
	logTailLines    = 5
	outputFlushWait = 500 * time.Millisecond
)

// startHost runs a path:// worker, or a binary package (pi) from the
// package cache, as a host process and waits until it registers in the
// project namespace.
func (p *project) startHost(ctx context.Context, f *composefile.File, c *container, pi *pkgInfo) (err error) {
	decl := c.decl
	key := c.key
	live, err := listWorkers(ctx, p.d.eng)
	if err != nil {
		return err
	}
	baseline := map[string]bool{}
	for _, w := range live {
		baseline[w.ID] = true
		if w.name() == key && w.Namespace == p.ns {
			return compose.New(compose.CodeContainerNameTaken, fmt.Sprintf(
				"container %q: a worker named %q already runs in namespace %q (engine worker %s) and this Compose did not start it; stop that worker or rename the container",
				key, key, p.ns, w.ID))
		}
	}
	var command string
	var argv []string
	var hb *hostBundle
	dir := decl.WorkingDir
	if pi != nil && pi.entry.Resolved.Type == registry.KindBundle {
		// runtime: host: its start command, in its private workspace.
		if hb, err = p.prepareHostBundle(key, decl.Scripts.Run, pi); err != nil {
			return err
		}
		if dir != "" {
			p.d.log.Warn("working_dir is ignored for a bundle: it runs in its own workspace", "container", key, "working_dir", dir)
		}
		command, dir = hb.command, hb.dir
	} else if pi != nil {
		// A package runs its executable straight from the verified cache
		// entry, in the project directory: the cache entry itself must
		// stay as installed (it is checked before every reuse).
		argv = []string{pi.inst.Executable}
		command = pi.inst.Executable
		if dir == "" {
			dir = f.Dir
		}
	} else {
		if command, err = startCommand(key, decl.Source.Path, decl.Scripts.Run); err != nil {
			return err
		}
		if dir == "" {
			dir = decl.Source.Path
		}
	}
	reserved := map[string]string{
		envURL:              p.d.url,
		envNamespace:        p.ns,
		envComposeNamespace: p.d.ns,
		envComposeFile:      f.Path,
		envComposeDir:       f.Dir,
		envWorkerName:       key,
		envIsolation:        "host",
	}
	cfgPath, err := p.resolveConfig(ctx, decl, pi)
	if err != nil {
		return err
	}
	if cfgPath != "" {
		reserved[envConfig] = cfgPath
	}
	if decl.ConfigName != "" {
		reserved[envConfigName] = decl.ConfigName
	}
	if hb == nil && queueProviderGrant(decl, pi) {
		tok, err := p.issueQueueProviderCredential(ctx, key)
		if err != nil {
			return err
		}
		reserved[envQueueProviderToken] = tok
		defer func() {
			if err != nil {
				p.revokeQueueProviderCredential(ctx, key)
			}
		}()
	}
	env, err := workerEnv(p.d.lookup, decl, reserved)
	if err != nil {
		return err
	}
	log, err := p.prepare(c, env, dir)
	if err != nil {
		return err
	}
	if err := preRun(ctx, c, dir, env, f.StopTimeout, log); err != nil {
		return err
	}
	if hb != nil {
		if err := hb.finish(ctx, c, env, log); err != nil {
			return err
		}
	}
	_ = log.Write(proc.Stderr, []byte(fmt.Sprintf("[compose] starting %s: %s", key, command)))
	pr, err := proc.Start(proc.Spec{Command: command, Argv: argv, Dir: dir, Env: env, Log: log})
	if err != nil {
		return compose.New(compose.CodeSpawnFailed, fmt.Sprintf("container %q: `%s` could not be started in %s: %v", key, command, dir, err))
	}
	p.d.track(pr.Pid, pr.Birth)
	p.mu.Lock()
	c.proc, c.owned = pr, true
	p.mu.Unlock()
	return p.settle(ctx, c, func() error { return p.waitReady(ctx, c, pr, baseline, decl.StartupTimeout) })
}

// prepare records the environment and directory c's hooks run with and
// opens c's log.
func (p *project) prepare(c *container, env []string, dir string) (*proc.Log, error) {
	log, err := p.logFor(c)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	c.env, c.dir = env, dir
	p.mu.Unlock()
	return log, nil
}

// preRun runs c's pre_run script, when it declares one, in dir with env.
func preRun(ctx context.Context, c *container, dir string, env []string, stopGrace time.Duration, log *proc.Log) error {
	s := c.decl.Scripts
	if s.PreRun == "" {
		return nil
	}
	h := proc.Hook{Name: "pre_run", Container: c.key, Command: s.PreRun, Dir: dir, Env: env,
		Timeout: s.PreRunTimeout, StopGrace: stopGrace, Log: log}
	return h.Run(ctx)
}

// settle marks a just-started c starting, waits until wait says it is
// ready, and marks it ready. One that does not become ready is stopped
// (its process or VM goes, and so does the post_run).
func (p *project) settle(ctx context.Context, c *container, wait func() error) error {
	p.setState(c, state.StatusStarting, nil)
	if err := wait(); err != nil {
		p.stopOne(ctx, c, asComposeError(err))
		return err
	}
	p.setState(c, state.StatusReady, nil)
	return nil
}

// waitReady polls engine::workers::list until a worker named after the
// container appears in the project namespace (spec §5.10), or says why it
// will not.
func (p *project) waitReady(ctx context.Context, c *container, pr *proc.Process, baseline map[string]bool, timeout time.Duration) error {
	key := c.key
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	inspected := map[string]bool{}
	for {
		live, err := listWorkers(ctx, p.d.eng)
		if err == nil {
			for _, w := range live {
				if !baseline[w.ID] && w.name() == key && w.Namespace == p.ns {
					return nil
				}
			}
			if err := p.misregistered(ctx, key, pr, live, baseline, inspected); err != nil {
				return err
			}
		}
		if pr.Exited() {
			select {
			case <-pr.OutputDone():
			case <-time.After(outputFlushWait):
			}
			return compose.New(compose.CodeChildExitedBeforeRegistration, fmt.Sprintf(
				"container %q exited (%s) before it registered as worker %q in namespace %q%s",
				key, pr.ExitStatus(), key, p.ns, p.tail(key)))
		}
		select {
		case <-ctx.Done():
			return compose.New(compose.CodeStartupTimeout, fmt.Sprintf("container %q: the start was interrupted (%v)", key, ctx.Err()))
		case <-deadline.C:
			return compose.New(compose.CodeStartupTimeout, fmt.Sprintf(
				"container %q did not register as worker %q in namespace %q within %s (startup_timeout); check that it connects to $III_URL and registers with $III_WORKER_NAME in $III_NAMESPACE%s",
				key, key, p.ns, timeout, p.tail(key)))
		case <-tick.C:
		}
	}
}

// misregistered looks at workers that appeared since the start and came
// from the container's process group: registered under another name, or in
// another namespace.
func (p *project) misregistered(ctx context.Context, key string, pr *proc.Process, live []liveWorker, baseline, inspected map[string]bool) error {
	for _, w := range live {
		if baseline[w.ID] || inspected[w.ID] || w.name() == "" {
			continue
		}
		pid := workerPID(ctx, p.d.eng, w.name(), w.Namespace)
		if pid == 0 {
			continue
		}
		inspected[w.ID] = true
		if !inGroup(pid, pr.Pid) {
			continue
		}
		switch {
		case w.Namespace != p.ns && w.name() == key:
			return compose.New(compose.CodeWorkerIgnoredNamespace, fmt.Sprintf(
				"container %q registered as worker %q in namespace %q instead of %q: the worker must register in $III_NAMESPACE (engine::workers::register with namespace, or the SDK's namespace option)",
				key, key, w.Namespace, p.ns))
		case w.Namespace == p.ns && w.name() != key:
			return compose.New(compose.CodeWorkerNameMismatch, fmt.Sprintf(
				"container %q registered in namespace %q as worker %q; the worker must use the container key as its name ($III_WORKER_NAME=%s)",
				key, p.ns, w.name(), key))
		case w.Namespace != p.ns && w.FunctionCount > 0:
			return compose.New(compose.CodeFunctionsInWrongNamespace, fmt.Sprintf(
				"container %q registered %d function(s) in namespace %q (as worker %q) instead of %q; register them from a worker in $III_NAMESPACE",
				key, w.FunctionCount, w.Namespace, w.name(), p.ns))
		}
	}
	return nil
}

// tail formats the last lines of a container's log for a message.
func (p *project) tail(key string) string {
	lines := proc.TailLines(p.store.LogsDir(), key, logTailLines)
	if len(lines) == 0 {
		return ""
	}
	return "; last output:\n  " + strings.Join(lines, "\n  ")
}

// resolveConfig merges a host worker's configuration layers (a package's
// default configuration, the configuration entry, config_override),
// writes the result to <state>/config/<key>.yaml and publishes it under
// config_name. It returns the file's path, or "" when the container has
// no configuration.
func (p *project) resolveConfig(ctx context.Context, decl *composefile.Container, pi *pkgInfo) (string, error) {
	var l layers
	l.defaults, l.hasDef = pi.defaults()
	existed := false
	if decl.ConfigName != "" {
		v, ok, err := fetchEntry(ctx, p.d.eng, decl.ConfigName, decl.Key)
		if err != nil {
			return "", err
		}
		l.entry, l.hasEntry, existed = v, ok, ok
	}
	if decl.ConfigOverride != nil {
		v, err := normalize(decl.ConfigOverride)
		if err != nil {
			return "", compose.New(compose.CodeInvalidComposeFile, fmt.Sprintf("containers.%s.config_override: %v", decl.Key, err))
		}
		l.override, l.hasOver = v, true
	}
	merged, ok := l.merged()
	if !ok && decl.ConfigName == "" {
		return "", nil
	}
	if !ok {
		merged = map[string]any{}
	}
	path, err := writeConfigFile(p.store.ConfigDir(), decl.Key, merged)
	if err != nil {
		return "", err
	}
	if decl.ConfigName != "" {
		if err := publishEntry(ctx, p.d.eng, decl.ConfigName, decl.Key, merged, existed); err != nil {
			return "", err
		}
	}
	return path, nil
}
