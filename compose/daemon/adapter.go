package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/compose/vmworkers"
	"github.com/iii-sandbox/iii/protocol"
)

// Plugin host codes the daemon reacts to.
const (
	codeAdapterAlreadyStarted = "ADAPTER_ALREADY_STARTED"
	codeAdapterNotStarted     = "ADAPTER_NOT_STARTED"
)

// adapterStartTimeout bounds one engine::adapters::start or restart call:
// the plugin host waits for the adapter's handshake and configuration.
const adapterStartTimeout = 2 * time.Minute

// isAdapter reports whether a container is a sandbox adapter package that
// the engine's plugin host runs (engine::adapters::*) instead of a host
// process: sandbox-libkrun, the adapter engine.sandbox names, or any
// package named sandbox-* (the index format has no field that says so).
func (p *project) isAdapter(f *composefile.File, decl *composefile.Container) bool {
	if decl == nil || decl.Source.Kind != composefile.SourcePackage {
		return false
	}
	name := decl.Source.Name
	if name == composefile.AdapterPackage || strings.HasPrefix(name, "sandbox-") {
		return true
	}
	return f.Engine != nil && f.Engine.Sandbox != nil && f.Engine.Sandbox.Adapter == name
}

// adapterRefOf names an adapter container's adapter and the namespace it
// runs in: engine.sandbox.namespace for the bound adapter, else the
// project namespace.
func (p *project) adapterRefOf(f *composefile.File, decl *composefile.Container) *vmworkers.Adapter {
	return adapterRefIn(f, decl)
}

// adapterRefIn is adapterRefOf for a file (whose namespace is the
// project's).
func adapterRefIn(f *composefile.File, decl *composefile.Container) *vmworkers.Adapter {
	ref := &vmworkers.Adapter{Name: decl.Source.Name, NS: f.Namespace}
	if f.Engine != nil && f.Engine.Sandbox != nil && f.Engine.Sandbox.Adapter == ref.Name && f.Engine.Sandbox.Namespace != "" {
		ref.NS = f.Engine.Sandbox.Namespace
	}
	return ref
}

// EntryID is the configuration entry the plugin host keeps (in memory)
// for an adapter it runs.
func EntryID(ns, adapter string) string { return ns + "-" + adapter }

// adapterConfig merges the adapter's layers: the package's default
// configuration (from the lock), the entry the engine holds for it now,
// then config_override. A key removed
// from config_override therefore keeps its current value.
func (p *project) adapterConfig(ctx context.Context, f *composefile.File, ref *vmworkers.Adapter, decl *composefile.Container, pi *pkgInfo) (any, error) {
	var l layers
	l.defaults, l.hasDef = pi.defaults()
	v, ok, err := fetchEntry(ctx, p.d.eng, EntryID(ref.NS, ref.Name), decl.Key)
	if err != nil {
		return nil, err
	}
	l.entry, l.hasEntry = v, ok
	if decl.ConfigOverride != nil {
		ov, err := normalize(decl.ConfigOverride)
		if err != nil {
			return nil, compose.New(compose.CodeInvalidComposeFile, fmt.Sprintf("containers.%s.config_override: %v", decl.Key, err))
		}
		l.override, l.hasOver = ov, true
	}
	merged, ok := l.merged()
	if !ok || merged == nil {
		merged = map[string]any{}
	}
	m, isMap := merged.(map[string]any)
	if !isMap {
		return nil, compose.New(compose.CodeInvalidComposeFile, fmt.Sprintf(
			"container %q: the adapter's configuration must be a mapping; the entry %s holds %s", decl.Key, EntryID(ref.NS, ref.Name), clip(fmt.Sprint(merged), 80)))
	}
	if p.setsHostRoots(f, decl) {
		m[keyHostRoots] = p.hostRoots(f, decl)
	}
	return m, nil
}

// keyHostRoots is the adapter configuration key of the directories it may
// copy into worker VMs (docs/vm-workers.md).
const keyHostRoots = "host_roots"

// setsHostRoots reports whether Compose sets host_roots for an adapter
// container: sandbox-libkrun always, another adapter when it boots the
// project's VM workers (an adapter without worker VMs may refuse the key).
func (p *project) setsHostRoots(f *composefile.File, decl *composefile.Container) bool {
	if decl.Source.Name == composefile.AdapterPackage {
		return true
	}
	name, _ := vmworkers.AdapterOf(f)
	return decl.Source.Name == name && len(vmContainers(f, p.lockOf(f))) > 0
}

