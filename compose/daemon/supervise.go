package daemon

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/compose/vmworkers"
)

// superviseTick checks the project's running containers once (spec §5.10):
// a worker that exited takes its transitive dependents down, dependents
// first, and is recorded failed; nothing restarts by itself. After the
// engine connection came back, every running worker has its
// startup_timeout to register again, and an adapter container the engine
// no longer runs (the engine restarted) is started again (reviveAdapter).
// A project busy with an operation is skipped this tick: the operation
// watches its own starts.
func (p *project) superviseTick(ctx context.Context, reconnected, connected bool) {
	if !p.tryAcquire() {
		return
	}
	defer p.release()
	f := p.currentFile()
	now := time.Now()
	type failure struct {
		c   *container
		err *compose.Error
	}
	var failures []failure
	var adapters, vms, waiting []*container
	p.mu.Lock()
	for _, c := range p.cs {
		if c.state != state.StatusReady {
			continue
		}
		if reconnected {
			timeout := f.StartupTimeout
			if c.decl != nil {
				timeout = c.decl.StartupTimeout
			}
			c.reregisterBy = now.Add(timeout)
		}
		switch {
		case c.proc != nil && c.proc.Exited():
			failures = append(failures, failure{c, nil})
		case c.adapter != nil:
			adapters = append(adapters, c)
		case c.vm != nil:
			vms = append(vms, c)
		}
		if !c.reregisterBy.IsZero() {
			waiting = append(waiting, c)
		}
	}
	p.mu.Unlock()

	if connected {
		for _, c := range adapters {
			st, found, err := adapterState(ctx, p.d.eng, c.adapter)
			if err != nil {
				continue
			}
			if p.adapterLost(c, st, found) {
				if err := p.reviveAdapter(ctx, f, c); err != nil {
					failures = append(failures, failure{c, asComposeError(err)})
				}
				continue
			}
			if !found {
				continue
			}
			switch st.State {
			case "failed", "stopped", "incompatible":
				failures = append(failures, failure{c, compose.New(CodeWorkerExited, fmt.Sprintf(
					"container %q: sandbox adapter %s in namespace %q is %s: %s", c.key, c.adapter.Name, c.adapter.NS, st.State, st.LastError))})
			}
		}
		for _, c := range vms {
			// A VM's command that ended takes the container down. An
			// adapter that does not answer is its own container's
			// business (it takes its VM containers down with it).
			st, err := p.d.vms().Status(ctx, c.vm)
			if err != nil {
				continue
			}
			p.noteStateDir(c.vm, st)
			if vmworkers.Ended(st.State) {
				p.mu.Lock()
				c.vm.Exit = vmworkers.EndText(st)
				p.mu.Unlock()
				failures = append(failures, failure{c, nil})
			}
		}
		if len(waiting) > 0 {
			if live, err := listWorkers(ctx, p.d.eng); err == nil {
				for _, c := range waiting {
					name, ns := c.key, p.ns
					if c.adapter != nil {
						name, ns = c.adapter.Name, c.adapter.NS
					}
					seen := false
					for _, w := range live {
						if w.name() == name && w.Namespace == ns {
							seen = true
						}
					}
					p.mu.Lock()
					switch {
					case seen:
						c.reregisterBy = time.Time{}
					case now.After(c.reregisterBy):
						failures = append(failures, failure{c, compose.New(compose.CodeStartupTimeout, fmt.Sprintf(
							"container %q did not register again in namespace %q within its startup_timeout after the engine connection came back", c.key, p.ns))})
					}
					p.mu.Unlock()
				}
			}
		}
	}
	for _, fl := range failures {
		p.takeDown(ctx, fl.c, fl.err)
	}
}

// takeDown handles a container that stopped running on its own: its
// running dependents stop first (recorded failed with DEPENDENCY_FAILED),
// then the container itself is recorded failed.
func (p *project) takeDown(ctx context.Context, c *container, reason *compose.Error) {
	f := p.currentFile()
	var stopped []string
	deps := f.Dependents(c.key)
	for i := len(deps) - 1; i >= 0; i-- {
		dc := p.get(deps[i])
		p.mu.Lock()
		running := dc.running()
		p.mu.Unlock()
		if !running {
			continue
		}
		p.stopOne(ctx, dc, compose.New(CodeDependencyFailed, fmt.Sprintf(
			"container %q was stopped because %q, which it starts after, stopped running; start the project again with compose::up", dc.key, c.key)))
		stopped = append(stopped, dc.key)
	}
	if reason == nil {
		status := "exited"
		tail := ""
		p.mu.Lock()
		vm := c.vm
		switch {
		case c.proc != nil:
			status = "exited (" + exitText(c.proc) + ")"
		case vm != nil && vm.Exit != "":
			status = "stopped running: its VM (vm_id " + vm.ID + ") " + vm.Exit
		}
		p.mu.Unlock()
		if vm != nil {
			tail = p.d.vms().Tail(ctx, vm)
		} else {
			tail = p.tail(c.key)
		}
		msg := fmt.Sprintf("container %q %s after it was ready; Compose does not restart workers: start it again with compose::up", c.key, status)
		if len(stopped) > 0 {
			msg += "; stopped with it: " + strings.Join(stopped, ", ")
		}
		reason = compose.New(CodeWorkerExited, msg+tail)
	}
	p.d.log.Warn("a container stopped running", "container", c.key, "code", reason.Code, "dependents_stopped", stopped)
	p.stopOne(ctx, c, reason)
}

// adapterLost reports whether an adapter container this daemon started is
// gone from the engine it reconnected to: after the engine connection came
// back (reregisterBy set) the plugin host lists no such adapter (a
// restarted engine runs only what its config.yaml binds), lists it not
// running (the engine's own start of its installed adapter failed), or
// runs another process (the engine started its installed adapter itself,
// with its config.yaml's sandbox.config: Compose takes it over, as at its
// own start, so config_override and host_roots apply again). A
// container the engine never lost is left alone, and so is one an operator
// stopped on a connection that never dropped: Compose restarts nothing by
// itself (spec §5.10); bringing back what an engine restart took is not a
// restart of the worker, whose sandboxes and VMs the new adapter adopts.
func (p *project) adapterLost(c *container, st adapterStatus, found bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !c.owned || c.reregisterBy.IsZero() || c.state != state.StatusReady {
		return false
	}
	return !found || st.State != "running" ||
		(st.Path != "" && c.adapterPath != "" && st.Path != c.adapterPath) ||
		(st.PID != 0 && c.adapterPID != 0 && st.PID != c.adapterPID)
}

// reviveAdapter starts an adapter container again after an engine restart,
// from the binary and with the configuration it ran with (its package from
// the lock, the layers merged again): the new adapter process adopts the
// sandboxes and worker VMs the old one left (sandbox-libkrun's
// adopt_grace_ms), so nothing the project ran is lost.
func (p *project) reviveAdapter(ctx context.Context, f *composefile.File, c *container) error {
	pi, err := p.packageOf(ctx, f, c.key)
	if err != nil {
		return err
	}
	p.d.log.Info("the engine came back without this project's sandbox adapter process: starting it again", "container", c.key, "adapter", c.adapter.Name, "namespace", c.adapter.NS)
	fmt.Fprintf(p.d.out, "compose: %s: the engine restarted; starting the adapter again from its package (it adopts its sandboxes and VM workers)\n", c.key)
	return p.startAdapter(ctx, f, c, pi)
}