// hostRoots is what the adapter may copy into worker VMs, read by the
// adapter when it starts: the compose file's directory, the package cache
// (bundles run from there), each path:// VM worker's directory the file
// declares now (so one outside the compose directory is admitted), and
// whatever config_override lists itself. The package cache may lie inside
// ~/.iii (its default does): a root is trusted, and the adapter refuses a
// .iii directory only below the root that admits a worker. So a path://
// worker inside a .iii directory (Compose's state, the project token) never
// becomes a root of its own.
func (p *project) hostRoots(f *composefile.File, decl *composefile.Container) []string {
	roots := []string{f.Dir}
	if pk := p.d.pk; pk != nil && pk.cacheErr == nil && pk.installer != nil && pk.installer.Dir != "" {
		roots = append(roots, p.d.pk.installer.Dir)
	}
	for _, key := range vmContainers(f, p.lockOf(f)) {
		if c := f.Containers[key]; c.Source.Kind == composefile.SourcePath && !inDotIII(f.Dir, c.Source.Path) {
			roots = append(roots, c.Source.Path)
		}
	}
	if list, ok := decl.ConfigOverride[keyHostRoots].([]any); ok {
		for _, v := range list {
			if s, ok := v.(string); ok {
				roots = append(roots, s)
			}
		}
	}
	out := make([]string, 0, len(roots))
	for _, r := range roots {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// inDotIII reports whether dir lies inside a .iii directory, counting only
// the part below base when dir is under base (a project may itself live
// below some .iii directory).
func inDotIII(base, dir string) bool {
	p := dir
	if rel, err := filepath.Rel(base, dir); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		p = rel
	}
	return slices.Contains(strings.Split(filepath.Clean(p), string(filepath.Separator)), ".iii")
}

// startAdapter starts an adapter container through the engine's plugin
// host, from its package's executable in the cache and with its merged
// configuration, and waits until the adapter runs.
func (p *project) startAdapter(ctx context.Context, f *composefile.File, c *container, pi *pkgInfo) error {
	decl := c.decl
	ref := p.adapterRefOf(f, decl)
	cfg, err := p.adapterConfig(ctx, f, ref, decl, pi)
	if err != nil {
		return err
	}
	req := p.d.withToken(map[string]any{"adapter": ref.Name, "namespace": ref.NS, "config": cfg, "path": pi.inst.Executable})
	_, err = p.d.eng.Call(ctx, fnAdaptersStart, req, callTimeout(adapterStartTimeout))
	var eb *protocol.ErrorBody
	if errors.As(err, &eb) && eb.Code == codeAdapterAlreadyStarted {
		// Left running by an earlier Compose (the engine outlived it),
		// maybe from another version: stop it and start this package
		// with this configuration (a restart would keep its old binary).
		if err = p.stopAdapter(ctx, ref); err == nil {
			_, err = p.d.eng.Call(ctx, fnAdaptersStart, req, callTimeout(adapterStartTimeout))
		}
	}
	if err != nil {
		return adapterFailed(decl.Key, ref, err)
	}
	p.mu.Lock()
	c.adapter, c.owned, c.adapterPath = ref, true, pi.inst.Executable
	p.mu.Unlock()
	p.setState(c, state.StatusStarting, nil)
	if err := p.waitAdapter(ctx, c, ref, decl.StartupTimeout); err != nil {
		p.stopOne(ctx, c, asComposeError(err))
		return err
	}
	p.noteAdapterPID(ctx, c, ref)
	p.setState(c, state.StatusReady, nil)
	return nil
}

// noteAdapterPID records the process the plugin host runs the adapter as
// (adapterLost compares it after an engine restart).
func (p *project) noteAdapterPID(ctx context.Context, c *container, ref *vmworkers.Adapter) {
	pid := 0
	if st, found, err := adapterState(ctx, p.d.eng, ref); err == nil && found && st.State == "running" {
		pid = st.PID
	}
	p.mu.Lock()
	c.adapterPID = pid
	p.mu.Unlock()
}

func adapterFailed(key string, ref *vmworkers.Adapter, err error) error {
	return compose.New(compose.CodeSpawnFailed, fmt.Sprintf("container %q: sandbox adapter %s in namespace %q did not start: %v",
		key, ref.Name, ref.NS, err))
}

// restartAdapter restarts a running adapter with its freshly merged
// configuration (compose::restart worker=<adapter>); every sandbox it ran
// ends. It keeps to the locked package: when that is not the binary the
// adapter runs, the adapter is stopped and started from the locked one.
func (p *project) restartAdapter(ctx context.Context, f *composefile.File, c *container) error {
	decl := c.decl
	ref := p.adapterRefOf(f, decl)
	pi, err := p.packageOf(ctx, f, decl.Key)
	if err != nil {
		return err
	}
	cfg, err := p.adapterConfig(ctx, f, ref, decl, pi)
	if err != nil {
		return err
	}
	p.mu.Lock()
	samePath := c.adapterPath == pi.inst.Executable
	p.mu.Unlock()
	req := p.d.withToken(map[string]any{"adapter": ref.Name, "namespace": ref.NS, "config": cfg})
	var eb *protocol.ErrorBody
	if samePath {
		_, err = p.d.eng.Call(ctx, fnAdaptersRestart, req, callTimeout(adapterStartTimeout))
	}
	if !samePath || (errors.As(err, &eb) && eb.Code == codeAdapterNotStarted) {
		req["path"] = pi.inst.Executable
		if err = p.stopAdapter(ctx, ref); err == nil {
			_, err = p.d.eng.Call(ctx, fnAdaptersStart, req, callTimeout(adapterStartTimeout))
		}
	}
	if err != nil {
		err = adapterFailed(decl.Key, ref, err)
		p.mu.Lock()
		c.adapter = ref
		p.mu.Unlock()
		p.stopOne(ctx, c, asComposeError(err))
		return err
	}
	p.mu.Lock()
	c.adapter, c.owned, c.adapterPath = ref, true, pi.inst.Executable
	p.mu.Unlock()
	if err := p.waitAdapter(ctx, c, ref, decl.StartupTimeout); err != nil {
		p.stopOne(ctx, c, asComposeError(err))
		return err
	}
	p.noteAdapterPID(ctx, c, ref)
	p.setState(c, state.StatusReady, nil)
	return nil
}

// waitAdapter waits until the adapter runs: its worker appears in its
// namespace, or engine::adapters::list says running. A failed adapter
// fails the container with the adapter's reason.
func (p *project) waitAdapter(ctx context.Context, c *container, ref *vmworkers.Adapter, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for {
		st, found, err := adapterState(ctx, p.d.eng, ref)
		if err == nil && found {
			switch st.State {
			case "running":
				return nil
			case "failed", "incompatible", "stopped":
				return compose.New(compose.CodeSpawnFailed, fmt.Sprintf("container %q: sandbox adapter %s in namespace %q is %s: %s",
					c.key, ref.Name, ref.NS, st.State, st.LastError))
			}
		}
		if live, err := listWorkers(ctx, p.d.eng); err == nil {
			for _, w := range live {
				if w.name() == ref.Name && w.Namespace == ref.NS {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return compose.New(compose.CodeStartupTimeout, fmt.Sprintf("container %q: the start was interrupted (%v)", c.key, ctx.Err()))
		case <-deadline.C:
			return compose.New(compose.CodeStartupTimeout, fmt.Sprintf(
				"container %q: sandbox adapter %s did not come up in namespace %q within %s", c.key, ref.Name, ref.NS, timeout))
		case <-tick.C:
		}
	}
}

// adapterState finds one adapter in engine::adapters::list.
func adapterState(ctx context.Context, e engineCaller, ref *vmworkers.Adapter) (adapterStatus, bool, error) {
	raw, err := e.Call(ctx, fnAdaptersList, map[string]any{})
	if err != nil {
		return adapterStatus{}, false, err
	}
	var out struct {
		Adapters []adapterStatus `json:"adapters"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return adapterStatus{}, false, err
	}
	for _, a := range out.Adapters {
		if a.Adapter == ref.Name && a.Namespace == ref.NS {
			return a, true, nil
		}
	}
	return adapterStatus{}, false, nil
}

// stopAdapter stops an adapter; one the host does not run is no error.
func (p *project) stopAdapter(ctx context.Context, ref *vmworkers.Adapter) error {
	_, err := p.d.eng.Call(context.WithoutCancel(ctx), fnAdaptersStop, p.d.withToken(map[string]any{"adapter": ref.Name, "namespace": ref.NS}),
		callTimeout(adapterStartTimeout))
	var eb *protocol.ErrorBody
	if errors.As(err, &eb) && eb.Code == codeAdapterNotStarted {
		return nil
	}
	return err
}

// adapterPIDs fills in the pid of running adapter containers in a status
// (the plugin host runs them, so only the engine knows).
func (p *project) adapterPIDs(ctx context.Context, out *statusJSON) {
	refs := map[string]*vmworkers.Adapter{}
	p.mu.Lock()
	for key, c := range p.cs {
		if c.adapter != nil && c.running() {
			refs[key] = c.adapter
		}
	}
	p.mu.Unlock()
	if len(refs) == 0 {
		return
	}
	raw, err := p.d.eng.Call(ctx, fnAdaptersList, map[string]any{})
	if err != nil {
		return
	}
	var list struct {
		Adapters []adapterStatus `json:"adapters"`
	}
	if json.Unmarshal(raw, &list) != nil {
		return
	}
	for i := range out.Containers {
		ref := refs[out.Containers[i].Container]
		if ref == nil {
			continue
		}
		for _, a := range list.Adapters {
			if a.Adapter == ref.Name && a.Namespace == ref.NS && a.PID > 0 {
				pid := a.PID
				out.Containers[i].PID = &pid
			}
		}
	}
}
